// Collective fingerprints: ranks that call different collectives (kind, op,
// dtype, count or root differ, or one skips a call) must all fail inside that
// call with CollectiveMismatch naming the call's number, the field and the
// ranks, through shared memory and over UCX alike; never time out, never mix
// data. Through shared memory a rank that only sends in a rooted call returns
// once staged and fails at its next call instead.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "multiprocess.h"
#include "tandem/tandem.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kNoError = 8;
constexpr int kWrongError = 7;
// Far beyond the bound: only the fingerprint can explain the mismatch in time.
constexpr auto kCollectiveTimeout = 30s;
constexpr auto kBound = 3s;

// Runs call #1 (a matching all-reduce), then `call` on every rank of an
// n-rank group; every rank must throw CollectiveMismatch within kBound whose
// text holds every needle.
void expect_mismatch(int n, bool shared, const std::function<void(Communicator&)>& call,
                     const std::vector<std::string>& needles) {
  SCOPED_TRACE(std::string(shared ? "shared memory" : "UCX only (TANDEM_SHM=0)") + ", " + std::to_string(n) + " ranks");
  CommOptions base;
  ring::RingOptions ring_base;
  ring_base.shared_memory = shared;
  base.timeout = kCollectiveTimeout;
  RankGroup group(
      n,
      [&](const CommOptions& o) {
        auto comm = ring::connect(o, ring_base);
        float x = 1;
        comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        const auto start = Clock::now();
        try {
          call(*comm);
        } catch (const CollectiveMismatch& e) {
          const std::string text = e.what();
          fprintf(stderr, "[rank %d] %s\n", o.rank, e.what());
          EXPECT_LT(Clock::now() - start, kBound) << text;
          for (const auto& needle : needles)
            EXPECT_NE(text.find(needle), std::string::npos) << needle << " in " << text;
          return 0;
        } catch (const std::exception& e) {
          fprintf(stderr, "[rank %d] not a CollectiveMismatch: %s\n", o.rank, e.what());
          return kWrongError;
        }
        return kNoError;
      },
      base);
  const auto codes = group.wait(60s);
  for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

void allreduce(Communicator& c, size_t count, DataType dtype, ReduceOp op) {
  std::vector<double> data(count, 1.0);  // large enough for every dtype
  c.allreduce(data.data(), count, dtype, op);
}

void broadcast(Communicator& c, size_t count, int root) {
  std::vector<float> data(count, 1.0f);
  c.broadcast(data.data(), count, DataType::f32, root);
}

class Fingerprint : public ::testing::TestWithParam<bool> {};

TEST_P(Fingerprint, KindDiffers) {
  expect_mismatch(2, GetParam(),
                  [](Communicator& c) {
                    if (c.rank() == 0) {
                      allreduce(c, 1024, DataType::f32, ReduceOp::sum);
                    } else {
                      broadcast(c, 1024, 0);
                    }
                  },
                  {"call #2", "(the kind differs)", "rank 0 called allreduce(1024 x f32, sum)",
                   "rank 1 called broadcast(1024 x f32, root 0)"});
}

TEST_P(Fingerprint, OpDiffers) {
  expect_mismatch(
      2, GetParam(),
      [](Communicator& c) { allreduce(c, 1024, DataType::f32, c.rank() == 0 ? ReduceOp::sum : ReduceOp::max); },
      {"call #2", "(the op differs)", "rank 0 called allreduce(1024 x f32, sum)",
       "rank 1 called allreduce(1024 x f32, max)"});
}

TEST_P(Fingerprint, DtypeDiffers) {
  expect_mismatch(
      2, GetParam(),
      [](Communicator& c) { allreduce(c, 1024, c.rank() == 0 ? DataType::f32 : DataType::f16, ReduceOp::sum); },
      {"call #2", "(the dtype differs)", "rank 0 called allreduce(1024 x f32, sum)",
       "rank 1 called allreduce(1024 x f16, sum)"});
}

TEST_P(Fingerprint, CountDiffers) {
  expect_mismatch(2, GetParam(),
                  [](Communicator& c) { allreduce(c, c.rank() == 0 ? 1024 : 2048, DataType::f32, ReduceOp::sum); },
                  {"call #2", "(the count differs)", "rank 0 called allreduce(1024 x f32, sum)",
                   "rank 1 called allreduce(2048 x f32, sum)"});
}

// Through shared memory call #1 took one cell; a call of one cell (4 KiB)
// starts at the next, one of a run of cells (16 KiB) at the next multiple of
// 8, one of whole chunks (128 KiB) at the next multiple of 64: each rank
// waits where its own call starts, and finds the other's call where that one
// starts.
TEST_P(Fingerprint, CallsPlacedApartAreNamed) {
  for (const auto& [first, second] : {std::pair{1024, 32768}, {1024, 4096}, {4096, 32768}}) {
    const std::string a = std::to_string(first), b = std::to_string(second);
    expect_mismatch(
        2, GetParam(),
        [&](Communicator& c) { allreduce(c, c.rank() == 0 ? first : second, DataType::f32, ReduceOp::sum); },
        {"call #2", "(the count differs)", "rank 0 called allreduce(" + a + " x f32, sum)",
         "rank 1 called allreduce(" + b + " x f32, sum)"});
  }
}

// Rank 1 thinks rank 0's block is one element longer. Through shared memory
// the call carries a digest of the counts, and both ranks fail naming the
// blocks. (Over UCX the ring's messages differ in size: the rank that
// receives the odd block fails naming the sizes, the other may finish.)
TEST(SharedMemoryCheck, AllgathervBlocksDiffer) {
  expect_mismatch(2, true,
                  [](Communicator& c) {
                    const Blocks b{{c.rank() == 0 ? 100u : 101u, 200u}, {0, 101}};
                    std::vector<float> in(200), out(301);
                    c.allgatherv(in.data(), b.counts[size_t(c.rank())], out.data(), b, DataType::f32);
                  },
                  {"call #2", "(the blocks differ)", "called allgatherv(f32)"});
}

// 32 KiB: through shared memory every rank announces its call before any copy.
TEST_P(Fingerprint, RootDiffers) {
  expect_mismatch(2, GetParam(), [](Communicator& c) { broadcast(c, 8192, c.rank()); },
                  {"call #2", "(the root differs)", "rank 0 called broadcast(8192 x f32, root 0)",
                   "rank 1 called broadcast(8192 x f32, root 1)"});
}

// Rank 1 of 2 never sees the odd rank out: it learns of the mismatch from the store.
TEST_P(Fingerprint, EveryRankFailsWhenOneOfThreeDiffers) {
  expect_mismatch(3, GetParam(),
                  [](Communicator& c) { allreduce(c, c.rank() == 2 ? 2048 : 1024, DataType::f32, ReduceOp::sum); },
                  {"call #2", "(the count differs)", "rank 2 called allreduce(2048 x f32, sum)"});
}

// Rank 1 skips the all-reduce and goes on to the broadcast.
TEST_P(Fingerprint, SkippedCallIsNamed) {
  expect_mismatch(2, GetParam(),
                  [](Communicator& c) {
                    if (c.rank() == 0) allreduce(c, 1024, DataType::f32, ReduceOp::sum);
                    broadcast(c, 1024, 0);
                  },
                  {"call #2", "(the kind differs)", "rank 0 called allreduce(1024 x f32, sum)",
                   "rank 1 called broadcast(1024 x f32, root 0)"});
}

// A barrier always runs over UCX; an all-reduce here through shared memory
// when it can: the all-reduce's long wait finds the barrier's fingerprint.
TEST_P(Fingerprint, BarrierAgainstAnAllreduce) {
  expect_mismatch(
      2, GetParam(),
      [](Communicator& c) {
        if (c.rank() == 0) {
          c.barrier();
        } else {
          allreduce(c, 1024, DataType::f32, ReduceOp::sum);
        }
      },
      {"call #2", "(the kind differs)", "rank 0 called barrier", "rank 1 called allreduce(1024 x f32, sum)"});
}

// Rooted calls through the shared segments check their call in its headers
// (no fingerprint message); over UCX the fingerprints say it.
// Rank 0 gathers 1024 floats to itself while rank 1 runs `other` on the same buffers.
void gather_against(Communicator& c, const std::function<void(Communicator&, float*, float*)>& other) {
  std::vector<float> in(2048, 1.0f), out(2048);
  if (c.rank() == 0) {
    c.gather(in.data(), out.data(), 1024, DataType::f32, 0);
  } else {
    other(c, in.data(), out.data());
  }
}

TEST_P(Fingerprint, GatherAgainstScatterIsNamed) {
  expect_mismatch(2, GetParam(),
                  [](Communicator& c) {
                    gather_against(
                        c, [](Communicator& c, float* in, float* out) { c.scatter(in, out, 1024, DataType::f32, 0); });
                  },
                  {"call #2", "(the kind differs)"});
}

// The gather waits in the segments; the allgatherv's fingerprint arrives as
// a message (the mailbox on one host), which the gather's long wait finds.
TEST_P(Fingerprint, GatherAgainstAllgathervIsNamed) {
  expect_mismatch(2, GetParam(),
                  [](Communicator& c) {
                    gather_against(c, [](Communicator& c, float* in, float* out) {
                      c.allgatherv(in, 1024, out, Blocks{{1024, 1024}, {0, 1024}}, DataType::f32);
                    });
                  },
                  {"call #2", "(the kind differs)"});
}

// An allgatherv or reduce_scatterv of equal packed blocks takes its
// fixed-size twin's paths, checked as itself: against the twin, on both
// transports, each rank names its own call. 4 KiB and 4 MiB: staged, and
// timed between the paths.
TEST_P(Fingerprint, VariableCallsAgainstTheirFixedTwinsAreNamed) {
  for (const size_t count : {size_t(1024), size_t(1) << 20}) {
    SCOPED_TRACE(count);
    expect_mismatch(2, GetParam(),
                    [count](Communicator& c) {
                      std::vector<float> in(2 * count, 1.0f), out(2 * count);
                      if (c.rank() == 0) {
                        c.allgatherv(in.data(), count, out.data(), Blocks{{count, count}, {0, count}}, DataType::f32);
                      } else {
                        c.allgather(in.data(), out.data(), count, DataType::f32);
                      }
                    },
                    {"call #2", "rank 0 called allgatherv(", "rank 1 called allgather("});
    expect_mismatch(
        2, GetParam(),
        [count](Communicator& c) {
          std::vector<float> in(2 * count, 1.0f), out(2 * count);
          if (c.rank() == 0) {
            c.reduce_scatter(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
          } else {
            c.reduce_scatterv(in.data(), out.data(), Blocks{{count, count}, {0, count}}, DataType::f32, ReduceOp::sum);
          }
        },
        {"call #2", "rank 0 called reduce_scatter(", "rank 1 called reduce_scatterv("});
  }
}

// A call of one cell keeps to the first 64 of every 256 cells, so past them
// it is placed after where a larger call would be. Through shared memory the
// first all-reduce takes a run of 8 cells and 56 gathers of one cell (2 KiB
// per rank on 2 ranks: one 4 KiB cell) fill the rest of the 64. Then rank 0
// gathers one cell to itself, stamped at cell 256, and rank 1 a run to
// itself, stamped at 64: each root, waiting where it placed its own call,
// finds the other's where the other placed it and names it.
TEST_P(Fingerprint, OneCellCallPastItsCellsIsNamed) {
  expect_mismatch(2, GetParam(),
                  [](Communicator& c) {
                    std::vector<float> in(2048, 1.0f), out(4096);
                    for (int call = 0; call < 56; ++call) c.gather(in.data(), out.data(), 512, DataType::f32, 0);
                    const int r = c.rank();
                    c.gather(in.data(), out.data(), r == 0 ? 512 : 1024, DataType::f32, r);
                  },
                  {"call #58", "rank 0 called gather(512 x f32, root 0)", "rank 1 called gather(1024 x f32, root 1)"});
}

TEST_P(Fingerprint, GatherRootIsNamed) {
  expect_mismatch(2, GetParam(),
                  [](Communicator& c) {
                    std::vector<float> in(2048, 1.0f), out(2048);
                    c.gather(in.data(), out.data(), 1024, DataType::f32, c.rank() == 0 ? 0 : 1);
                  },
                  {"call #2", "(the root differs)"});
}

// Both ranks only send: rank 0 gathers to rank 1 while rank 1 scatters from
// itself. Through shared memory both return once staged, and the next call
// finds that their earlier calls differ; over UCX the fingerprints say it at once.
TEST_P(Fingerprint, SendingSidesMismatchIsNamedByTheNextCall) {
  const bool shared = GetParam();
  expect_mismatch(2, shared,
                  [](Communicator& c) {
                    std::vector<float> in(2048, 1.0f), out(2048);
                    if (c.rank() == 0) {
                      c.gather(in.data(), out.data(), 1024, DataType::f32, 1);
                    } else {
                      c.scatter(in.data(), out.data(), 1024, DataType::f32, 1);
                    }
                    allreduce(c, 1024, DataType::f32, ReduceOp::sum);
                  },
                  {shared ? "earlier calls through shared memory differ" : "(the kind differs)"});
}

// Rank 1 skips the last call: it destroys its communicator instead.
TEST_P(Fingerprint, SkippedLastCallIsNamed) {
  CommOptions base;
  ring::RingOptions ring_base;
  ring_base.shared_memory = GetParam();
  base.timeout = kCollectiveTimeout;
  RankGroup group(
      2,
      [ring_base](const CommOptions& o) {
        auto comm = ring::connect(o, ring_base);
        float x = 1;
        comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        if (comm->rank() == 1) return 0;
        const auto start = Clock::now();
        try {
          comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        } catch (const CollectiveMismatch& e) {
          EXPECT_LT(Clock::now() - start, kBound) << e.what();
          EXPECT_NE(std::string(e.what()).find("rank 1 skipped call #2: it destroyed its communicator after call #1, "
                                               "while allreduce #2 (1 x f32, sum) on rank 0"),
                    std::string::npos)
              << e.what();
          return 0;
        } catch (const std::exception& e) {
          fprintf(stderr, "[rank 0] not a CollectiveMismatch: %s\n", e.what());
          return kWrongError;
        }
        return kNoError;
      },
      base);
  group.expect_success(60s);
}

// Matching calls of every kind still succeed with the check on (and the
// fingerprint of a zero-count call travels too).
TEST_P(Fingerprint, MatchingCallsSucceed) {
  CommOptions base;
  ring::RingOptions ring_base;
  ring_base.shared_memory = GetParam();
  RankGroup group(
      3,
      [ring_base](const CommOptions& o) {
        auto comm = ring::connect(o, ring_base);
        std::vector<float> a(3000, 1.0f), b(3 * 3000);
        for (int i = 0; i < 20; ++i) {
          comm->allreduce(a.data(), a.size(), DataType::f32, ReduceOp::sum);
          comm->allgather(a.data(), b.data(), a.size(), DataType::f32);
          comm->broadcast(a.data(), a.size(), DataType::f32, i % 3);
          comm->allreduce(a.data(), 0, DataType::f32, ReduceOp::sum);
          comm->barrier();
        }
        return 0;
      },
      base);
  group.expect_success(60s);
}

// Start-up: (protocol, build, world size, job) must agree; a rank that
// differs fails every rank within 5 s, naming both values.
void expect_startup_mismatch(const std::function<void(CommOptions&)>& odd_rank_1,
                             const std::vector<std::string>& needles) {
  RankGroup group(2, [&](const CommOptions& given) {
    CommOptions o = given;
    o.job_id = "job-a";
    if (o.rank == 1) odd_rank_1(o);
    const auto start = Clock::now();
    try {
      auto comm = ring::connect(o, {});
      return kNoError;
    } catch (const InvalidArgument& e) {
      fprintf(stderr, "[rank %d] %s\n", o.rank, e.what());
      EXPECT_LT(Clock::now() - start, 5s) << e.what();
      for (const auto& needle : needles) EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << needle;
      return 0;
    }
  });
  const auto codes = group.wait(60s);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(StartupCheck, WorldSizeMismatchIsNamedOnEveryRank) {
  expect_startup_mismatch([](CommOptions& o) { o.size = 3; },
                          {"ranks disagree at start-up: rank 0 has protocol ", ", world size 2, job job-a; rank 1 has",
                           ", world size 3, job job-a; every rank must run the same tandem build"});
}

TEST(StartupCheck, JobMismatchIsNamedOnEveryRank) {
  expect_startup_mismatch([](CommOptions& o) { o.job_id = "job-b"; },
                          {"world size 2, job job-a; rank 1 has protocol ", "world size 2, job job-b"});
}

INSTANTIATE_TEST_SUITE_P(Paths, Fingerprint, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "SharedMemory" : "Ucx"; });

}  // namespace
}  // namespace tandem::testing
