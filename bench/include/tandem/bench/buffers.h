// The input and output buffers of a benchmark or test case.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "tandem/communicator.h"

namespace tandem::bench {

// The input and output buffers: heap memory aligned to a page (as the
// Open MPI benchmark in bench/anchors and nccl-tests' device buffers are: a block's
// cache lines and pages then fall alike in every run), or with -R 1 memory
// from Communicator::allocate_shared (registered, in NCCL's terms).
struct Buffers {
  Buffers(Communicator& comm, size_t bytes, bool registered) : comm_(comm), registered_(registered) {
    if (registered) {
      in = static_cast<char*>(comm.allocate_shared(bytes));
      out = static_cast<char*>(comm.allocate_shared(bytes));
    } else {
      heap_in_.reset(page_aligned(bytes));
      heap_out_.reset(page_aligned(bytes));
      in = heap_in_.get();
      out = heap_out_.get();
      std::memset(in, 0, bytes);  // pages touched before any timing, as registered ones are
      std::memset(out, 0, bytes);
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
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  static char* page_aligned(size_t bytes) {
    constexpr size_t kPage = 4096;
    auto* p = static_cast<char*>(std::aligned_alloc(kPage, (bytes / kPage + 1) * kPage));
    if (!p) throw std::bad_alloc();
    return p;
  }

  Communicator& comm_;
  bool registered_;
  std::unique_ptr<char, Free> heap_in_, heap_out_;
};

}  // namespace tandem::bench
