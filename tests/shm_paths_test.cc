// The shared-memory path table: its defaults (the decisions of the constants
// and options it replaced, boundary by boundary), TANDEM_SHM_PATHS's rows
// over them (later rows win, wildcards take what they can carry, the direct
// floor holds), bad rows named with their bad part and the choices, the
// retired variables refused, the table as `tandem info` prints it, and rank
// 0's table ruling every rank's path (in-memory ranks, one thread each).
#include "tandem/ring/shm_paths.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "fake_env.h"
#include "memory_channel.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"

namespace tandem::testing {
namespace {

using ring::ShmPathTable;
using ::testing::HasSubstr;
using C = ring::ShmCollective;
using B = ring::ShmBuffers;
using P = ring::ShmPath;
constexpr size_t K = 1024, M = K * K;

struct Expect {
  C collective;
  B buffers;
  size_t bytes;
  P path;
};

void expect_paths(const ShmPathTable& t, const std::vector<Expect>& expected) {
  for (const Expect& e : expected) {
    EXPECT_EQ(t.path(e.collective, e.buffers, e.bytes), e.path)
        << to_string(e.collective) << " " << to_string(e.buffers) << " " << e.bytes << " bytes";
  }
}

TEST(ShmPaths, DefaultsKeepTheDecisionsOfTheKnobsTheyReplaced) {
  const ShmPathTable t;
  EXPECT_EQ(t.overrides(), "");
  expect_paths(t, {
                      // The all-reduce's timed window, both ends included.
                      {C::allreduce, B::heap, 256 * K - 1, P::staged},
                      {C::allreduce, B::heap, 256 * K, P::timed},
                      {C::allreduce, B::heap, 16 * M, P::timed},
                      {C::allreduce, B::heap, 16 * M + 1, P::staged},
                      // The reduce-scatter and allgather of heap buffers timed from 32 KiB, without end.
                      {C::reduce_scatter, B::heap, 32 * K - 1, P::staged},
                      {C::reduce_scatter, B::heap, 32 * K, P::timed},
                      {C::reduce_scatter, B::heap, SIZE_MAX, P::timed},
                      {C::allgather, B::heap, 32 * K - 1, P::staged},
                      {C::allgather, B::heap, 1 * M, P::timed},
                      // The all-to-all timed from 32 KiB per rank, without end.
                      {C::alltoall, B::heap, 32 * K - 1, P::staged},
                      {C::alltoall, B::heap, 32 * K, P::timed},
                      {C::alltoall, B::heap, SIZE_MAX, P::timed},
                      // The reduce of heap buffers timed as the all-reduce's; of shared ones, and the
                      // broadcast of heap buffers, staged.
                      {C::reduce, B::heap, 256 * K - 1, P::staged},
                      {C::reduce, B::heap, 256 * K, P::timed},
                      {C::reduce, B::heap, 16 * M + 1, P::staged},
                      {C::broadcast, B::heap, 1 * M, P::staged},
                      {C::reduce, B::shared, 1 * M, P::staged},
                  });
  for (C c : {C::allreduce, C::reduce_scatter, C::allgather, C::broadcast, C::alltoall}) {
    expect_paths(t, {{c, B::shared, ring::kShmDirectMinBytes - 1, P::staged},
                     {c, B::shared, ring::kShmDirectMinBytes, P::mapped},
                     {c, B::shared, SIZE_MAX, P::mapped}});
  }
}

TEST(ShmPaths, LaterRowsWinAndTheFloorHolds) {
  const ShmPathTable t(" allreduce:heap:*=cma , allreduce:heap:1M-2M=staged,");
  EXPECT_EQ(t.overrides(), " allreduce:heap:*=cma , allreduce:heap:1M-2M=staged,");
  expect_paths(t, {{C::allreduce, B::heap, 16 * K - 1, P::staged},  // below the floor whatever a row says
                   {C::allreduce, B::heap, 16 * K, P::cma},
                   {C::allreduce, B::heap, 1 * M - 1, P::cma},
                   {C::allreduce, B::heap, 1 * M, P::staged},
                   {C::allreduce, B::heap, 2 * M, P::staged},
                   {C::allreduce, B::heap, 2 * M + 1, P::cma},
                   {C::allreduce, B::shared, 1 * M, P::mapped},  // untouched rows keep their defaults
                   {C::alltoall, B::heap, 1 * M, P::timed}});
  // Sizes take K, M, G, KiB, MiB, GiB in either case.
  expect_paths(ShmPathTable("alltoall:shared:64KiB-1m=staged"), {{C::alltoall, B::shared, 64 * K - 1, P::mapped},
                                                                 {C::alltoall, B::shared, 64 * K, P::staged},
                                                                 {C::alltoall, B::shared, 1 * M, P::staged},
                                                                 {C::alltoall, B::shared, 1 * M + 1, P::mapped}});
}

TEST(ShmPaths, WildcardsTakeTheCallsTheirPathCanCarry) {
  expect_paths(ShmPathTable("*:heap:1M-=timed"),
               {{C::allreduce, B::heap, 32 * M, P::timed},
                {C::alltoall, B::heap, 1 * M, P::timed},
                {C::reduce_scatter, B::heap, 1 * M, P::timed},
                {C::broadcast, B::heap, 1 * M, P::staged}});  // no timed family: the default stays
  const ShmPathTable staged("*:*:*=staged");
  for (C c : {C::allreduce, C::reduce, C::reduce_scatter, C::allgather, C::broadcast, C::alltoall}) {
    for (B b : {B::heap, B::shared}) expect_paths(staged, {{c, b, 1 * M, P::staged}});
  }
  expect_paths(ShmPathTable("broadcast:*:*=cma"),
               {{C::broadcast, B::heap, 1 * M, P::cma}, {C::broadcast, B::shared, 1 * M, P::mapped}});
}

std::string error_of(const std::string& rows) {
  try {
    ShmPathTable t(rows);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

TEST(ShmPaths, BadRowsNameTheirBadPartAndTheChoices) {
  struct Bad {
    const char* rows;
    const char* row;
    const char* message;
  };
  for (Bad b : {
           Bad{"allreduce:heap=cma", "allreduce:heap=cma", "a row is collective:buffers:bytes=path"},
           Bad{"allreduce:heap:*:*=cma", "allreduce:heap:*:*=cma", "a row is collective:buffers:bytes=path"},
           Bad{"allreduce:heap:*=staged,allreduse:heap:*=cma", "allreduse:heap:*=cma",
               "unknown collective 'allreduse'; valid: allreduce, reduce, reduce_scatter, allgather, broadcast, "
               "alltoall, *"},
           Bad{"allreduce:gpu:*=cma", "allreduce:gpu:*=cma", "unknown buffers 'gpu'; valid: heap, shared, *"},
           Bad{"allreduce:heap:1M=cma", "allreduce:heap:1M=cma", "'1M' is no byte range; write a byte range as"},
           Bad{"allreduce:heap:1Q-=cma", "allreduce:heap:1Q-=cma", "'1Q-' is no byte range"},
           Bad{"allreduce:heap:99999999999G-=cma", "allreduce:heap:99999999999G-=cma",
               "'99999999999G-' is no byte range"},
           Bad{"allreduce:heap:2M-1M=cma", "allreduce:heap:2M-1M=cma", "the range '2M-1M' ends before it starts"},
           Bad{"allreduce:heap:*=fast", "allreduce:heap:*=fast",
               "unknown path 'fast'; valid: staged, mapped, cma, timed"},
           Bad{"broadcast:heap:*=timed", "broadcast:heap:*=timed",
               "timed cannot carry broadcast on heap buffers; valid there: staged, cma"},
           Bad{"allreduce:shared:*=cma", "allreduce:shared:*=cma", "valid there: staged, mapped"},
           Bad{"reduce:shared:*=mapped", "reduce:shared:*=mapped", "valid there: staged"},
           Bad{"reduce:shared:*=cma", "reduce:shared:*=cma", "valid there: staged"},
           Bad{"*:*:4K-8K=mapped", "*:*:4K-8K=mapped", "below 16K every call stages"},
       }) {
    SCOPED_TRACE(b.rows);
    const std::string e = error_of(b.rows);
    EXPECT_THAT(e, HasSubstr(std::string("shared-memory path row '") + b.row + "': "));
    EXPECT_THAT(e, HasSubstr(b.message));
  }
}

TEST(ShmPaths, TheSettingNamesTheVariableAndRefusesRetiredOnes) {
  auto message = [](const Env& env) -> std::string {
    try {
      ring::ring_options_from_env(lookup(env));
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_THAT(message({{"TANDEM_SHM_PATHS", "allreduce:heap:*=fast"}}),
              HasSubstr("tandem: TANDEM_SHM_PATHS='allreduce:heap:*=fast' is invalid: shared-memory path row "
                        "'allreduce:heap:*=fast': unknown path 'fast'"));
  const auto o = ring::ring_options_from_env(lookup({{"TANDEM_SHM_PATHS", "alltoall:heap:*=cma"}}));
  EXPECT_EQ(o.shm_paths.path(C::alltoall, B::heap, 32 * K), P::cma);
  EXPECT_THAT(message({{"TANDEM_SHM_ALLREDUCE_CMA", "never"}}),
              HasSubstr("TANDEM_SHM_ALLREDUCE_CMA is retired; the shared-memory path table replaces it"));
  EXPECT_THAT(message({{"TANDEM_SHM_ALLREDUCE_CMA", "timed"}}), HasSubstr("'allreduce:heap:*=staged,"));
  EXPECT_THAT(message({{"TANDEM_SHM_CMA_MAX_BYTES", "0"}}), HasSubstr("0: '*:heap:*=staged'"));
  EXPECT_THAT(message({{"TANDEM_SHM_FAR_HANDOFF_NS", "180"}}), HasSubstr("TANDEM_SHM_FAR_HANDOFF_NS is retired"));
}

TEST(ShmPaths, InfoPrintsTheTableInEffect) {
  const std::string defaults = ring::describe_shm_paths(ShmPathTable(), "");
  for (const char* line : {
           "  allreduce       heap    [0, 256K) staged, [256K, 16M] timed, (16M, inf) staged\n",
           "  allreduce       shared  [0, 16K) staged, [16K, inf) mapped\n",
           "  reduce          heap    [0, 256K) staged, [256K, 16M] timed, (16M, inf) staged\n",
           "  reduce          shared  [0, inf) staged\n",
           "  reduce_scatter  heap    [0, 32K) staged, [32K, inf) timed\n",
           "  allgather       heap    [0, 32K) staged, [32K, inf) timed\n",
           "  broadcast       heap    [0, inf) staged\n",
           "  broadcast       shared  [0, 16K) staged, [16K, inf) mapped\n",
           "  alltoall        heap    [0, 32K) staged, [32K, inf) timed\n",
       }) {
    EXPECT_THAT(defaults, HasSubstr(line));
  }
  EXPECT_THAT(defaults, ::testing::Not(HasSubstr("TANDEM_SHM_PATHS=")));
  // Overridden runs are marked, and the rows printed.
  const std::string rows = "alltoall:heap:1M-=cma,allreduce:heap:100000-200000=cma";
  const std::string set = ring::describe_shm_paths(ShmPathTable(rows), "");
  EXPECT_THAT(set, HasSubstr("  alltoall        heap    [0, 32K) staged, [32K, 1M) timed, [1M, inf) cma*\n"));
  EXPECT_THAT(set, HasSubstr("  allreduce       heap    [0, 99999] staged, (99999, 200000] cma*, (200000, 256K) "
                             "staged, [256K, 16M] timed, (16M, inf) staged\n"));
  EXPECT_THAT(set, HasSubstr("  TANDEM_SHM_PATHS=" + rows + "\n"));
  // A host without cross-memory attach stages what would take it.
  const std::string limited = ring::describe_shm_paths(ShmPathTable(), "kernel.yama.ptrace_scope is 3");
  EXPECT_THAT(limited, HasSubstr("[256K, 16M] staged (not timed)"));
  EXPECT_THAT(limited, HasSubstr("alltoall        heap    [0, 32K) staged, [32K, inf) staged (not timed)"));
  EXPECT_THAT(limited, HasSubstr("  cross-memory attach unavailable: kernel.yama.ptrace_scope is 3\n"));
  // The plan `tandem info` prints holds the table, indented.
  ring::RingOptions o;
  o.shm_chunk_bytes = 256 * K;
  EXPECT_THAT(ring::shared_memory_plan(o, 2, ""),
              HasSubstr("\n    allreduce       heap    [0, 256K) staged, [256K, 16M] timed, (16M, inf) staged\n"));
}

// Runs one call per rank on `ranks` threads over shared segments, each rank
// with its own path table; returns the shared-memory traffic of all ranks.
template <class Call>
uint64_t run_ranks(const std::vector<std::string>& tables, size_t chunk_bytes, Call call) {
  const int ranks = int(tables.size());
  std::vector<std::shared_ptr<Algorithms>> algos;
  for (const auto& rows : tables) {
    ring::RingOptions o;
    o.shm_chunk_bytes = chunk_bytes;
    o.shm_paths = ShmPathTable(rows);
    algos.push_back(ring::algorithms(o));
  }
  HeapSegments segments(ranks, algos[0]->shared_bytes());
  Mailbox box;
  std::vector<uint64_t> traffic(size_t(ranks), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] { traffic[size_t(r)] = call(*algos[size_t(r)], box, segments.view(), r); });
  }
  for (auto& th : threads) th.join();
  uint64_t total = 0;
  for (uint64_t t : traffic) total += t;
  return total;
}

// Every rank's buffers registered and cross-memory attach allowed: rank 0's
// word on mapping and on heap buffers rules, whatever the others' tables say,
// and a rank that offers nothing stages every rank. The bytes moved per
// payload byte tell the path at 3 ranks out of place: mapped (3N - 1)/N,
// cross-memory attach (5N - 3)/N, the split staging 5 - 1/N.
TEST(ShmPaths, RankZerosTableRulesEveryRank) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 3 * 65536;  // 768 KiB of f32: equal slices
  struct Case {
    std::vector<std::string> tables;
    double per_byte;
    const char* what;
  };
  const std::string no_map_cma = "allreduce:shared:*=staged,allreduce:heap:*=cma";
  for (const Case& c : {
           Case{{"", "", ""}, 8.0 / 3, "defaults: mapped"},
           Case{{no_map_cma, "", ""}, 12.0 / 3, "rank 0 maps nothing: cross-memory attach"},
           Case{{"", no_map_cma, no_map_cma}, 8.0 / 3, "rank 0 maps: mapped"},
           Case{{"", "", "allreduce:*:*=staged"}, 14.0 / 3, "rank 2 offers nothing: staged"},
       }) {
    SCOPED_TRACE(c.what);
    std::vector<std::vector<float>> in(kRanks, std::vector<float>(kCount)), out = in;
    const uint64_t traffic = run_ranks(c.tables, 256 * K, [&](Algorithms& a, Mailbox& box, auto* seg, int r) {
      for (size_t i = 0; i < kCount; ++i) in[size_t(r)][i] = float(r + 1);
      const size_t bytes = kCount * sizeof(float);
      MemoryChannel ch(box, r, kRanks, seg, {{in[size_t(r)].data(), bytes}, {out[size_t(r)].data(), bytes}});
      ch.allow_copy_peer();
      a.allreduce(ch, AllreduceArgs{in[size_t(r)].data(), out[size_t(r)].data(), kCount, DataType::f32, ReduceOp::sum,
                                    MemoryType::host});
      return ch.shared_memory_traffic();
    });
    EXPECT_NEAR(double(traffic) / (kRanks * kCount * sizeof(float)), c.per_byte, 1e-6);
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(out[size_t(r)], std::vector<float>(kCount, 6.0f)) << "rank " << r;
  }
}

// The broadcast of heap buffers by cross-memory attach (no default row takes
// it): every rank gets the root's buffer, each peer reading it once.
TEST(ShmPaths, BroadcastOfHeapBuffersByCrossMemoryAttach) {
  constexpr int kRanks = 3, kRoot = 1;
  constexpr size_t kCount = 100003;
  for (const char* rows : {"", "broadcast:heap:*=cma"}) {
    SCOPED_TRACE(rows);
    std::vector<std::vector<float>> data(kRanks, std::vector<float>(kCount, -1.0f));
    for (size_t i = 0; i < kCount; ++i) data[kRoot][i] = float(i);
    const uint64_t traffic = run_ranks({rows, rows, rows}, 64 * K, [&](Algorithms& a, Mailbox& box, auto* seg, int r) {
      MemoryChannel ch(box, r, kRanks, seg);
      ch.allow_copy_peer();
      a.broadcast(ch, BroadcastArgs{data[size_t(r)].data(), data[size_t(r)].data(), kCount, DataType::f32, kRoot,
                                    MemoryType::host});
      return ch.shared_memory_traffic();
    });
    // Staged: the root copies into its slots, each peer out of them; direct: each peer reads once.
    const size_t copies = *rows ? kRanks - 1 : kRanks;
    EXPECT_EQ(traffic, 2 * copies * kCount * sizeof(float));
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(data[size_t(r)], data[kRoot]) << "rank " << r;
  }
}

// The reduce of heap buffers by cross-memory attach: each rank folds its
// slice of every input in rank order and writes it to the root's output, so
// the root gets what staging gives, bit for bit, in place or not, and the
// bytes moved say which path ran.
TEST(ShmPaths, ReduceOfHeapBuffersByCrossMemoryAttach) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 100003;  // slices of 33335, 33334, 33334 elements, pieces of 16K
  for (const int root : {1, 2}) {
    for (const bool in_place : {false, true}) {
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        std::vector<std::vector<float>> results;
        std::vector<uint64_t> traffics;
        for (const char* rows : {"reduce:heap:*=staged", "reduce:heap:*=cma"}) {
          SCOPED_TRACE(std::string(rows) + " root " + std::to_string(root) + (in_place ? " in place" : ""));
          std::vector<std::vector<float>> in(kRanks, std::vector<float>(kCount)), out(kRanks);
          out[size_t(root)].assign(kCount, -1.0f);
          const uint64_t traffic =
              run_ranks({rows, rows, rows}, 64 * K, [&](Algorithms& a, Mailbox& box, auto* seg, int r) {
                for (size_t i = 0; i < kCount; ++i) in[size_t(r)][i] = float(r + 1) * 0.1f + float(i % 1000);
                float* output = r != root ? nullptr : in_place ? in[size_t(r)].data() : out[size_t(r)].data();
                MemoryChannel ch(box, r, kRanks, seg);
                ch.allow_copy_peer();
                a.reduce(ch,
                         ReduceArgs{in[size_t(r)].data(), output, kCount, DataType::f32, op, root, MemoryType::host});
                return ch.shared_memory_traffic();
              });
          results.push_back(in_place ? in[size_t(root)] : out[size_t(root)]);
          traffics.push_back(traffic);
          for (size_t i = 0; i < kCount; i += 9973) {
            const float sum = 0.6f + 3 * float(i % 1000);
            EXPECT_NEAR(results.back()[i], op == ReduceOp::sum ? sum : sum / 3, 1e-3f * sum) << "element " << i;
          }
        }
        EXPECT_EQ(results[0], results[1]) << "root " << root << (in_place ? " in place" : "");
        // Each rank reads 2 peers' slices (2 bytes moved per byte), folds 3 into 1 (4), and
        // sends its slice to the root (2); the root in place copies its own slice aside first (2).
        const size_t root_slice = kCount / kRanks + (size_t(root) < kCount % kRanks ? 1 : 0);
        const size_t moved = 8 * kCount + 2 * (kCount - root_slice) + (in_place && root >= 2 ? 2 * root_slice : 0);
        EXPECT_EQ(traffics[1], moved * sizeof(float)) << "root " << root << (in_place ? " in place" : "");
      }
    }
  }
}

}  // namespace
}  // namespace tandem::testing
