// Reduce-scatter, allgather, broadcast and barrier across real rank
// processes over UCX: every dtype, awkward counts, roots other than 0, both
// placements, async forms, and a barrier that must wait for a late rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "multiprocess.h"
#include "tandem/tandem.h"
#include "typed_values.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<char>;

// Reports the first few elements of out that miss want(i).
template <class Want>
void expect_elements(DataType t, const void* out, size_t count, Want want, const std::string& where) {
  int shown = 0;
  for (size_t i = 0; i < count && shown < 3; ++i) {
    const double got = get(t, out, i), w = want(i);
    if (got != w) {
      ADD_FAILURE() << where << " " << to_string(t) << " count=" << count << " element " << i << ": got " << got
                    << ", want " << w;
      ++shown;
    }
  }
}

// All ranks hold the same bytes iff the min and max of their hashes agree.
void expect_identical(Communicator& comm, const void* data, size_t bytes, const std::string& where) {
  int64_t lo = fnv1a(data, bytes), hi = lo;
  comm.allreduce(&lo, 1, DataType::i64, ReduceOp::min);
  comm.allreduce(&hi, 1, DataType::i64, ReduceOp::max);
  EXPECT_EQ(lo, hi) << where << ": ranks disagree bitwise";
}

std::string label(const char* what, DataType t, size_t count, bool inplace) {
  return std::string(what) + " " + std::string(to_string(t)) + " count=" + std::to_string(count) +
         (inplace ? " in-place" : " out-of-place");
}

void reduce_scatter_case(Communicator& comm, DataType t, ReduceOp op, size_t count, bool inplace) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = count * dtype_size(t);
  Bytes in(n * block + 1), out(block + 1, char(0xab));
  for (size_t g = 0; g < n * count; ++g) put(t, in.data(), g, input_value(op, t, r, g));
  const Bytes before = in;
  char* dst = inplace ? in.data() + r * block : out.data();
  comm.reduce_scatter(in.data(), dst, count, t, op);
  const std::string where = label("reduce_scatter", t, count, inplace) + " " + std::string(to_string(op));
  expect_elements(
      t, dst, count, [&](size_t i) { return expected_value(op, t, n, r * count + i); }, where);
  if (!inplace) {
    EXPECT_EQ(in, before) << where << " changed its input";
  }
}

void allgather_case(Communicator& comm, DataType t, size_t count, bool inplace) {
  const int n = comm.size(), r = comm.rank();
  const size_t block = count * dtype_size(t);
  Bytes in(block + 1), out(n * block + 1, char(0xab));
  for (size_t i = 0; i < count; ++i) put(t, in.data(), i, bench::moved_value(r, i));
  if (inplace) std::copy(in.begin(), in.end() - 1, out.begin() + r * block);
  const Bytes before = in;
  comm.allgather(inplace ? out.data() + r * block : in.data(), out.data(), count, t);
  const std::string where = label("allgather", t, count, inplace);
  for (int b = 0; b < n; ++b) {
    expect_elements(
        t, out.data() + b * block, count, [&](size_t i) { return bench::moved_value(b, i); },
        where + " block " + std::to_string(b));
  }
  EXPECT_EQ(in, before) << where << " changed its input";
  expect_identical(comm, out.data(), out.size(), where);
}

void broadcast_case(Communicator& comm, DataType t, size_t count, int root, bool inplace) {
  const int r = comm.rank();
  const size_t bytes = count * dtype_size(t);
  Bytes in(bytes + 1, char(0xcd)), out(bytes + 1, char(0xab));
  if (r == root) {
    for (size_t i = 0; i < count; ++i) put(t, (inplace ? out : in).data(), i, bench::moved_value(root, i));
  }
  const Bytes before = in;
  if (inplace) {
    comm.broadcast(out.data(), count, t, root);
  } else {
    comm.broadcast(in.data(), out.data(), count, t, root);
  }
  const std::string where = label("broadcast", t, count, inplace) + " root " + std::to_string(root);
  expect_elements(
      t, out.data(), count, [&](size_t i) { return bench::moved_value(root, i); }, where);
  EXPECT_EQ(in, before) << where << " changed an input";
  expect_identical(comm, out.data(), out.size(), where);
}

std::vector<int> roots_of(int n) {
  std::vector<int> roots = {n - 1, n / 2};  // never only rank 0 once n > 1
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
  return roots;
}

int run_matrix(const CommOptions& o, const std::vector<size_t>& counts, const std::vector<DataType>& dtypes,
               const std::vector<ReduceOp>& ops, const ring::RingOptions& ring_options = {}) {
  auto comm = ring::connect(o, ring_options);
  for (size_t count : counts) {
    for (DataType t : dtypes) {
      for (bool inplace : {false, true}) {
        for (ReduceOp op : ops) reduce_scatter_case(*comm, t, op, count, inplace);
        allgather_case(*comm, t, count, inplace);
        for (int root : roots_of(comm->size())) broadcast_case(*comm, t, count, root, inplace);
        comm->barrier();
        if (::testing::Test::HasFailure()) return kExpectationFailed;
      }
    }
  }
  return 0;
}

const std::vector<size_t> kCounts = {0, 1, 3, 7, 4099, 100003};
const std::vector<DataType> kDtypes(std::begin(kAllDataTypes), std::end(kAllDataTypes));
const std::vector<ReduceOp> kOps(std::begin(kAllReduceOps), std::end(kAllReduceOps));

class CollectivesMatrix : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesMatrix, EveryDtypeCountRootPlacement) {
  RankGroup group(GetParam(), [](const CommOptions& o) { return run_matrix(o, kCounts, kDtypes, kOps); });
  group.expect_success(240s);
}

// The same with shared memory off: the ring and chain algorithms over UCX.
TEST_P(CollectivesMatrix, OverUcxOnly) {
  if (GetParam() == 1 || GetParam() == 4) GTEST_SKIP() << "world sizes 2 and 3 cover the UCX path";
  CommOptions base;
  ring::RingOptions ring_base;
  ring_base.shared_memory = false;
  RankGroup group(
      GetParam(), [ring_base](const CommOptions& o) { return run_matrix(o, kCounts, kDtypes, kOps, ring_base); }, base);
  group.expect_success(240s);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CollectivesMatrix, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// Small segments, a narrow window and five ranks: many segments per block, so
// reduce-scatter reuses its scratch segments while sends are still in flight.
TEST(Collectives, FiveRanksSmallSegments) {
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared memory, 4 KiB chunks" : "UCX, 4 KiB segments");
    CommOptions base;
    ring::RingOptions ring_base;
    ring_base.shared_memory = shared;
    ring_base.segment_bytes = 4096;
    ring_base.segments_in_flight = 2;
    ring_base.shm_chunk_bytes = 4096;
    RankGroup group(
        5,
        [ring_base](const CommOptions& o) {
          return run_matrix(o, {2, 4099, 100003}, {DataType::f32, DataType::bf16, DataType::u8},
                            {ReduceOp::sum, ReduceOp::avg, ReduceOp::min}, ring_base);
        },
        base);
    group.expect_success(240s);
  }
}

TEST(Collectives, TwoOutstandingAsync) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const int n = comm->size(), r = comm->rank();
    const size_t count = 200003;
    // reduce-scatter and allgather queued together
    std::vector<float> rs_in(n * count), rs_out(count), ag_in(count), ag_out(n * count);
    for (size_t g = 0; g < n * count; ++g) rs_in[g] = float(input_value(ReduceOp::sum, DataType::f32, r, g));
    for (size_t i = 0; i < count; ++i) ag_in[i] = float(bench::moved_value(r, i));
    Request a = comm->reduce_scatter_async(rs_in.data(), rs_out.data(), count, DataType::f32, ReduceOp::sum);
    Request b = comm->allgather_async(ag_in.data(), ag_out.data(), count, DataType::f32);
    b.wait(Clock::now() + 60s);
    a.wait();
    EXPECT_TRUE(a.test());
    expect_elements(
        DataType::f32, rs_out.data(), count,
        [&](size_t i) { return expected_value(ReduceOp::sum, DataType::f32, n, r * count + i); },
        "async reduce_scatter");
    expect_elements(
        DataType::f32, ag_out.data(), n * count,
        [&](size_t g) { return bench::moved_value(int(g / count), g % count); }, "async allgather");
    // broadcast and barrier queued together
    std::vector<double> data(count, r == 1 ? 0.0 : -1.0);
    if (r == 1) {
      for (size_t i = 0; i < count; ++i) data[i] = bench::moved_value(1, i);
    }
    Request c = comm->broadcast_async(data.data(), data.data(), count, DataType::f64, 1);
    Request d = comm->barrier_async();
    d.wait(Clock::now() + 60s);
    EXPECT_TRUE(c.test()) << "collectives run in issue order: the broadcast finished before the barrier";
    c.wait();
    expect_elements(
        DataType::f64, data.data(), count, [&](size_t i) { return bench::moved_value(1, i); }, "async broadcast");
    return 0;
  });
  group.expect_success(120s);
}

// A late rank holds everyone in the barrier: no rank may leave before the late
// one entered. steady_clock is the system-wide monotonic clock, so times from
// different processes on this host compare directly.
TEST(Collectives, BarrierWaitsForALateRank) {
  RankGroup group(4, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const int late = 2;
    for (int round = 0; round < 3; ++round) {
      comm->barrier();  // start together
      if (comm->rank() == late) std::this_thread::sleep_for(300ms);
      const int64_t entered = Clock::now().time_since_epoch().count();
      comm->barrier();
      const int64_t left = Clock::now().time_since_epoch().count();
      std::vector<int64_t> times(2 * comm->size());
      const int64_t mine[2] = {entered, left};
      comm->allgather(mine, times.data(), 2, DataType::i64);
      const int64_t late_entered = times[2 * late];
      for (int r = 0; r < comm->size(); ++r) {
        EXPECT_GE(times[2 * r + 1], late_entered)
            << "rank " << r << " left the barrier before rank " << late << " entered it (round " << round << ")";
      }
      if (comm->rank() != late) {
        EXPECT_GE(left - entered, std::chrono::nanoseconds(250ms).count()) << "waited too briefly";
      }
    }
    return 0;
  });
  group.expect_success(120s);
}

TEST(Collectives, RejectsBadRoot) {
  CommOptions o;
  o.rank = 0;
  o.size = 1;
  auto comm = ring::connect(o, {});
  float x = 1;
  EXPECT_THROW(comm->broadcast(&x, 1, DataType::f32, 1), InvalidArgument);
  EXPECT_THROW(comm->broadcast(&x, 1, DataType::f32, -1), InvalidArgument);
  EXPECT_THROW(comm->allgather(nullptr, &x, 1, DataType::f32), InvalidArgument);
}

}  // namespace
}  // namespace tandem::testing
