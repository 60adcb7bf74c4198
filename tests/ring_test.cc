// The ring algorithm alone, over an in-memory Channel with one thread per
// rank: fast enough to sweep world sizes and pipeline shapes that real
// processes would make slow.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "memory_channel.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"
#include "typed_values.h"

namespace tandem::testing {
namespace {

struct Shape {
  int ranks;
  size_t count;
  size_t segment_bytes;
  int in_flight;
};

class RingShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(RingShapes, SumAvgMaxAreExactAndIdentical) {
  const Shape s = GetParam();
  for (auto algorithm : {ring::AllreduceAlgorithm::ring, ring::AllreduceAlgorithm::recursive_doubling}) {
  SCOPED_TRACE(algorithm == ring::AllreduceAlgorithm::ring ? "ring" : "recursive doubling");
  auto algos = ring::algorithms({s.segment_bytes, s.in_flight, algorithm});
  for (DataType t : {DataType::f32, DataType::bf16, DataType::i64, DataType::u8}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      for (bool inplace : {false, true}) {
        Mailbox box;
        const size_t bytes = s.count * dtype_size(t);
        std::vector<std::vector<char>> in(s.ranks, std::vector<char>(bytes)), out = in;
        std::vector<std::thread> threads;
        std::vector<std::string> errors(s.ranks);
        for (int r = 0; r < s.ranks; ++r) {
          for (size_t i = 0; i < s.count; ++i) put(t, in[r].data(), i, input_value(op, t, r, i));
          threads.emplace_back([&, r] {
            try {
              MemoryChannel ch(box, r, s.ranks);
              void* dst = inplace ? in[r].data() : out[r].data();
              algos->allreduce(ch, AllreduceArgs{in[r].data(), dst, s.count, t, op, MemoryType::host});
            } catch (const std::exception& e) {
              errors[r] = e.what();
            }
          });
        }
        for (auto& th : threads) th.join();
        for (int r = 0; r < s.ranks; ++r) {
          ASSERT_EQ(errors[r], "") << "rank " << r;
          const auto& res = inplace ? in[r] : out[r];
          for (size_t i = 0; i < s.count; ++i) {
            ASSERT_EQ(get(t, res.data(), i), expected_value(op, t, s.ranks, i))
                << to_string(t) << " " << to_string(op) << " rank " << r << " element " << i;
          }
          ASSERT_EQ(res, inplace ? in[0] : out[0]) << "rank " << r << " differs bitwise from rank 0";
        }
      }
    }
  }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RingShapes,
    ::testing::Values(Shape{1, 10, 4096, 1}, Shape{2, 0, 4096, 2}, Shape{2, 1, 4096, 2}, Shape{3, 2, 4096, 2},
                      Shape{5, 3, 4096, 4}, Shape{5, 12345, 4096, 4}, Shape{7, 100000, 4096, 3},
                      Shape{8, 65536, 65536, 1}, Shape{4, 1000003, 1 << 20, 4}, Shape{6, 33333, 4096, 64}),
    [](const auto& info) {
      const Shape& s = info.param;
      return "n" + std::to_string(s.ranks) + "_c" + std::to_string(s.count) + "_s" + std::to_string(s.segment_bytes) +
             "_w" + std::to_string(s.in_flight);
    });

TEST(RingOptions, RejectsImpossibleSettings) {
  EXPECT_THROW(ring::algorithms({100, 2}), InvalidArgument);
  EXPECT_THROW(ring::algorithms({4096, 0}), InvalidArgument);
  EXPECT_THROW(ring::parse_allreduce_algorithm("tree"), InvalidArgument);
  EXPECT_EQ(ring::parse_allreduce_algorithm("rd"), ring::AllreduceAlgorithm::recursive_doubling);
}

}  // namespace
}  // namespace tandem::testing
