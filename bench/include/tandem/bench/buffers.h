// The input and output buffers of a benchmark or test case.
#pragma once

#include <cstddef>
#include <vector>

#include "tandem/communicator.h"

namespace tandem::bench {

// The input and output buffers: ordinary heap memory, or with -R 1 memory
// from Communicator::allocate_shared (registered, in NCCL's terms).
struct Buffers {
  Buffers(Communicator& comm, size_t bytes, bool registered) : comm_(comm), registered_(registered) {
    if (registered) {
      in = static_cast<char*>(comm.allocate_shared(bytes));
      out = static_cast<char*>(comm.allocate_shared(bytes));
    } else {
      heap_in_.resize(bytes);
      heap_out_.resize(bytes);
      in = heap_in_.data();
      out = heap_out_.data();
    }
  }
  ~Buffers() {
    if (!registered_) return;
    comm_.free_shared(in);
    comm_.free_shared(out);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  char* in = nullptr;
  char* out = nullptr;

 private:
  Communicator& comm_;
  bool registered_;
  std::vector<char> heap_in_, heap_out_;
};

}  // namespace tandem::bench
