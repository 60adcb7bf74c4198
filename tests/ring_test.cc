// The ring algorithm alone, over an in-memory Channel with one thread per
// rank: fast enough to sweep world sizes and pipeline shapes that real
// processes would make slow.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "tandem/errors.h"
#include "tandem/ring/ring.h"
#include "typed_values.h"

namespace tandem::testing {
namespace {

// Eager in-memory messages: a send completes at once; a receive completes
// when a message with its (source, destination, tag) is there.
class Mailbox {
 public:
  void put(int src, int dst, Tag tag, const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = messages_[{src, dst, tag}];
    if (!slot.empty()) throw std::logic_error("duplicate tag in flight");
    slot.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    slot.push_back(1);  // marks a message even when it has no bytes
  }
  bool take(int src, int dst, Tag tag, void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = messages_.find({src, dst, tag});
    if (it == messages_.end()) return false;
    if (it->second.size() != bytes + 1) throw InvalidArgument("message size mismatch");
    std::copy(it->second.begin(), it->second.end() - 1, static_cast<char*>(data));
    messages_.erase(it);
    return true;
  }

 private:
  std::mutex mu_;
  std::map<std::tuple<int, int, Tag>, std::vector<char>> messages_;
};

class MemoryChannel final : public Channel {
 public:
  MemoryChannel(Mailbox& box, int rank, int size) : box_(box), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Pending send(int peer, Tag tag, const void* data, size_t bytes) override {
    box_.put(rank_, peer, tag, data, bytes);
    return Pending();  // done
  }
  Pending recv(int peer, Tag tag, void* data, size_t bytes) override {
    recvs_.push_back({peer, tag, data, bytes});
    return Pending(reinterpret_cast<void*>(recvs_.size()), peer, bytes, true);
  }
  bool test(Pending& p) override {
    if (p.done()) return true;
    auto& r = recvs_[reinterpret_cast<size_t>(p.handle()) - 1];
    if (!box_.take(r.peer, rank_, r.tag, r.data, r.bytes)) return false;
    p.mark_done();
    return true;
  }
  void wait(Pending& p) override {
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!test(p)) {
      if (Clock::now() > deadline) throw Timeout("in-memory ring hung");
      std::this_thread::yield();
    }
  }
  void* scratch(size_t bytes, int slot) override {
    if (scratch_.size() <= size_t(slot)) scratch_.resize(slot + 1);
    if (scratch_[slot].size() < bytes) scratch_[slot].resize(bytes);
    return scratch_[slot].data();
  }

 private:
  struct Recv {
    int peer;
    Tag tag;
    void* data;
    size_t bytes;
  };
  Mailbox& box_;
  int rank_, size_;
  std::vector<Recv> recvs_;
  std::vector<std::vector<char>> scratch_;
};

struct Shape {
  int ranks;
  size_t count;
  size_t segment_bytes;
  int in_flight;
};

class RingShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(RingShapes, SumAvgMaxAreExactAndIdentical) {
  const Shape s = GetParam();
  auto algos = ring::algorithms({s.segment_bytes, s.in_flight});
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
}

}  // namespace
}  // namespace tandem::testing
