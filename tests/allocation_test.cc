// A small blocking collective allocates nothing on the caller's thread once
// its first call of a kind has run: its arguments are bound into the
// thread's reusable set, alltoallv's count directory is the thread's own,
// and a call's posted messages are held inline. This program counts every
// operator new made on a thread that asks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "multiprocess.h"
#include "tandem/ring/ring.h"

namespace {

thread_local bool counting = false;
thread_local long allocations = 0;

}  // namespace

// A replacement pair: GCC takes the free of what this operator new returned for a mismatch.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(size_t bytes) {
  if (counting) ++allocations;
  if (void* p = std::malloc(bytes ? bytes : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// One small call of every kind: blocks of `count` elements, and the
// variable calls with unequal blocks.
void small_calls(Communicator& comm, size_t count, std::vector<float>& in, std::vector<float>& out) {
  const int n = comm.size(), root = n - 1;
  thread_local Blocks uneven;
  uneven.counts.assign(size_t(n), count);
  uneven.counts[0] = count / 2;
  uneven.displs.assign(size_t(n), 0);
  for (int p = 1; p < n; ++p) uneven.displs[size_t(p)] = uneven.displs[size_t(p - 1)] + uneven.counts[size_t(p - 1)];
  const size_t mine = uneven.counts[size_t(comm.rank())];
  comm.gatherv(in.data(), mine, out.data(), uneven, DataType::f32, root);
  comm.scatterv(in.data(), uneven, out.data(), mine, DataType::f32, root);
  comm.allreduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
  comm.reduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum, root);
  comm.broadcast(in.data(), out.data(), count, DataType::f32, root);
  comm.allgather(in.data(), out.data(), count, DataType::f32);
  comm.reduce_scatter(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
  comm.gather(in.data(), out.data(), count, DataType::f32, root);
  comm.scatter(in.data(), out.data(), count, DataType::f32, root);
  comm.alltoall(in.data(), out.data(), count, DataType::f32);
  comm.allgatherv(in.data(), mine, out.data(), uneven, DataType::f32);
  comm.reduce_scatterv(in.data(), out.data(), uneven, DataType::f32, ReduceOp::sum);
  comm.barrier();
}

int no_allocations(const CommOptions& o) {
  auto comm = ring::connect(o, ring::RingOptions{});
  const size_t count = 256;
  std::vector<float> in(count * size_t(comm->size()), 1.0f), out(in.size());
  for (int warm = 0; warm < 3; ++warm) small_calls(*comm, count, in, out);
  counting = true;
  for (int i = 0; i < 50; ++i) small_calls(*comm, count, in, out);
  counting = false;
  if (allocations == 0) return 0;
  std::fprintf(stderr, "rank %d: %ld allocations in 50 rounds of small calls\n", comm->rank(), allocations);
  return 1;
}

// 2 and 3 ranks through shared memory. (Over UCX alone the ring
// algorithms' pipelines still allocate their walks per call.) A call that
// waits a whole failure poll asks the store itself, which allocates: on a
// loaded machine a small call may wait that long, so the poll is made hourly.
TEST(Allocation, SmallBlockingCallsAllocateNothingAfterTheirFirst) {
  CommOptions options;
  options.failure_poll = std::chrono::hours(1);
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    RankGroup group(n, no_allocations, options);
    group.expect_success(120s);
  }
}

}  // namespace
}  // namespace tandem::testing
