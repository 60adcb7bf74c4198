// Multi-process all-reduce: real rank processes over UCX, closed-form
// expected values, bitwise identity across ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

#include "multiprocess.h"
#include "tandem/bench/buffers.h"
#include "tandem/tandem.h"
#include "typed_values.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// Checks every element; stops at the first few mismatches to keep logs short.
void expect_result(ReduceOp op, DataType t, int n, const std::vector<char>& out, size_t count, const char* where) {
  int shown = 0;
  for (size_t i = 0; i < count && shown < 3; ++i) {
    double want = expected_value(op, t, n, i), got = get(t, out.data(), i);
    if (got != want) {
      ADD_FAILURE() << where << ": " << to_string(t) << " " << to_string(op) << " n=" << n << " count=" << count
                    << " element " << i << ": got " << got << ", want " << want;
      ++shown;
    }
  }
}

// All ranks hold the same bytes iff the min and max of their hashes agree.
void expect_identical(Communicator& comm, const std::vector<char>& out) {
  int64_t h[2] = {fnv1a(out.data(), out.size()), 0};
  h[1] = h[0];
  comm.allreduce(&h[0], 1, DataType::i64, ReduceOp::min);
  comm.allreduce(&h[1], 1, DataType::i64, ReduceOp::max);
  EXPECT_EQ(h[0], h[1]) << "ranks disagree bitwise";
}

int run_matrix(const CommOptions& o, const std::vector<size_t>& counts, bool registered = false,
               const ring::RingOptions& ring_options = {}) {
  auto comm = ring::connect(o, ring_options);
  const int n = comm->size(), r = comm->rank();
  for (size_t count : counts) {
    for (DataType t : kAllDataTypes) {
      const size_t bytes = count * dtype_size(t);
      for (ReduceOp op : kAllReduceOps) {
        bench::Buffers buf(*comm, bytes + 1, registered);
        std::vector<char> in(bytes + 1), out(bytes + 1);
        for (size_t i = 0; i < count; ++i) put(t, in.data(), i, input_value(op, t, r, i));
        std::copy(in.begin(), in.end(), buf.in);
        // out-of-place: the input must stay untouched
        comm->allreduce(buf.in, buf.out, count, t, op);
        std::copy(buf.out, buf.out + bytes + 1, out.begin());
        expect_result(op, t, n, out, count, "out-of-place");
        EXPECT_TRUE(std::equal(in.begin(), in.end(), buf.in)) << "out-of-place all-reduce changed its input";
        // in-place
        comm->allreduce(buf.in, count, t, op);
        std::copy(buf.in, buf.in + bytes + 1, in.begin());
        expect_result(op, t, n, in, count, "in-place");
        out.resize(bytes);
        expect_identical(*comm, out);
      }
    }
  }
  return 0;
}

class AllreduceMatrix : public ::testing::TestWithParam<int> {};

TEST_P(AllreduceMatrix, EveryDtypeOpCountPlacement) {
  const int n = GetParam();
  RankGroup group(n, [](const CommOptions& o) { return run_matrix(o, {0, 1, 7, (size_t(1) << 20) + 3}); });
  group.expect_success(600s);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllreduceMatrix, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// Nine ranks on one host: a staged fold takes more sources than one pass of
// reduce_many (shm_segments.h, fold), so it goes on from its output.
TEST(Allreduce, NineRanksFoldInTwoPasses) {
  RankGroup group(9, [](const CommOptions& o) { return run_matrix(o, {7, 5000}); });
  group.expect_success(600s);
}

// The same matrix with shared memory off: every byte goes through UCX.
TEST_P(AllreduceMatrix, OverUcxOnly) {
  const int n = GetParam();
  if (n == 1 || n == 4) GTEST_SKIP() << "world sizes 2 and 3 cover the UCX path";
  ring::RingOptions ring_base;
  ring_base.shared_memory = false;
  RankGroup group(n, [ring_base](const CommOptions& o) {
    return run_matrix(o, {1, 7, (size_t(1) << 20) + 3}, false, ring_base);
  });
  group.expect_success(600s);
}

// Buffers from allocate_shared: ranks reduce straight from each other's buffers.
TEST_P(AllreduceMatrix, RegisteredBuffers) {
  const int n = GetParam();
  RankGroup group(n, [](const CommOptions& o) { return run_matrix(o, {1, 7, 5000, (size_t(1) << 20) + 3}, true); });
  group.expect_success(600s);
}

// Heap buffers by cross-memory attach, forced from the direct floor up.
TEST_P(AllreduceMatrix, HeapBuffersByCrossMemoryAttach) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "one rank has no peer";
  ring::RingOptions ring_base;
  ring_base.shm_paths = ring::ShmPathTable("allreduce:heap:*=cma");
  RankGroup group(n, [ring_base](const CommOptions& o) {
    return run_matrix(o, {7, 100003, (size_t(1) << 20) + 3}, false, ring_base);
  });
  group.expect_success(600s);
}

// One rank with shared memory off, or sized differently (slots would not
// line up): the others notice at once and use UCX too.
TEST(Allreduce, OneRankWithoutSharedMemoryTurnsItOffForAll) {
  for (bool off : {true, false}) {
    SCOPED_TRACE(off ? "rank 1 has it off" : "rank 1 has other chunks");
    RankGroup group(3, [off](const CommOptions& base) {
      CommOptions o = base;
      ring::RingOptions ring_options;
      if (o.rank == 1 && off) ring_options.shared_memory = false;
      if (o.rank == 1 && !off) ring_options.shm_chunk_bytes = 65536;
      o.connect_timeout = 10s;
      const auto t0 = Clock::now();
      auto comm = ring::connect(o, ring_options);
      EXPECT_LT(Clock::now() - t0, 5s) << "a rank waited for rank 1's segment";
      EXPECT_EQ(comm->transport_summary().find("shared memory"), std::string::npos) << comm->transport_summary();
      std::vector<float> x(100000, float(comm->rank() + 1));
      comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
      EXPECT_EQ(x[0], 6.0f);
      EXPECT_EQ(x.back(), 6.0f);
      return 0;
    });
    group.expect_success(60s);
  }
}

// Ranks on one host map each other's segments and say so, unless told not to.
TEST(Allreduce, RanksOnOneHostShareMemoryUnlessTurnedOff) {
  for (bool shared : {true, false}) {
    ring::RingOptions ring_base;
    ring_base.shared_memory = shared;
    RankGroup group(3, [shared, ring_base](const CommOptions& o) {
      auto comm = ring::connect(o, ring_base);
      EXPECT_EQ(comm->transport_summary().find("shared memory") != std::string::npos, shared)
          << comm->transport_summary();
      return 0;
    });
    group.expect_success(60s);
  }
}

// Counts smaller than the world size leave some ranks with empty chunks.
TEST(Allreduce, CountsBelowWorldSizeAndOddPipelines) {
  ring::RingOptions ring_base;
  ring_base.segment_bytes = 4096;  // many segments per chunk: exercises the pipeline window
  ring_base.segments_in_flight = 3;
  ring_base.allreduce = ring::AllreduceAlgorithm::ring;  // small counts would otherwise take recursive doubling
  RankGroup group(3, [ring_base](const CommOptions& o) {
    return run_matrix(o, {2, 3, 5, 4099, 100003}, false, ring_base);
  });
  group.expect_success(300s);
}

// Recursive doubling forced on large counts, on a world that is not a power of two.
TEST(Allreduce, RecursiveDoublingForcedOnOddWorlds) {
  for (int n : {3, 5}) {
    ring::RingOptions ring_base;
    ring_base.allreduce = ring::AllreduceAlgorithm::recursive_doubling;
    RankGroup group(n, [ring_base](const CommOptions& o) { return run_matrix(o, {1, 7, 100003}, false, ring_base); });
    group.expect_success(300s);
  }
}

TEST(Allreduce, TwoOutstandingAsync) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const size_t count = 300001;
    std::vector<float> a(count), b(count);
    std::vector<int64_t> c(count);
    for (size_t i = 0; i < count; ++i) {
      a[i] = float(comm->rank() + 1);
      b[i] = float(i % 13) * (comm->rank() + 1);
    }
    Request ra = comm->allreduce_async(a.data(), a.data(), count, DataType::f32, ReduceOp::sum);
    Request rb = comm->allreduce_async(b.data(), b.data(), count, DataType::f32, ReduceOp::max);
    rb.wait(Clock::now() + 60s);
    ra.wait();
    EXPECT_TRUE(ra.test());
    for (size_t i = 0; i < count; ++i) {
      if (a[i] != 6.0f || b[i] != float(i % 13) * 3) {
        ADD_FAILURE() << "element " << i << ": " << a[i] << " " << b[i];
        break;
      }
    }
    return 0;
  });
  group.expect_success(120s);
}

// A blocking call runs on the caller's thread when the engine is idle, else
// queues behind what is queued or running: back to back with calls the
// engine thread runs (and messages it progresses), every rank keeps issue
// order. A call that overtook one queued before it would swap two
// same-sized all-reduces on one rank only and mix their sums.
TEST(Allreduce, BlockingCallsKeepOrderBehindAsyncOnes) {
  RankGroup group(2, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const int r = comm->rank(), peer = 1 - r;
    int wrong = 0;
    for (int i = 0; i < 3000 && wrong == 0; ++i) {
      float a = float(i + r), b = float(1000 * i + r), sent = float(i), got = -1;
      Request queued = comm->allreduce_async(&a, &a, 1, DataType::f32, ReduceOp::sum);
      const bool exchanges = i % 3 == 0;
      Request message;
      if (exchanges) {
        message = comm->group_async(
            {{P2POp::send, &sent, 1, DataType::f32, peer}, {P2POp::recv, &got, 1, DataType::f32, peer}});
      }
      comm->allreduce(&b, 1, DataType::f32, ReduceOp::sum);
      queued.wait();
      if (exchanges) message.wait();
      wrong += a != float(2 * i + 1) || b != float(2000 * i + 1) || (exchanges && got != float(i));
      if (wrong) ADD_FAILURE() << "iteration " << i << ": " << a << " " << b << " " << got;
    }
    return wrong == 0 ? 0 : kExpectationFailed;
  });
  group.expect_success(120s);
}

// The thread whose call ran inline keeps the engine between its calls (the
// lease); a call from another thread queues, and the engine thread takes the
// lease back to run it. Two threads per rank taking turns: every call
// changes hands, each sum must still be its own.
TEST(Allreduce, BlockingCallsFromThreadsTakingTurnsKeepOrder) {
  RankGroup group(2, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const int r = comm->rank();
    constexpr int kCalls = 600;
    std::mutex mu;
    std::condition_variable turn_changed;
    int turn = 0;  // the call due next; even ones on thread 0
    std::atomic<int> wrong{0};
    auto take_turns = [&](int parity) {
      for (int i = parity; i < kCalls; i += 2) {
        std::unique_lock<std::mutex> lock(mu);
        turn_changed.wait(lock, [&] { return turn == i; });
        float x = float(1000 * i + r);
        comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        if (x != float(2000 * i + 1) && wrong++ == 0) ADD_FAILURE() << "call " << i << ": " << x;
        ++turn;
        turn_changed.notify_all();
      }
    };
    std::thread other(take_turns, 1);
    take_turns(0);
    other.join();
    return wrong == 0 ? 0 : kExpectationFailed;
  });
  group.expect_success(120s);
}

TEST(Allreduce, AbortUnblocksAPendingCallWithinASecond) {
  // Rank 1 never joins the second all-reduce; rank 0 aborts from another
  // thread while its wait sleeps (on the UCX worker's event fd, or between
  // shared-memory polls).
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared memory" : "UCX");
    ring::RingOptions ring_base;
    ring_base.shared_memory = shared;
    RankGroup group(2, [ring_base](const CommOptions& o) {
      auto comm = ring::connect(o, ring_base);
      float x = 1;
      comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
      if (comm->rank() == 1) {
        std::this_thread::sleep_for(3s);
        return 0;
      }
      Clock::time_point aborted_at;
      std::thread aborter([&] {
        std::this_thread::sleep_for(500ms);
        aborted_at = Clock::now();
        comm->abort("test abort");
      });
      try {
        comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        ADD_FAILURE() << "allreduce returned after abort";
      } catch (const Aborted& e) {
        EXPECT_NE(std::string(e.what()).find("test abort"), std::string::npos) << e.what();
      }
      const auto unblocked_at = Clock::now();
      aborter.join();
      EXPECT_LT(unblocked_at - aborted_at, 1s);
      // Sticky: later calls fail at once.
      EXPECT_THROW(comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum), Aborted);
      return 0;
    });
    group.expect_success(60s);
  }
}

// A rank waiting long for a late peer sleeps instead of spinning: its process
// uses a small fraction of one core meanwhile (a spinning wait uses all of it),
// leaving the core to the process's other threads (the backward pass).
TEST(Allreduce, ALongWaitLeavesTheCoreFree) {
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared memory" : "UCX");
    ring::RingOptions ring_base;
    ring_base.shared_memory = shared;
    RankGroup group(2, [ring_base](const CommOptions& o) {
      auto comm = ring::connect(o, ring_base);
      std::vector<float> x(1024, 1.0f);
      comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
      if (comm->rank() == 1) std::this_thread::sleep_for(1500ms);
      timespec cpu0{}, cpu1{};
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
      const auto t0 = Clock::now();
      comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
      const double cpu = double(cpu1.tv_sec - cpu0.tv_sec) + double(cpu1.tv_nsec - cpu0.tv_nsec) * 1e-9;
      EXPECT_EQ(x[0], 4.0f);
      if (comm->rank() == 0) {
        EXPECT_GT(wall, 1.0);
        EXPECT_LT(cpu, 0.25 * wall) << "rank 0 used " << cpu << " s of CPU in a " << wall << " s wait";
        fprintf(stderr, "[rank 0] waited %.2f s using %.3f s of CPU\n", wall, cpu);
      }
      return 0;
    });
    group.expect_success(60s);
  }
}

TEST(Allreduce, TimeoutIsTypedAndSticky) {
  CommOptions base;
  base.timeout = 500ms;
  RankGroup group(
      2,
      [](const CommOptions& o) {
        auto comm = ring::connect(o, {});
        float x = 1;
        if (comm->rank() == 1) {
          std::this_thread::sleep_for(2s);  // never calls the collective
          return 0;
        }
        auto t0 = Clock::now();
        EXPECT_THROW(comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum), Timeout);
        EXPECT_LT(Clock::now() - t0, 3s);
        EXPECT_THROW(comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum), Timeout);
        return 0;
      },
      base);
  group.expect_success(60s);
}

TEST(Allreduce, MismatchedCountsFailWithAClearError) {
  CommOptions base;
  base.timeout = 5s;
  RankGroup group(
      2,
      [](const CommOptions& o) {
        auto comm = ring::connect(o, {});
        std::vector<float> x(comm->rank() == 0 ? 100 : 200, 1.0f);
        try {
          comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
          ADD_FAILURE() << "mismatched all-reduce succeeded";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("mismatch"), std::string::npos) << e.what();
        } catch (const Timeout&) {
          // the rank that only sends may merely time out
        }
        return 0;
      },
      base);
  group.expect_success(60s);
}

TEST(Allreduce, MismatchedCollectivesNeverMixData) {
  // Same bytes on both sides, different collectives. Over UCX the data
  // messages cannot match and the fingerprints name both calls; through shared
  // memory the slot headers do. Either way both ranks fail inside the call.
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "shared memory" : "UCX");
    CommOptions base;
    base.timeout = 10s;
    ring::RingOptions ring_base;
    ring_base.shared_memory = shared;
    RankGroup group(
        2,
        [ring_base](const CommOptions& o) {
          auto comm = ring::connect(o, ring_base);
          std::vector<float> x(1024, float(comm->rank() + 1));
          try {
            if (comm->rank() == 0) {
              comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
            } else {
              comm->broadcast(x.data(), x.size(), DataType::f32, 0);  // a receiver here: it waits too
            }
            ADD_FAILURE() << "a mismatched collective completed";
          } catch (const CollectiveMismatch& e) {
            EXPECT_NE(std::string(e.what()).find("rank 0 called allreduce(1024 x f32, sum)"), std::string::npos)
                << e.what();
            EXPECT_NE(std::string(e.what()).find("rank 1 called broadcast(1024 x f32, root 0)"), std::string::npos)
                << e.what();
          }
          return 0;
        },
        base);
    group.expect_success(60s);
  }
}

TEST(Allreduce, RejectsBadArguments) {
  CommOptions o;
  o.rank = 0;
  o.size = 1;
  auto comm = ring::connect(o, {});
  EXPECT_THROW(comm->allreduce(nullptr, nullptr, 4, DataType::f32, ReduceOp::sum), InvalidArgument);
  CommOptions bad = o;
  bad.rank = 3;
  EXPECT_THROW(ring::connect(bad, {}), InvalidArgument);
  bad = o;
  bad.size = 2;
  bad.rank = 0;
  EXPECT_THROW(ring::connect(bad, {}), InvalidArgument);  // no store address

  // Device buffers: InvalidArgument without a CUDA build; with one, this
  // GPU-less machine fails in the CUDA runtime. Either way a typed error, not a crash.
  CollectiveOptions on_gpu;
  on_gpu.memory = MemoryType::cuda;
  float x = 1;
  EXPECT_THROW(comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum, on_gpu), Error);
  if (!cuda_kernels_built()) {
    EXPECT_THROW(reduce(MemoryType::cuda, DataType::f32, ReduceOp::sum, &x, &x, &x, 1), InvalidArgument);
  }
}

}  // namespace
}  // namespace tandem::testing

namespace tandem::testing {
namespace {

// The full tier (ctest -L full): oversubscribed worlds and large counts.
class AllreduceFull : public ::testing::TestWithParam<int> {};

TEST_P(AllreduceFull, DISABLED_LargeCountsManyRanks) {
  const int n = GetParam();
  RankGroup group(n, [](const CommOptions& o) { return run_matrix(o, {(size_t(1) << 22) + 5, 999983, 1023}); });
  group.expect_success(1800s);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AllreduceFull, ::testing::Values(2, 5, 8),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

}  // namespace
}  // namespace tandem::testing
