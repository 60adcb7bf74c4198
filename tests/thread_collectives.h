// Ranks that are threads of one process, for running the gradient-sync engine
// without UCX (and so under ThreadSanitizer). Every collective publishes each
// rank's buffer, meets at a barrier, and every rank folds all of them in rank
// order into a private copy, so results are bitwise identical across ranks.
#pragma once

#include <barrier>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tandem/fusion/gradient_sync.h"
#include "tandem/reduce.h"

namespace tandem::testing {

class ThreadWorld {
 public:
  explicit ThreadWorld(int size) : size_(size), barrier_(size), slots_(size_t(size)) {}
  int size() const { return size_; }

  struct Rank;
  std::shared_ptr<fusion::Collectives> rank(int r);

  void publish(int r, const void* p) { slots_[size_t(r)] = p; }
  const void* slot(int r) const { return slots_[size_t(r)]; }
  void meet() { barrier_.arrive_and_wait(); }

 private:
  int size_;
  std::barrier<> barrier_;
  std::vector<const void*> slots_;
};

struct ThreadWorld::Rank final : fusion::Collectives {
  Rank(ThreadWorld& w, int r) : world(w), me(r) {}
  int rank() const override { return me; }
  int size() const override { return world.size(); }

  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const CollectiveOptions&) override {
    ++allreduces;
    const size_t bytes = count * dtype_size(dtype);
    std::vector<std::byte> acc(bytes);
    world.publish(me, data);
    world.meet();
    const ReduceOp combine = op == ReduceOp::avg ? ReduceOp::sum : op;
    std::memcpy(acc.data(), world.slot(0), bytes);
    for (int p = 1; p < world.size(); ++p) reduce(dtype, combine, acc.data(), acc.data(), world.slot(p), count);
    if (op == ReduceOp::avg) scale_avg(dtype, acc.data(), count, world.size());
    world.meet();  // every rank has read every buffer
    std::memcpy(data, acc.data(), bytes);
  }
  void allgather(const void* in, void* out, size_t count, DataType dtype, const CollectiveOptions&) override {
    const size_t bytes = count * dtype_size(dtype);
    world.publish(me, in);
    world.meet();
    for (int p = 0; p < world.size(); ++p)
      std::memcpy(static_cast<std::byte*>(out) + size_t(p) * bytes, world.slot(p), bytes);
    world.meet();
  }
  void broadcast(void* data, size_t count, DataType dtype, int root, const CollectiveOptions&) override {
    const size_t bytes = count * dtype_size(dtype);
    world.publish(me, data);
    world.meet();
    std::vector<std::byte> copy(bytes);
    std::memcpy(copy.data(), world.slot(root), bytes);
    world.meet();
    std::memcpy(data, copy.data(), bytes);
  }
  void* allocate_shared(size_t bytes) override {
    void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    std::memset(p, 0, bytes);
    return p;
  }
  void free_shared(void* p) override { std::free(p); }

  ThreadWorld& world;
  int me;
  int allreduces = 0;
};

inline std::shared_ptr<fusion::Collectives> ThreadWorld::rank(int r) { return std::make_shared<Rank>(*this, r); }

}  // namespace tandem::testing
