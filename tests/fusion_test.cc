// The gradient-sync engine with ranks as threads of one process (no UCX, so
// it also runs under ThreadSanitizer): layout, random ready orders from many
// hook threads, aggregation, unused and mismatched gradients, metrics,
// autotune consistency, timeline. Real processes: fusion_mp_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <thread>

#include "../fusion/src/autotune.h"
#include "../fusion/src/layout.h"
#include "thread_collectives.h"

namespace tandem::fusion {
namespace {

using testing::ThreadWorld;
constexpr size_t KiB = 1024;

Deadline soon() { return Clock::now() + std::chrono::seconds(60); }

// Integer-valued, so sums are exact in f32 and f64 and only the division rounds.
double value(int rank, int grad, size_t i, uint64_t step) {
  return double(int((rank + 1) * 7 + grad * 3 + int(i % 13) + int(step) * 5) % 17 - 8);
}

struct Model {
  std::vector<TensorSpec> tensors;
};

Model random_model(int gradients, uint32_t seed, bool mixed_dtypes) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> count(1, 20000);
  Model m;
  for (int g = 0; g < gradients; ++g) {
    const DataType t = mixed_dtypes && g % 7 == 3 ? DataType::f64 : DataType::f32;
    m.tensors.push_back({"layer" + std::to_string(g) + ".weight", count(rng), t});
  }
  return m;
}

// Runs body(rank, collectives) on n threads; rethrows the first failure.
void run_ranks(int n, const std::function<void(int, std::shared_ptr<Collectives>)>& body) {
  ThreadWorld world(n);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, world.rank(r));
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void register_model(GradientSync& sync, const Model& m) {
  for (const auto& t : m.tensors) sync.register_gradient(t.name, t.count, t.dtype);
}

// One backward pass: `hooks` threads write (add) this step's values and mark
// the gradients ready in a random order; `skip` is left unmarked.
void backward(GradientSync& sync, const Model& m, int rank, uint64_t step, int hooks, uint32_t seed, int skip = -1) {
  std::vector<int> order(m.tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::thread> threads;
  for (int h = 0; h < hooks; ++h) {
    threads.emplace_back([&, h] {
      for (size_t k = size_t(h); k < order.size(); k += size_t(hooks)) {
        const int g = order[k];
        if (g == skip) continue;
        const TensorSpec& t = m.tensors[size_t(g)];
        for (size_t i = 0; i < t.count; ++i) {
          const double add = value(rank, g, i, step);
          if (t.dtype == DataType::f32)
            sync.data_as<float>(g)[i] += float(add);
          else
            sync.data_as<double>(g)[i] += add;
        }
        sync.mark_ready(g);
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Expected element: the sum over ranks and the aggregated steps, divided once.
double expected(const Model& m, int n, int g, size_t i, uint64_t last_step, int k, int divisor,
                const std::vector<int>& absent_ranks = {}) {
  double total = 0;
  for (int r = 0; r < n; ++r) {
    if (std::find(absent_ranks.begin(), absent_ranks.end(), r) != absent_ranks.end()) continue;
    for (uint64_t s = last_step + 1 - uint64_t(k); s <= last_step; ++s) total += value(r, g, i, s);
  }
  if (m.tensors[size_t(g)].dtype == DataType::f32) return double(float(total) / float(divisor));
  return total / double(divisor);
}

void expect_reduced(GradientSync& sync, const Model& m, int n, uint64_t step, int k, int divisor,
                    const std::vector<int>& absent = {}, int only = -1) {
  for (size_t g = 0; g < m.tensors.size(); ++g) {
    if (only >= 0 && int(g) != only) continue;
    const TensorSpec& t = m.tensors[g];
    for (size_t i = 0; i < t.count; ++i) {
      const double got = t.dtype == DataType::f32 ? sync.data_as<float>(int(g))[i] : sync.data_as<double>(int(g))[i];
      const double want = expected(m, n, int(g), i, step, k, divisor, absent);
      if (got != want) {
        ADD_FAILURE() << t.name << "[" << i << "] step " << step << ": got " << got << ", want " << want;
        return;
      }
    }
  }
}

TEST(Layout, ReverseOrderSmallFirstBucketOneDtypePerBucket) {
  std::vector<TensorSpec> t = {{"a", 100, DataType::f32},
                               {"b", 300000, DataType::f32},
                               {"c", 10, DataType::f64},
                               {"d", 50, DataType::f32},
                               {"e", 1000, DataType::f32}};
  const ArenaLayout layout = lay_out(t);
  ASSERT_EQ(layout.dtypes.size(), 2u);
  EXPECT_EQ(layout.placement[4].offset, 0u);     // e: produced first by backward
  EXPECT_EQ(layout.placement[3].offset, 4032u);  // d after e (4000 B padded to 64)
  EXPECT_EQ(layout.placement[1].offset, 4288u);  // b after d; c lives in the f64 arena
  EXPECT_EQ(layout.placement[2].arena, 1);
  EXPECT_EQ(layout.bytes[0], 4288u + 1200000u + 448u);

  auto ids = [](const std::vector<Bucket>& bs) {
    std::vector<std::vector<int>> out;
    for (const auto& b : bs) out.push_back(b.ids);
    return out;
  };
  using V = std::vector<std::vector<int>>;
  // First bucket 4 KiB holds e only; c breaks the f32 run; b exceeds 1 MiB alone.
  EXPECT_EQ(ids(cut_buckets(t, layout, {1 << 20, 4096, 0})), (V{{4}, {3}, {2}, {1}, {0}}));
  EXPECT_EQ(ids(cut_buckets(t, layout, {8 << 20, 8 << 20, 0})), (V{{4, 3}, {2}, {1, 0}}));
  for (const Bucket& b : cut_buckets(t, layout, {8 << 20, 8 << 20, 0})) {
    size_t bytes = 0;
    for (int id : b.ids) bytes += layout.placement[size_t(id)].padded;
    EXPECT_EQ(b.bytes, bytes);
    EXPECT_EQ(b.offset, layout.placement[size_t(b.ids.front())].offset);  // contiguous range
  }
}

TEST(Layout, LastBucketHoldsTheInputSideGradientsUpToItsSize) {
  std::vector<TensorSpec> t = {{"x", 10}, {"y", 20}, {"z", 1000}, {"w", 5}};  // padded 64, 128, 4032, 64
  const ArenaLayout layout = lay_out(t);
  auto ids = [](const std::vector<Bucket>& bs) {
    std::vector<std::vector<int>> out;
    for (const auto& b : bs) out.push_back(b.ids);
    return out;
  };
  using V = std::vector<std::vector<int>>;
  const FusionSettings big{8 << 20, 8 << 20, 0};
  EXPECT_EQ(ids(cut_buckets(t, layout, big)), (V{{3, 2, 1, 0}}));
  EXPECT_EQ(ids(cut_buckets(t, layout, big, 192)), (V{{3, 2}, {1, 0}}));
  EXPECT_EQ(ids(cut_buckets(t, layout, big, 4224)), (V{{3}, {2, 1, 0}}));
  EXPECT_EQ(ids(cut_buckets(t, layout, big, 1)), (V{{3, 2, 1}, {0}}));  // at least one gradient
  EXPECT_EQ(ids(cut_buckets(t, layout, {4000, 4000, 0}, 192)), (V{{3}, {2}, {1, 0}}));
}

TEST(Layout, LaunchOrderPutsTheLastBucketAheadOfAtMostTheGivenBytesThenThoseReversed) {
  std::vector<Bucket> b(5);
  for (size_t i = 0; i < b.size(); ++i) b[i].bytes = (i + 1) * 100;  // 100 .. 500
  EXPECT_EQ(launch_order(b, 0), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(launch_order(b, 399), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(launch_order(b, 400), (std::vector<int>{0, 1, 2, 4, 3}));
  EXPECT_EQ(launch_order(b, 699), (std::vector<int>{0, 1, 2, 4, 3}));
  EXPECT_EQ(launch_order(b, 700), (std::vector<int>{0, 1, 4, 3, 2}));
  EXPECT_EQ(launch_order(b, size_t(1) << 40), (std::vector<int>{4, 3, 2, 1, 0}));
  EXPECT_EQ(launch_order(std::vector<Bucket>(1), 1000), (std::vector<int>{0}));
}

struct AggregationCase {
  int ranks;
  int k;
  bool average;
  bool average_aggregated;
};

class Aggregation : public ::testing::TestWithParam<AggregationCase> {};

TEST_P(Aggregation, RandomReadyOrdersFromManyHookThreadsGiveTheReference) {
  const auto c = GetParam();
  const Model m = random_model(30, 7, true);
  const int steps = 4 * c.k;
  run_ranks(c.ranks, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.fusion = {64 * KiB, 16 * KiB, 0};  // many buckets
    o.aggregation_frequency = c.k;
    o.average = c.average;
    o.average_aggregated_gradients = c.average_aggregated;
    GradientSync sync(coll, o);
    register_model(sync, m);
    sync.finalize(soon());
    EXPECT_GT(sync.buckets().size(), 5u);
    const int divisor = (c.average ? c.ranks : 1) * (c.average_aggregated ? c.k : 1);
    for (int s = 1; s <= steps; ++s) {
      backward(sync, m, rank, uint64_t(s), 4, uint32_t(rank * 1000 + s));
      sync.wait(soon());
      EXPECT_EQ(sync.last_step().communicated, s % c.k == 0);
      if (s % c.k == 0) {
        expect_reduced(sync, m, c.ranks, uint64_t(s), c.k, divisor);
        EXPECT_EQ(sync.last_step().buckets, int(sync.buckets().size()));
        sync.zero_gradients();
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Fusion, Aggregation,
                         ::testing::Values(AggregationCase{1, 1, true, true}, AggregationCase{3, 1, true, true},
                                           AggregationCase{4, 1, false, true}, AggregationCase{3, 2, true, true},
                                           AggregationCase{2, 4, true, true}, AggregationCase{2, 4, true, false},
                                           AggregationCase{3, 2, false, false}),
                         [](const auto& info) {
                           const auto& c = info.param;
                           return "n" + std::to_string(c.ranks) + "_k" + std::to_string(c.k) +
                                  (c.average ? "_avg" : "_sum") + (c.average_aggregated ? "_avgk" : "_sumk");
                         });

TEST(Fusion, ExternalGradientsAreCopiedInAndOut) {
  const Model m = random_model(12, 11, false);
  run_ranks(3, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSync sync(coll, {});
    std::vector<std::vector<float>> own(m.tensors.size());
    for (size_t g = 0; g < m.tensors.size(); ++g) {
      if (g % 2) {
        own[g].assign(m.tensors[g].count, 0.0f);
        sync.register_external(m.tensors[g].name, own[g].data(), m.tensors[g].count);
      } else {
        sync.register_gradient(m.tensors[g].name, m.tensors[g].count);
      }
    }
    sync.finalize(soon());
    for (size_t g = 1; g < m.tensors.size(); g += 2) EXPECT_EQ(sync.data(int(g)), own[g].data());
    for (int s = 1; s <= 3; ++s) {
      backward(sync, m, rank, uint64_t(s), 3, uint32_t(s + rank));
      sync.wait(soon());
      expect_reduced(sync, m, 3, uint64_t(s), 1, 3);
      sync.zero_gradients();
    }
  });
}

TEST(Fusion, MismatchedRegistrationsFailEveryRankNamingTheTensor) {
  std::vector<std::string> messages(3);
  run_ranks(3, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSync sync(coll, {});
    sync.register_gradient("conv1.weight", 800);
    sync.register_gradient("conv1.bias", 32);
    sync.register_gradient(rank == 2 ? "fc.weight" : "conv2.weight", 51200);
    try {
      sync.finalize(soon());
      ADD_FAILURE() << "rank " << rank << " finalized";
    } catch (const InvalidArgument& e) {
      messages[size_t(rank)] = e.what();
    }
  });
  for (const auto& msg : messages) {
    EXPECT_NE(msg.find("gradient #2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0 has 'conv2.weight' (f32 x 51200)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 2 has 'fc.weight' (f32 x 51200)"), std::string::npos) << msg;
  }
}

TEST(Fusion, DifferentCountsOfRegistrationsFailEveryRank) {
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSync sync(coll, {});
    sync.register_gradient("w", 100);
    if (rank == 0) sync.register_gradient("b", 10, DataType::f64);
    try {
      sync.finalize(soon());
    } catch (const InvalidArgument& e) {
      messages[size_t(rank)] = e.what();
    }
  });
  for (const auto& msg : messages) {
    EXPECT_NE(msg.find("rank 0 has 'b' (f64 x 10)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 1 has none (1 registered)"), std::string::npos) << msg;
  }
}

// Also when the step's first wait is wait_gradient(): it ends the marking, so
// the unused gradient is claimed instead of waited for.
class Unused : public ::testing::TestWithParam<bool> {};

TEST_P(Unused, GradientFailsEveryRankByNameAndTheNextStepWorks) {
  const Model m = random_model(10, 3, false);
  std::vector<std::string> messages(3);
  run_ranks(3, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.fusion = {32 * KiB, 8 * KiB, 0};
    GradientSync sync(coll, o);
    register_model(sync, m);
    sync.finalize(soon());
    backward(sync, m, rank, 1, 2, uint32_t(rank), rank == 1 ? 4 : -1);
    if (GetParam()) sync.wait_gradient(4, soon());
    try {
      sync.wait(soon());
      ADD_FAILURE() << "rank " << rank << ": no error for the unused gradient";
    } catch (const InvalidArgument& e) {
      messages[size_t(rank)] = e.what();
    }
    sync.zero_gradients();
    backward(sync, m, rank, 2, 2, uint32_t(rank + 10));
    sync.wait(soon());
    expect_reduced(sync, m, 3, 2, 1, 3);
  });
  for (const auto& msg : messages) {
    EXPECT_NE(msg.find("'layer4.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("on rank(s) 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("allow_unused"), std::string::npos) << msg;
  }
}
INSTANTIATE_TEST_SUITE_P(FirstWait, Unused, ::testing::Bool());

// Per-gradient waits: each returns with that gradient reduced while later
// buckets may still be in flight; the step then closes with wait(). With
// aggregation 2 the local step's waits return at once.
// With input_layers_ahead_bytes the last bucket is reduced ahead of others.
class WaitGradient : public ::testing::TestWithParam<size_t> {};

TEST_P(WaitGradient, ReturnsWithThatGradientReducedInAnyOrder) {
  const Model m = random_model(24, 8, true);
  run_ranks(3, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.fusion = {32 * KiB, 8 * KiB, 0};
    o.aggregation_frequency = 2;
    o.input_layers_ahead_bytes = GetParam();
    o.metric_slots = 1;
    GradientSync sync(coll, o);
    register_model(sync, m);
    sync.finalize(soon());
    for (uint64_t step = 1; step <= 6; ++step) {
      const Metric mine{double(rank + 1), 1};
      sync.report_metrics({&mine, 1});
      backward(sync, m, rank, step, 2, uint32_t(rank * 100 + step));
      std::vector<int> order(m.tensors.size());
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng{uint32_t(rank * 31 + step)};  // each rank waits in its own order
      std::shuffle(order.begin(), order.end(), rng);
      for (int g : order) {
        sync.wait_gradient(g, soon());
        if (step % 2 == 0) expect_reduced(sync, m, 3, step, 2, 6, {}, g);
      }
      sync.wait(soon());
      EXPECT_EQ(sync.last_step().communicated, step % 2 == 0);
      EXPECT_GE(sync.last_step().exposed, 0);
      EXPECT_GE(sync.last_step().compute, 0);
      EXPECT_THROW(sync.wait_gradient(int(m.tensors.size()), soon()), InvalidArgument);
      if (step % 2 == 0) {
        EXPECT_EQ(sync.metrics()[0].sum, 2 * (1 + 2 + 3));  // two steps of every rank's value
        sync.zero_gradients();
      }
    }
  });
}
INSTANTIATE_TEST_SUITE_P(Ahead, WaitGradient, ::testing::Values(size_t{0}, 64 * KiB, size_t{1} << 30));

// A gradient in parts: contiguous in part order, each part reduced on its own
// as soon as it is marked, in the order backward marks them (part 0 first).
TEST(Fusion, GradientPartsAreContiguousAndReducedPartByPart) {
  const std::vector<size_t> parts = {4096, 4096, 4096, 1000};  // 16 KiB each, the last one shorter
  run_ranks(2, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.fusion = {16 * KiB, 16 * KiB, 0};  // a part a bucket
    o.input_layers_ahead_bytes = 40 * KiB;
    GradientSync sync(coll, o);
    const int input = sync.register_gradient("conv.weight", 100);
    const std::vector<int> ids = sync.register_gradient_parts("fc.weight", parts);
    const int head = sync.register_gradient("head.weight", 10);
    sync.finalize(soon());
    ASSERT_EQ(ids.size(), parts.size());
    EXPECT_EQ(sync.name(ids[0]), "fc.weight[0]");
    EXPECT_EQ(sync.name(ids[3]), "fc.weight[3]");
    float* whole = sync.data_as<float>(ids[0]);
    size_t at = 0;
    for (size_t k = 0; k < parts.size(); ++k) {
      EXPECT_EQ(sync.data_as<float>(ids[k]), whole + at) << "part " << k << " follows part " << k - 1;
      at += parts[k];
    }
    const size_t total = at;
    for (uint64_t step = 1; step <= 3; ++step) {
      auto fill = [&](int id, size_t n, size_t base) {
        float* d = sync.data_as<float>(id);
        for (size_t i = 0; i < n; ++i) d[i] = float(value(rank, 0, base + i, step));
      };
      fill(head, 10, 0);
      sync.mark_ready(head);
      at = 0;
      for (size_t k = 0; k < parts.size(); ++k) {  // backward's order: part 0 first
        fill(ids[k], parts[k], at);
        sync.mark_ready(ids[k]);
        at += parts[k];
      }
      fill(input, 100, 0);
      sync.mark_ready(input);
      for (size_t k = parts.size(); k-- > 0;) sync.wait_gradient(ids[k], soon());  // forward's: the last first
      for (size_t i = 0; i < total; ++i)
        ASSERT_EQ(whole[i], float((value(0, 0, i, step) + value(1, 0, i, step)) / 2)) << "element " << i;
      sync.wait(soon());
      sync.zero_gradients();
    }
  });
  // Parts that would leave a gap cannot be laid out contiguously.
  run_ranks(1, [&](int, std::shared_ptr<Collectives> coll) {
    GradientSync sync(coll, GradientSyncOptions{});
    const std::vector<size_t> odd = {100, 100};
    EXPECT_THROW(sync.register_gradient_parts("w", odd), InvalidArgument);
  });
}

TEST(Fusion, AllowUnusedReducesTheMissingGradientAsZeros) {
  const Model m = random_model(10, 5, false);
  run_ranks(3, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.allow_unused = true;
    o.fusion = {32 * KiB, 8 * KiB, 0};
    GradientSync sync(coll, o);
    register_model(sync, m);
    sync.finalize(soon());
    backward(sync, m, rank, 1, 3, uint32_t(rank), rank == 2 ? 6 : -1);
    sync.wait(soon());
    expect_reduced(sync, m, 3, 1, 1, 3, {2}, 6);  // rank 2 contributed zeros
    for (int g = 0; g < 10; ++g)
      if (g != 6) expect_reduced(sync, m, 3, 1, 1, 3, {}, g);
  });
}

TEST(Fusion, WithAggregationAGradientIsUnusedOnlyIfNoStepOfTheWindowMarkedIt) {
  const Model m = random_model(8, 21, false);
  std::vector<std::string> messages(2);
  run_ranks(2, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.aggregation_frequency = 2;
    o.fusion = {16 * KiB, 8 * KiB, 0};
    GradientSync sync(coll, o);
    register_model(sync, m);
    sync.finalize(soon());
    // Window 1: gradient 3 skipped in the first micro-step only; its step-2 value must survive.
    backward(sync, m, rank, 1, 2, 1, 3);
    sync.wait(soon());
    backward(sync, m, rank, 2, 2, 2);
    sync.wait(soon());
    for (int g = 0; g < 8; ++g)
      if (g != 3) expect_reduced(sync, m, 2, 2, 2, 4, {}, g);
    const float* g3 = sync.data_as<float>(3);
    for (size_t i = 0; i < m.tensors[3].count; ++i) {
      const double want = double(float(value(0, 3, i, 2) + value(1, 3, i, 2)) / 4.0f);
      if (g3[i] != want) {
        ADD_FAILURE() << "gradient 3[" << i << "] = " << g3[i] << ", want " << want;
        break;
      }
    }
    sync.zero_gradients();
    // Window 2: gradient 5 skipped in both micro-steps on rank 1: unused, named on every rank.
    backward(sync, m, rank, 3, 2, 3, rank == 1 ? 5 : -1);
    sync.wait(soon());
    backward(sync, m, rank, 4, 2, 4, rank == 1 ? 5 : -1);
    try {
      sync.wait(soon());
    } catch (const InvalidArgument& e) {
      messages[size_t(rank)] = e.what();
    }
  });
  for (const auto& msg : messages) EXPECT_NE(msg.find("'layer5.weight'"), std::string::npos) << msg;
}

TEST(Fusion, MetricsAreAveragedExactlyWithTheLastBucket) {
  const Model m = random_model(6, 9, false);
  for (const int k : {1, 2}) {
    std::vector<std::vector<Metric>> seen(4);
    std::vector<int> allreduces(4);
    run_ranks(4, [&](int rank, std::shared_ptr<Collectives> coll) {
      GradientSyncOptions o;
      o.metric_slots = 2;
      o.aggregation_frequency = k;
      GradientSync sync(coll, o);
      register_model(sync, m);
      sync.finalize(soon());
      for (int s = 1; s <= k; ++s) {
        // loss sum and sample count, accuracy as correct and count; ranks see different batch sizes
        const Metric mine[2] = {{0.25 * (rank + 1) * s, double(10 + rank)}, {double(3 + rank), double(10 + rank)}};
        sync.report_metrics(mine);
        backward(sync, m, rank, uint64_t(s), 2, uint32_t(s));
        sync.wait(soon());
      }
      seen[size_t(rank)].assign(sync.metrics().begin(), sync.metrics().end());
      allreduces[size_t(rank)] = static_cast<testing::ThreadWorld::Rank&>(*coll).allreduces;
      EXPECT_EQ(allreduces[size_t(rank)], int(sync.buckets().size())) << "metrics took an extra collective";
    });
    double loss = 0, count = 0, correct = 0;
    for (int r = 0; r < 4; ++r)
      for (int s = 1; s <= k; ++s) loss += 0.25 * (r + 1) * s, count += 10 + r, correct += 3 + r;
    for (int r = 0; r < 4; ++r) {
      ASSERT_EQ(seen[size_t(r)].size(), 2u);
      EXPECT_EQ(seen[size_t(r)][0].sum, loss) << "k=" << k;
      EXPECT_EQ(seen[size_t(r)][0].count, count);
      EXPECT_EQ(seen[size_t(r)][1].mean(), correct / count);
    }
  }
}

TEST(Fusion, HookErrorsAreRaisedByWait) {
  const Model m = random_model(3, 1, false);
  run_ranks(1, [&](int, std::shared_ptr<Collectives> coll) {
    GradientSync sync(coll, {});
    register_model(sync, m);
    sync.finalize(soon());
    sync.mark_ready(0);
    sync.mark_ready(0);
    sync.mark_ready(1);
    sync.mark_ready(2);
    try {
      sync.wait(soon());
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("'layer0.weight'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("marked ready twice"), std::string::npos) << e.what();
    }
    for (int g = 0; g < 3; ++g) sync.mark_ready(g);
    sync.mark_ready(7);
    EXPECT_THROW(sync.wait(soon()), InvalidArgument);
    for (int g = 0; g < 3; ++g) sync.mark_ready(g);
    EXPECT_NO_THROW(sync.wait(soon()));
  });
}

TEST(Fusion, AutotuneChangesSettingsOnlyBetweenStepsAndEqually) {
  const Model m = random_model(25, 13, false);
  const std::string log = ::testing::TempDir() + "/autotune_test.jsonl";
  const int steps = 16;
  std::vector<std::vector<FusionSettings>> seen(3);
  std::vector<std::vector<std::vector<std::vector<int>>>> layouts(3);
  run_ranks(3, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.fusion = {1 << 20, 128 * KiB, 64 * KiB};
    o.autotune.enabled = true;
    o.autotune.warmup_steps = 1;
    o.autotune.steps_per_sample = 2;
    o.autotune.max_samples = 5;
    o.autotune.log_path = rank == 0 ? log : "";
    GradientSync sync(coll, o);
    register_model(sync, m);
    sync.finalize(soon());
    for (int s = 1; s <= steps; ++s) {
      backward(sync, m, rank, uint64_t(s), 3, uint32_t(s * 7 + rank));
      const FusionSettings before = sync.settings();
      sync.wait(soon());
      EXPECT_EQ(sync.last_step().settings, before) << "settings changed during step " << s;
      expect_reduced(sync, m, 3, uint64_t(s), 1, 3);
      sync.zero_gradients();
      seen[size_t(rank)].push_back(sync.settings());
      layouts[size_t(rank)].push_back(sync.buckets());
    }
  });
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(seen[size_t(r)], seen[0]) << "rank " << r;
    EXPECT_EQ(layouts[size_t(r)], layouts[0]) << "rank " << r;
  }
  int changes = 0;
  for (size_t s = 1; s < seen[0].size(); ++s) changes += !(seen[0][s] == seen[0][s - 1]);
  EXPECT_GE(changes, 2);
  std::ifstream in(log);
  int lines = 0;
  bool chosen = false;
  for (std::string line; std::getline(in, line); ++lines) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("exposed_ms") && j.contains("fusion_threshold_bytes"));
    chosen |= j["phase"] == "chosen";
  }
  EXPECT_GE(lines, 5);
  EXPECT_TRUE(chosen);
}

TEST(Autotuner, FindsTheGridMinimumOfASmoothScoreWithinItsBudget) {
  // A bowl over the settings in log2 space; its minimum is a grid point the start is far from.
  auto score = [](const FusionSettings& s) {
    const double t = std::log2(double(s.fusion_threshold_bytes)) - 23;           // 8 MiB
    const double f = std::log2(double(s.first_bucket_bytes)) - 19;               // 512 KiB
    const double c = std::log2(double(s.chunk_bytes ? s.chunk_bytes : 1)) - 18;  // 256 KiB
    return 10e-3 * (1 + 0.05 * t * t + 0.03 * f * f + 0.04 * c * c);
  };
  double best_grid = 1e9;
  for (const auto& s : Autotuner::grid()) best_grid = std::min(best_grid, score(s));
  AutotuneOptions o;
  o.max_samples = 11;  // 11 trials + 2 confirmations at 3 steps each, one warm-up: 40 steps
  Autotuner tuner(o, {64 << 20, 4 << 20, 64 * KiB});
  FusionSettings s = tuner.current();
  for (int i = 0; i < Autotuner::trials_to_settle(o); ++i) s = tuner.next(score(s), 0.1);
  EXPECT_TRUE(tuner.settled());
  EXPECT_LE(score(tuner.current()), 1.10 * best_grid);
  // Settled: steady step times keep the setting; two drifted trials re-open the search.
  const FusionSettings chosen = tuner.current();
  EXPECT_EQ(tuner.next(score(chosen), 0.1), chosen);
  EXPECT_EQ(tuner.next(score(chosen), 0.11), chosen);
  tuner.next(score(chosen), 0.3);
  EXPECT_TRUE(tuner.settled());
  tuner.next(score(chosen), 0.3);
  EXPECT_FALSE(tuner.settled());
}

TEST(Autotuner, SettlesNearTheGridMinimumDespiteNoisyTimings) {
  // A bowl whose grid neighbours differ by 5-8 %, each measurement off by a random
  // factor (lognormal, sigma 0.1): the tuner must pool trials, not trust the luckiest.
  auto truth = [](const FusionSettings& s) {
    const double t = std::log2(double(s.fusion_threshold_bytes)) - 22;           // 4 MiB
    const double f = std::log2(double(s.first_bucket_bytes)) - 20;               // 1 MiB
    const double c = std::log2(double(s.chunk_bytes ? s.chunk_bytes : 1)) - 20;  // 1 MiB
    return 10e-3 * (1 + 0.08 * t * t + 0.05 * f * f + 0.06 * c * c);
  };
  double best_grid = 1e9;
  for (const auto& s : Autotuner::grid()) best_grid = std::min(best_grid, truth(s));
  AutotuneOptions o;
  o.max_samples = 18;  // 20 trials at 2 steps each: 40 steps
  int near = 0;
  const int runs = 20;
  for (int seed = 1; seed <= runs; ++seed) {
    std::mt19937_64 rng{uint64_t(seed)};
    std::lognormal_distribution<double> noise(0.0, 0.1);
    Autotuner tuner(o, {64 << 20, 4 << 20, 64 * KiB});
    FusionSettings s = tuner.current();
    for (int i = 0; i < Autotuner::trials_to_settle(o); ++i) s = tuner.next(truth(s) * noise(rng), 0.1);
    ASSERT_TRUE(tuner.settled());
    const double ratio = truth(tuner.current()) / best_grid;
    EXPECT_LE(ratio, 1.5) << "seed " << seed;
    if (ratio <= 1.10) ++near;
  }
  EXPECT_GE(near, 12) << near << " of " << runs << " runs settled within 10% of the grid minimum";
}

TEST(Fusion, TimelineIsTraceEventJson) {
  const Model m = random_model(8, 2, false);
  const std::string path = ::testing::TempDir() + "/fusion_timeline.json";
  run_ranks(2, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSyncOptions o;
    o.timeline_path = rank == 0 ? path : "";
    o.fusion = {64 * KiB, 16 * KiB, 0};
    GradientSync sync(coll, o);
    register_model(sync, m);
    sync.finalize(soon());
    for (int s = 1; s <= 2; ++s) {
      backward(sync, m, rank, uint64_t(s), 2, uint32_t(s));
      sync.wait(soon());
      sync.zero_gradients();
    }
  });
  std::ifstream in(path);
  const auto trace = nlohmann::json::parse(in);  // the destructor closed the array
  ASSERT_TRUE(trace.is_array());
  int buckets = 0, ready = 0, waits = 0;
  for (const auto& e : trace) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid") && e.contains("name"));
    if (e["ph"] == "X") {
      ASSERT_TRUE(e.contains("ts") && e.contains("dur"));
    }
    const std::string name = e["name"];
    buckets += e["ph"] == "X" && e["cat"] == "allreduce";
    ready += e["ph"] == "i";
    waits += name.rfind("wait step", 0) == 0;
  }
  EXPECT_EQ(ready, 16);
  EXPECT_EQ(waits, 2);
  EXPECT_GE(buckets, 4);
}

TEST(Fusion, StatisticsAccountForTheStep) {
  const Model m = random_model(10, 4, false);
  run_ranks(2, [&](int rank, std::shared_ptr<Collectives> coll) {
    GradientSync sync(coll, {});
    register_model(sync, m);
    sync.finalize(soon());
    backward(sync, m, rank, 1, 1, 1);
    sync.wait(soon());
    const StepStats& s = sync.last_step();
    size_t payload = 0;
    for (const auto& t : m.tensors) payload += (t.count * 4 + 63) / 64 * 64;
    EXPECT_EQ(s.bytes_reduced, payload);
    EXPECT_GE(s.wire_bytes, payload);
    EXPECT_GT(s.communication, 0);
    EXPECT_GE(s.hidden_fraction, 0);
    EXPECT_LE(s.hidden_fraction, 1);
    EXPECT_EQ(s.step, 1u);
  });
}

}  // namespace
}  // namespace tandem::fusion
