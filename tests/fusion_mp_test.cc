// The gradient-sync engine across real rank processes: on one host through
// shared memory (gradients in allocate_shared arenas: the direct path), and
// over UCX only. Results equal a plain all-reduce of the same gradients,
// bitwise on the shared-memory path (each element folded in rank order either
// way); registration mismatches and unused gradients fail every rank by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "multiprocess.h"
#include "tandem/compression/compression.h"
#include "tandem/fusion/gradient_sync.h"
#include "tandem/ring/ring.h"

namespace tandem::fusion {
namespace {

using testing::RankGroup;
constexpr auto kGuard = std::chrono::seconds(120);

Deadline soon() { return Clock::now() + std::chrono::seconds(60); }

std::vector<size_t> sizes(int gradients) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<size_t> count(1, 60000);
  std::vector<size_t> out;
  for (int g = 0; g < gradients; ++g) out.push_back(count(rng));
  return out;
}

// This rank's gradient values for a step: random, not integers, so a bitwise
// comparison says the reduction order matched.
std::vector<float> values(int rank, int grad, size_t count, int step) {
  std::mt19937 rng(uint32_t(rank * 1000003 + grad * 101 + step));
  std::uniform_real_distribution<float> v(-1, 1);
  std::vector<float> out(count);
  for (auto& x : out) x = v(rng);
  return out;
}

// Backward from `hooks` threads in a random order; returns each gradient's input.
// poison: gradient 0 starts with 1e30, which fp16 cannot carry.
std::vector<std::vector<float>> backward(GradientSync& sync, const std::vector<size_t>& counts, int rank, int step,
                                         int hooks, bool poison = false) {
  std::vector<std::vector<float>> inputs(counts.size());
  for (size_t g = 0; g < counts.size(); ++g) inputs[g] = values(rank, int(g), counts[g], step);
  if (poison) inputs[0][0] = 1e30f;
  std::vector<int> order(counts.size());
  for (size_t g = 0; g < order.size(); ++g) order[g] = int(g);
  std::shuffle(order.begin(), order.end(), std::mt19937(uint32_t(rank * 31 + step)));
  std::vector<std::thread> threads;
  for (int h = 0; h < hooks; ++h) {
    threads.emplace_back([&, h] {
      for (size_t k = size_t(h); k < order.size(); k += size_t(hooks)) {
        const int g = order[k];
        std::memcpy(sync.data(g), inputs[size_t(g)].data(), counts[size_t(g)] * sizeof(float));
        sync.mark_ready(g);
      }
    });
  }
  for (auto& t : threads) t.join();
  return inputs;
}

int run_steps(const CommOptions& o, int steps) {
  auto comm = ring::connect(o, {});
  const auto counts = sizes(40);
  GradientSyncOptions so;
  so.fusion = {256 << 10, 64 << 10, 0};
  GradientSync sync(*comm, so);
  for (size_t g = 0; g < counts.size(); ++g) sync.register_gradient("g" + std::to_string(g), counts[g]);
  sync.finalize(soon());
  for (int s = 1; s <= steps; ++s) {
    auto inputs = backward(sync, counts, comm->rank(), s, 3);
    sync.wait(soon());
    for (size_t g = 0; g < counts.size(); ++g) {
      comm->allreduce(inputs[g].data(), counts[g], DataType::f32, ReduceOp::avg);  // the reference
      if (std::memcmp(inputs[g].data(), sync.data(int(g)), counts[g] * sizeof(float)) != 0) {
        ADD_FAILURE() << "rank " << comm->rank() << " step " << s << ": gradient " << g
                      << " differs from a plain all-reduce";
        return 1;
      }
    }
    EXPECT_GT(sync.last_step().buckets, 5);
    sync.zero_gradients();
  }
  return 0;
}

TEST(FusionProcesses, SharedMemoryBucketsMatchPlainAllreduceBitwise) {
  for (int n : {2, 3}) {
    RankGroup group(n, [](const CommOptions& o) { return run_steps(o, 3); });
    group.expect_success(kGuard);
  }
}

TEST(FusionProcesses, UcxBucketsMatchTheClosedForm) {
  CommOptions base;
  ring::RingOptions ring_base;
  ring_base.shared_memory = false;
  RankGroup group(
      3,
      [ring_base](const CommOptions& o) {
        auto comm = ring::connect(o, ring_base);
        const auto counts = sizes(20);
        GradientSyncOptions so;
        so.fusion = {128 << 10, 32 << 10, 64 << 10};
        GradientSync sync(*comm, so);
        for (size_t g = 0; g < counts.size(); ++g) sync.register_gradient("g" + std::to_string(g), counts[g]);
        sync.finalize(soon());
        for (int s = 1; s <= 2; ++s) {
          for (size_t g = 0; g < counts.size(); ++g) {
            float* d = sync.data_as<float>(int(g));
            for (size_t i = 0; i < counts[g]; ++i) d[i] = float((comm->rank() + 1) * int(i % 11) + s);
            sync.mark_ready(int(g));
          }
          sync.wait(soon());
          for (size_t g = 0; g < counts.size(); ++g) {
            const float* d = sync.data_as<float>(int(g));
            for (size_t i = 0; i < counts[g]; ++i) {
              const float want = float(6 * int(i % 11) + 3 * s) / 3.0f;
              if (d[i] != want) {
                ADD_FAILURE() << "g" << g << "[" << i << "] = " << d[i] << ", want " << want;
                return 1;
              }
            }
          }
          sync.zero_gradients();
        }
        return 0;
      },
      base);
  group.expect_success(kGuard);
}

// fp16 buckets: within fp16's rounding of the f32 result, half the bytes on
// the wire, metrics still exact (their tail travels in f32); a bucket holding
// a value fp16 cannot carry falls back to f32 and is then bitwise exact.
TEST(FusionProcesses, CompressedBucketsStayCloseAndFallBackExactly) {
  for (const bool shm : {true, false}) {
    CommOptions base;
    ring::RingOptions ring_base;
    ring_base.shared_memory = shm;
    RankGroup group(
        2,
        [ring_base](const CommOptions& o) {
          auto comm = ring::connect(o, ring_base);
          compression::CompressedAllreduce fp16(*comm, {compression::Codec::fp16, 0, false});
          const auto counts = sizes(12);
          GradientSyncOptions so;
          so.fusion = {256 << 10, 64 << 10, 0};
          so.compression = &fp16;
          so.metric_slots = 1;
          GradientSync sync(*comm, so);
          for (size_t g = 0; g < counts.size(); ++g) sync.register_gradient("g" + std::to_string(g), counts[g]);
          sync.finalize(soon());
          for (int s = 1; s <= 2; ++s) {
            const Metric m[1] = {{double(comm->rank() + s), 4.0}};
            sync.report_metrics(m);
            auto inputs = backward(sync, counts, comm->rank(), s, 2, s == 2);  // step 2's bucket 0 must fall back
            sync.wait(soon());
            const StepStats& st = sync.last_step();
            EXPECT_EQ(st.compression_fallbacks, s == 2 ? 1u : 0u);
            EXPECT_LT(st.wire_bytes, st.bytes_reduced * (s == 2 ? 0.9 : 0.55));
            EXPECT_EQ(sync.metrics()[0].sum, double(1 + 2 * s));
            EXPECT_EQ(sync.metrics()[0].count, 8.0);
            for (size_t g = 0; g < counts.size(); ++g) {
              std::vector<float> want = inputs[g];
              comm->allreduce(want.data(), counts[g], DataType::f32, ReduceOp::avg);
              const float* got = sync.data_as<float>(int(g));
              for (size_t i = 0; i < counts[g]; ++i) {
                // |x| <= 1 per rank: fp16 keeps 11 bits, one rounding each way and per fold
                if (std::abs(got[i] - want[i]) > 2e-3f * std::max(1.0f, std::abs(want[i]))) {
                  ADD_FAILURE() << "step " << s << " g" << g << "[" << i << "] = " << got[i] << ", want " << want[i];
                  return 1;
                }
              }
            }
            // The fallen-back bucket (gradient 0's) is exact.
            std::vector<float> want = inputs[0];
            comm->allreduce(want.data(), counts[0], DataType::f32, ReduceOp::avg);
            if (s == 2) {
              EXPECT_EQ(std::memcmp(want.data(), sync.data(0), counts[0] * sizeof(float)), 0);
            }
            sync.zero_gradients();
          }
          return 0;
        },
        base);
    group.expect_success(kGuard);
  }
}

// Exit codes say which error each rank saw.
constexpr int kSawNamedError = 10;

TEST(FusionProcesses, MismatchAndUnusedGradientsFailEveryRankByName) {
  for (const bool unused : {false, true}) {
    RankGroup group(3, [unused](const CommOptions& o) {
      auto comm = ring::connect(o, {});
      GradientSync sync(*comm, {});
      sync.register_gradient("embed.weight", 5000);
      sync.register_gradient(!unused && comm->rank() == 1 ? "head.bias" : "head.weight", 1000);
      try {
        sync.finalize(soon());
        for (int g = 0; g < 2; ++g)
          if (!(unused && comm->rank() == 2 && g == 0)) sync.mark_ready(g);
        sync.wait(soon());
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        const bool named =
            unused ? what.find("'embed.weight'") != std::string::npos && what.find("on rank(s) 2") != std::string::npos
                   : what.find("rank 1 has 'head.bias'") != std::string::npos;
        if (!named) fprintf(stderr, "unexpected message: %s\n", what.c_str());
        return named ? kSawNamedError : 1;
      }
      return 0;
    });
    const auto codes = group.wait(kGuard);
    for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[size_t(r)], kSawNamedError) << "rank " << r << " unused=" << unused;
  }
}

}  // namespace
}  // namespace tandem::fusion
