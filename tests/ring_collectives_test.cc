// Reduce-scatter, allgather, broadcast and barrier over the in-memory
// Channel, one thread per rank: world sizes 1-8, awkward counts, pipeline
// shapes, closed-form expected values and bitwise identity across ranks.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "memory_channel.h"
#include "tandem/ring/ring.h"
#include "typed_values.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<char>;

// Runs body(rank, channel) on one thread per rank around a fresh mailbox and
// fails the test with each rank's exception, if any.
// How shared-memory collectives may reach peers' buffers.
enum class Reach { staged, copy_peer, registered };

void run_ranks(int n, const std::function<void(int, Channel&)>& body, const SharedSegments* shared = nullptr,
               Reach reach = Reach::staged) {
  Mailbox box;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        MemoryChannel ch(box, r, n, shared);
        if (reach == Reach::copy_peer) ch.allow_copy_peer();
        if (reach == Reach::registered) ch.register_everything();
        body(r, ch);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The first element of out that misses expected(i), as text; "" if none.
std::string first_mismatch(DataType t, const Bytes& out, size_t count, const std::function<double(size_t)>& expected) {
  for (size_t i = 0; i < count; ++i) {
    const double got = get(t, out.data(), i), want = expected(i);
    if (got != want) {
      return "element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " + std::to_string(want);
    }
  }
  return "";
}

Bytes poison(size_t bytes) { return Bytes(bytes, char(0xab)); }

struct Shape {
  int ranks;
  size_t count;          // elements per rank (broadcast: in all)
  size_t segment_bytes;  // shared memory: its chunk bytes
  int in_flight;
  bool shared = false;  // through shared segments instead of messages
  Reach reach = Reach::staged;
};

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  const char* reach[] = {"", "cma_", "registered_"};
  return std::string(s.shared ? "shm_" : "") + reach[int(s.reach)] + "n" + std::to_string(s.ranks) + "_c" +
         std::to_string(s.count) + "_s" + std::to_string(s.segment_bytes) + "_w" + std::to_string(s.in_flight);
}

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  for (int n = 1; n <= 8; ++n) {
    for (size_t count : {0, 1, 3, 7, 4099}) v.push_back({n, count, 4096, 3});
  }
  for (int n : {2, 3, 5, 8}) {
    v.push_back({n, 100003, 4096, 4});
    v.push_back({n, 100003, 1 << 20, 2});
  }
  v.push_back({6, 4099, 4096, 1});
  v.push_back({4, 40000, 4096, 64});
  for (int n = 2; n <= 5; ++n) {
    for (size_t count : {1, 7, 4099}) v.push_back({n, count, 4096, 0, true});
  }
  v.push_back({3, 100003, 4096, 0, true});
  v.push_back({2, 100003, 1 << 20, 0, true});
  for (Reach reach : {Reach::copy_peer, Reach::registered}) {
    for (int n : {2, 3, 5}) {
      for (size_t count : {7, 4099, 100003}) v.push_back({n, count, 4096, 0, true, reach});
    }
  }
  return v;
}

// Large counts sweep fewer combinations to keep the suite quick.
std::vector<DataType> dtypes_for(const Shape& s) {
  if (s.count > 5000) return {DataType::f32, DataType::bf16, DataType::i32};
  return {std::begin(kAllDataTypes), std::end(kAllDataTypes)};
}
std::vector<ReduceOp> ops_for(const Shape& s) {
  if (s.count > 5000) return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};
  return {std::begin(kAllReduceOps), std::end(kAllReduceOps)};
}

// One set of segments per test: calls chain as on a long-lived communicator.
class Collectives : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    const Shape& s = GetParam();
    ring::RingOptions o;
    if (s.shared) {
      o.shm_chunk_bytes = s.segment_bytes;
    } else {
      o.segment_bytes = s.segment_bytes;
      o.segments_in_flight = s.in_flight;
    }
    algorithms_ = ring::algorithms(o);
    if (s.shared) segments_ = std::make_unique<HeapSegments>(s.ranks, algorithms_->shared_bytes());
  }
  std::shared_ptr<Algorithms> algos() const { return algorithms_; }
  void run_ranks(int n, const std::function<void(int, Channel&)>& body) {
    testing::run_ranks(n, body, segments_ ? segments_->view() : nullptr, GetParam().reach);
  }

 private:
  std::shared_ptr<Algorithms> algorithms_;
  std::unique_ptr<HeapSegments> segments_;
};

TEST_P(Collectives, ReduceScatter) {
  const Shape s = GetParam();
  const int n = s.ranks;
  auto algorithms = algos();
  for (DataType t : dtypes_for(s)) {
    const size_t esize = dtype_size(t), block = s.count * esize;
    for (ReduceOp op : ops_for(s)) {
      for (bool inplace : {false, true}) {
        SCOPED_TRACE(std::string(to_string(t)) + " " + std::string(to_string(op)) +
                     (inplace ? " in-place" : " out-of-place"));
        // Rank r's input is element g = b * count + j of the all-reduce pattern.
        std::vector<Bytes> in(n, Bytes(n * block)), out(n, poison(block));
        for (int r = 0; r < n; ++r) {
          for (size_t g = 0; g < n * s.count; ++g) put(t, in[r].data(), g, input_value(op, t, r, g));
        }
        const std::vector<Bytes> in_before = in;
        run_ranks(n, [&](int r, Channel& ch) {
          void* dst = inplace ? in[r].data() + r * block : out[r].data();
          algorithms->reduce_scatter(ch, ReduceScatterArgs{in[r].data(), dst, s.count, t, op, MemoryType::host});
        });
        for (int r = 0; r < n; ++r) {
          const Bytes res = inplace ? Bytes(in[r].begin() + r * block, in[r].begin() + (r + 1) * block) : out[r];
          EXPECT_EQ(bench::count_wrong(op, t, n, res.data(), s.count, r * s.count), 0)
              << "rank " << r << " "
              << first_mismatch(t, res, s.count, [&](size_t i) { return expected_value(op, t, n, r * s.count + i); });
          if (!inplace) {
            EXPECT_EQ(in[r], in_before[r]) << "out-of-place reduce-scatter changed rank " << r << "'s input";
          } else {  // the other blocks of the input are left alone
            Bytes others = in[r], others_before = in_before[r];
            std::fill(others.begin() + r * block, others.begin() + (r + 1) * block, 0);
            std::fill(others_before.begin() + r * block, others_before.begin() + (r + 1) * block, 0);
            EXPECT_EQ(others, others_before) << "in-place reduce-scatter touched another block on rank " << r;
          }
        }
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(Collectives, Allgather) {
  const Shape s = GetParam();
  const int n = s.ranks;
  auto algorithms = algos();
  for (DataType t : dtypes_for(s)) {
    const size_t esize = dtype_size(t), block = s.count * esize;
    for (bool inplace : {false, true}) {
      SCOPED_TRACE(std::string(to_string(t)) + (inplace ? " in-place" : " out-of-place"));
      std::vector<Bytes> in(n, Bytes(block)), out(n, poison(n * block));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < s.count; ++i) put(t, in[r].data(), i, bench::moved_value(r, i));
        if (inplace) std::copy(in[r].begin(), in[r].end(), out[r].begin() + r * block);
      }
      const std::vector<Bytes> in_before = in;
      run_ranks(n, [&](int r, Channel& ch) {
        const void* src = inplace ? out[r].data() + r * block : in[r].data();
        algorithms->allgather(ch, AllgatherArgs{src, out[r].data(), s.count, t, MemoryType::host});
      });
      for (int r = 0; r < n; ++r) {
        for (int b = 0; b < n; ++b) {
          const Bytes got(out[r].begin() + b * block, out[r].begin() + (b + 1) * block);
          EXPECT_EQ(bench::count_wrong_moved(t, b, got.data(), s.count), 0)
              << "rank " << r << " block " << b << " "
              << first_mismatch(t, got, s.count, [&](size_t i) { return bench::moved_value(b, i); });
        }
        EXPECT_EQ(in[r], in_before[r]) << "allgather changed rank " << r << "'s input";
        EXPECT_EQ(out[r], out[0]) << "rank " << r << " differs bitwise from rank 0";
      }
      if (HasFailure()) return;
    }
  }
}

TEST_P(Collectives, BroadcastFromEveryKindOfRoot) {
  const Shape s = GetParam();
  const int n = s.ranks;
  auto algorithms = algos();
  for (int root : {0, n - 1, n / 2}) {
    for (DataType t : dtypes_for(s)) {
      const size_t bytes = s.count * dtype_size(t);
      for (bool inplace : {false, true}) {
        SCOPED_TRACE("root " + std::to_string(root) + " " + std::string(to_string(t)) +
                     (inplace ? " in-place" : " out-of-place"));
        // Only the root's input is read; the others hold poison to show it.
        std::vector<Bytes> in(n, poison(bytes)), out(n, poison(bytes));
        for (size_t i = 0; i < s.count; ++i) put(t, (inplace ? out : in)[root].data(), i, bench::moved_value(root, i));
        const Bytes root_input = in[root];
        run_ranks(n, [&](int r, Channel& ch) {
          const void* src = inplace ? out[r].data() : in[r].data();
          algorithms->broadcast(ch, BroadcastArgs{src, out[r].data(), s.count, t, root, MemoryType::host});
        });
        for (int r = 0; r < n; ++r) {
          EXPECT_EQ(bench::count_wrong_moved(t, root, out[r].data(), s.count), 0)
              << "rank " << r << " "
              << first_mismatch(t, out[r], s.count, [&](size_t i) { return bench::moved_value(root, i); });
          EXPECT_EQ(out[r], out[root]) << "rank " << r << " differs bitwise from the root";
        }
        EXPECT_EQ(in[root], root_input) << "broadcast changed the root's input";
        if (HasFailure()) return;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Collectives, ::testing::ValuesIn(shapes()), shape_name);

// No rank may leave the barrier before the last one has entered it.
TEST(Barrier, NobodyLeavesBeforeTheLastArrives) {
  for (int n = 1; n <= 8; ++n) {
    for (int late : {0, n - 1, n / 2}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " late rank " + std::to_string(late));
      std::atomic<int> entered{0};
      std::vector<int> seen(n, -1);
      auto algorithms = ring::algorithms();
      run_ranks(n, [&](int r, Channel& ch) {
        if (r == late) std::this_thread::sleep_for(30ms);
        entered.fetch_add(1);
        algorithms->barrier(ch);
        seen[r] = entered.load();
      });
      for (int r = 0; r < n; ++r) EXPECT_EQ(seen[r], n) << "rank " << r << " left the barrier early";
    }
  }
}

}  // namespace
}  // namespace tandem::testing
