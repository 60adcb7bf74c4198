// The ring algorithm alone, over an in-memory Channel with one thread per
// rank: fast enough to sweep world sizes and pipeline shapes that real
// processes would make slow.
#include "tandem/ring/ring.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "memory_channel.h"
#include "tandem/errors.h"
#include "typed_values.h"

namespace tandem::testing {
namespace {

struct Shape {
  int ranks;
  size_t count;
  size_t segment_bytes;
  int in_flight;
};

// Runs one all-reduce on `ranks` threads and checks every element against its
// closed form and every rank against rank 0, bitwise.
// How the shared-memory all-reduce may reach peers' buffers.
// some_registered: only the even ranks' buffers lie in shared memory.
enum class Reach { staged, copy_peer, registered, some_registered };

void run_case(int ranks, size_t count, Algorithms& algos, DataType t, ReduceOp op, bool inplace,
              const SharedSegments* shared = nullptr, Reach reach = Reach::staged) {
  Mailbox box;
  const size_t bytes = count * dtype_size(t);
  std::vector<std::vector<char>> in(ranks, std::vector<char>(bytes)), out = in;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(ranks);
  for (int r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < count; ++i) put(t, in[r].data(), i, input_value(op, t, r, i));
    threads.emplace_back([&, r] {
      try {
        std::vector<std::pair<const void*, size_t>> mine;
        if (reach == Reach::registered || (reach == Reach::some_registered && r % 2 == 0)) {
          mine = {{in[r].data(), bytes}, {out[r].data(), bytes}};
        }
        MemoryChannel ch(box, r, ranks, shared, mine);
        if (reach == Reach::copy_peer) ch.allow_copy_peer();
        void* dst = inplace ? in[r].data() : out[r].data();
        algos.allreduce(ch, AllreduceArgs{in[r].data(), dst, count, t, op, MemoryType::host});
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  SCOPED_TRACE(std::string(to_string(t)) + " " + std::string(to_string(op)) + (inplace ? " in-place" : ""));
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r;
    const auto& res = inplace ? in[r] : out[r];
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(get(t, res.data(), i), expected_value(op, t, ranks, i)) << "rank " << r << " element " << i;
    }
    ASSERT_EQ(res, inplace ? in[0] : out[0]) << "rank " << r << " differs bitwise from rank 0";
  }
}

class RingShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(RingShapes, SumAvgMaxAreExactAndIdentical) {
  const Shape s = GetParam();
  for (auto algorithm : {ring::AllreduceAlgorithm::ring, ring::AllreduceAlgorithm::recursive_doubling}) {
    SCOPED_TRACE(algorithm == ring::AllreduceAlgorithm::ring ? "ring" : "recursive doubling");
    auto algos = ring::algorithms({s.segment_bytes, s.in_flight, algorithm});
    for (DataType t : {DataType::f32, DataType::bf16, DataType::i64, DataType::u8}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        for (bool inplace : {false, true}) {
          ASSERT_NO_FATAL_FAILURE(run_case(s.ranks, s.count, *algos, t, op, inplace));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RingShapes,
                         ::testing::Values(Shape{1, 10, 4096, 1}, Shape{2, 0, 4096, 2}, Shape{2, 1, 4096, 2},
                                           Shape{3, 2, 4096, 2}, Shape{5, 3, 4096, 4}, Shape{5, 12345, 4096, 4},
                                           Shape{7, 100000, 4096, 3}, Shape{8, 65536, 65536, 1},
                                           Shape{4, 1000003, 1 << 20, 4}, Shape{6, 33333, 4096, 64}),
                         [](const auto& info) {
                           const Shape& s = info.param;
                           return "n" + std::to_string(s.ranks) + "_c" + std::to_string(s.count) + "_s" +
                                  std::to_string(s.segment_bytes) + "_w" + std::to_string(s.in_flight);
                         });

struct ShmShape {
  int ranks;
  size_t count;
  size_t chunk_bytes;
};

class SharedMemoryShapes : public ::testing::TestWithParam<ShmShape> {};

// One set of segments for the whole matrix: every call chains onto the
// previous one's chunk numbers and slots, as on a long-lived communicator.
// Each shape runs with the staged all-reduce's chunks split across ranks (each
// element reduced once) and unsplit (every rank folds every slot), whatever its
// rank count, so both paths meet every chunk boundary and slice edge.
//
// With cross-memory attach allowed, the all-reduce of heap buffers runs it
// from 16 KiB (the direct path's floor): always, and as rank 0 timed it
// (the default's path): the matrix's calls walk each size class through its
// opening (staged trials arrive, then stage) and on past the verdict.
TEST_P(SharedMemoryShapes, EveryDtypeOpPlacementIsExactAndIdentical) {
  const ShmShape s = GetParam();
  for (int split_from : {1, 1 << 20}) {
    SCOPED_TRACE(split_from == 1 ? "split chunks" : "unsplit chunks");
    ring::RingOptions o;
    o.allreduce = ring::AllreduceAlgorithm::shared_memory;
    o.shm_chunk_bytes = s.chunk_bytes;
    o.shm_split_min_ranks = split_from;
    o.shm_split_min_bytes = 0;  // at every size: both paths meet every chunk boundary
    std::vector<std::pair<std::shared_ptr<Algorithms>, const char*>> cma_algos;
    for (const char* rows : {"allreduce:heap:*=cma", "allreduce:heap:*=timed"}) {
      ring::RingOptions with = o;
      with.shm_paths = ring::ShmPathTable(rows);
      cma_algos.emplace_back(ring::algorithms(with), rows);
    }
    o.shm_paths = ring::ShmPathTable("allreduce:heap:*=staged");
    auto algos = ring::algorithms(o);
    HeapSegments segments(s.ranks, algos->shared_bytes());
    for (DataType t : kAllDataTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (bool inplace : {false, true}) {
          for (Reach reach : {Reach::staged, Reach::copy_peer, Reach::registered, Reach::some_registered}) {
            SCOPED_TRACE(reach == Reach::staged       ? "heap buffers, staged"
                         : reach == Reach::copy_peer  ? "heap buffers, cross-memory attach allowed"
                         : reach == Reach::registered ? "registered buffers, mapped"
                                                      : "even ranks' buffers registered: all stage");
            ASSERT_NO_FATAL_FAILURE(run_case(s.ranks, s.count, *algos, t, op, inplace, segments.view(), reach));
            if (reach != Reach::copy_peer) continue;
            for (auto& [cma, what] : cma_algos) {
              SCOPED_TRACE(what);
              ASSERT_NO_FATAL_FAILURE(run_case(s.ranks, s.count, *cma, t, op, inplace, segments.view(), reach));
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, SharedMemoryShapes,
                         ::testing::Values(ShmShape{2, 0, 4096}, ShmShape{2, 1, 4096}, ShmShape{2, 4097, 4096},
                                           ShmShape{3, 10007, 4096}, ShmShape{4, 65536, 8192},
                                           ShmShape{5, 100003, 4096}, ShmShape{2, 300001, 1 << 18},
                                           ShmShape{3, 2, 4096}),
                         [](const auto& info) {
                           const ShmShape& s = info.param;
                           return "n" + std::to_string(s.ranks) + "_c" + std::to_string(s.count) + "_k" +
                                  std::to_string(s.chunk_bytes);
                         });

// A rank that calls a different all-reduce learns it from the first chunk,
// or at arrival when both calls may go by cross-memory attach.
TEST(SharedMemory, MismatchedCallsFailOnEveryRankNamingBoth) {
  for (bool cma : {false, true}) {
    for (int split_from : {1, 1 << 20}) {
      SCOPED_TRACE(split_from == 1 ? "split chunks" : "unsplit chunks");
      ring::RingOptions o;
      o.allreduce = ring::AllreduceAlgorithm::shared_memory;
      o.shm_chunk_bytes = 4096;
      o.shm_split_min_ranks = split_from;
      o.shm_split_min_bytes = 0;  // at every size: both paths meet every chunk boundary
      o.shm_paths = ring::ShmPathTable(cma ? "allreduce:heap:*=cma" : "allreduce:heap:*=staged");
      auto algos = ring::algorithms(o);
      HeapSegments segments(2, algos->shared_bytes());
      Mailbox box;
      // Under 16 KiB rank 1 stages at once; 50000 and 40000 both arrive.
      const unsigned counts[2] = {cma ? 50000u : 5000u, cma ? 40000u : 4000u};
      SCOPED_TRACE(std::to_string(counts[0]) + " against " + std::to_string(counts[1]));
      std::vector<float> data[2] = {std::vector<float>(counts[0], 1.0f), std::vector<float>(counts[0], 1.0f)};
      std::string errors[2];
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          MemoryChannel ch(box, r, 2, segments.view());
          ch.allow_copy_peer();
          try {
            algos->allreduce(ch, AllreduceArgs{data[r].data(), data[r].data(), counts[r], DataType::f32, ReduceOp::sum,
                                               MemoryType::host});
          } catch (const InvalidArgument& e) {
            errors[r] = e.what();
          }
        });
      }
      for (auto& th : threads) th.join();
      for (int r = 0; r < 2; ++r) {
        EXPECT_NE(errors[r].find("mismatched collectives"), std::string::npos) << errors[r];
        EXPECT_NE(errors[r].find("allreduce(" + std::to_string(counts[0]) + " x f32, sum)"), std::string::npos)
            << errors[r];
        EXPECT_NE(errors[r].find("allreduce(" + std::to_string(counts[1]) + " x f32, sum)"), std::string::npos)
            << errors[r];
      }
    }
  }
}

// Rank 0's word decides the path of a heap-buffer all-reduce for every rank,
// whatever the others' path tables say; a rank offering nothing stages at
// once, and every rank with it. The bytes each rank moves tell the path
// (cross-memory attach 3.5 per payload byte at 2 ranks, the split staging 4.5).
TEST(SharedMemory, RankZeroDecidesCrossMemoryAttachForAll) {
  struct Case {
    const char *rank0, *rank1;
    bool cross_memory;
  };
  const char* cma = "allreduce:heap:*=cma";
  const char* staged = "allreduce:heap:*=staged";
  for (Case c : {Case{cma, cma, true}, Case{staged, cma, false}, Case{cma, staged, false}}) {
    SCOPED_TRACE(std::string("rank 0 '") + c.rank0 + "', rank 1 '" + c.rank1 + "'");
    std::shared_ptr<Algorithms> algos[2];
    for (int r = 0; r < 2; ++r) {
      ring::RingOptions o;
      o.allreduce = ring::AllreduceAlgorithm::shared_memory;
      o.shm_chunk_bytes = 4096;
      o.shm_paths = ring::ShmPathTable(r == 0 ? c.rank0 : c.rank1);
      algos[r] = ring::algorithms(o);
    }
    HeapSegments segments(2, algos[0]->shared_bytes());
    Mailbox box;
    const size_t count = 1 << 18;  // 1 MiB of f32: inside the default window
    std::vector<float> data[2] = {std::vector<float>(count, 1.0f), std::vector<float>(count, 2.0f)};
    std::vector<std::thread> threads;
    uint64_t traffic[2] = {};
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        MemoryChannel ch(box, r, 2, segments.view());
        ch.allow_copy_peer();
        for (int call = 0; call < 3; ++call) {
          algos[r]->allreduce(
              ch, AllreduceArgs{data[r].data(), data[r].data(), count, DataType::f32, ReduceOp::sum, MemoryType::host});
        }
        traffic[r] = ch.shared_memory_traffic();
      });
    }
    for (auto& th : threads) th.join();
    const double per_byte = double(traffic[0] + traffic[1]) / (3.0 * 2 * count * sizeof(float));
    EXPECT_DOUBLE_EQ(per_byte, c.cross_memory ? 3.5 : 4.5);
    EXPECT_EQ(data[0], std::vector<float>(count, 12.0f));
    EXPECT_EQ(data[1], data[0]);
  }
}

TEST(SharedMemory, ForcedWithoutSegmentsIsAClearError) {
  ring::RingOptions o;
  o.allreduce = ring::AllreduceAlgorithm::shared_memory;
  auto algos = ring::algorithms(o);
  Mailbox box;
  MemoryChannel ch(box, 0, 2);
  float x = 1;
  try {
    algos->allreduce(ch, AllreduceArgs{&x, &x, 1, DataType::f32, ReduceOp::sum, MemoryType::host});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("TANDEM_SHM"), std::string::npos) << e.what();
  }
}

TEST(RingOptions, RejectsImpossibleSettings) {
  EXPECT_THROW(ring::algorithms({100, 2}), InvalidArgument);
  EXPECT_THROW(ring::algorithms({4096, 0}), InvalidArgument);
  EXPECT_THROW(ring::parse_allreduce_algorithm("tree"), InvalidArgument);
  EXPECT_EQ(ring::parse_allreduce_algorithm("rd"), ring::AllreduceAlgorithm::recursive_doubling);
  EXPECT_EQ(ring::parse_allreduce_algorithm("shm"), ring::AllreduceAlgorithm::shared_memory);
  ring::RingOptions odd_chunk;
  odd_chunk.shm_chunk_bytes = 5000;
  EXPECT_THROW(ring::algorithms(odd_chunk), InvalidArgument);
  odd_chunk.shm_chunk_bytes = 4160;  // whole cache lines, but not 64 cells of them
  EXPECT_THROW(ring::algorithms(odd_chunk), InvalidArgument);
  odd_chunk.shm_chunk_bytes = 4608;  // 8 cells of whole cache lines, not 64
  EXPECT_THROW(ring::algorithms(odd_chunk), InvalidArgument);
}

}  // namespace
}  // namespace tandem::testing
