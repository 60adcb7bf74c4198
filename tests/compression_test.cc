// Gradient compression (compression/): the codec kernels of every ISA against
// the scalar functors, rounding and inf/NaN rules, then the compressed
// all-reduce across real rank processes (shared memory and UCX only) against
// an f64 reference with a stated bound, overflow guard rails, bitwise
// agreement across ranks, error feedback and bf16's range.
//
// The error bound is compression::error_bound's (stated in compression.h).
#include "tandem/compression/compression.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codec_functors.h"
#include "codec_kernels.h"
#include "edge_floats.h"
#include "multiprocess.h"
#include "tandem/errors.h"
#include "tandem/reduce.h"
#include "tandem/tandem.h"
#include "typed_values.h"

namespace tandem::compression {
namespace {

using namespace std::chrono_literals;
using detail::Isa;
using testing::RankGroup;

constexpr Codec kCodecs[] = {Codec::fp16, Codec::bf16};

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

const codec::FormatKernels& format(const codec::CodecKernels& k, Codec c) { return c == Codec::fp16 ? k.f16 : k.bf16; }

uint16_t encode_one(Codec c, float x, float scale = 1.0f) {
  uint16_t h = 0;
  encode(c, &x, &h, 1, scale);
  return h;
}

// ---------------------------------------------------------------- names

TEST(CodecNames, ParseAcceptsDeterminedBooleansAndNames) {
  EXPECT_EQ(parse_codec("fp16"), Codec::fp16);
  EXPECT_EQ(parse_codec("FP16"), Codec::fp16);
  EXPECT_EQ(parse_codec("true"), Codec::fp16);
  EXPECT_EQ(parse_codec("True"), Codec::fp16);
  EXPECT_EQ(parse_codec("bf16"), Codec::bf16);
  EXPECT_EQ(parse_codec("bfloat16"), Codec::bf16);
  EXPECT_EQ(parse_codec("none"), Codec::none);
  EXPECT_EQ(parse_codec("false"), Codec::none);
  EXPECT_EQ(parse_codec(""), std::nullopt);
  EXPECT_EQ(parse_codec("fp8"), std::nullopt);
  EXPECT_EQ(parse_codec("1"), std::nullopt);
  for (Codec c : {Codec::none, Codec::fp16, Codec::bf16}) EXPECT_EQ(parse_codec(to_string(c)), c);
  EXPECT_EQ(wire_dtype(Codec::fp16), DataType::f16);
  EXPECT_EQ(wire_dtype(Codec::bf16), DataType::bf16);
  EXPECT_THROW(encode_one(Codec::none, 1.0f), InvalidArgument);
}

// ---------------------------------------------------------------- kernels

// Every supported ISA computes the scalar kernels' bits, tails included.
class CodecIsa : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!detail::cpu_supports(GetParam())) GTEST_SKIP() << to_string(GetParam()) << " not supported by this CPU";
  }
};

// Inputs that exercise every rounding path: random bit patterns over the whole
// f32 range (NaNs, infs, subnormals included), values near the 16-bit formats'
// limits and ties.
std::vector<float> awkward_floats(size_t n) {
  std::mt19937 rng(12345);
  std::vector<float> v = testing::edge_floats();
  std::uniform_real_distribution<float> unit(-2.0f, 2.0f);
  while (v.size() < n) {
    v.push_back(from_bits(static_cast<uint32_t>(rng())));
    v.push_back(unit(rng));
    v.push_back(unit(rng) * 1e-5f);
    v.push_back(unit(rng) * 4e4f);
  }
  v.resize(n);
  return v;
}

TEST_P(CodecIsa, EncodeDecodeAndFeedbackMatchScalarBitwise) {
  const auto& simd = codec::codec_kernels(GetParam());
  const auto& scalar = codec::codec_kernels(Isa::scalar);
  const size_t n = (size_t(1) << 16) + 13;  // odd: vector bodies and scalar tails
  const std::vector<float> x = awkward_floats(n);
  for (Codec c : kCodecs) {
    SCOPED_TRACE(std::string(to_string(c)));
    for (float scale : {1.0f, 0.25f, 1.0f / 3.0f, 3.0f}) {
      SCOPED_TRACE("scale " + std::to_string(scale));
      std::vector<uint16_t> a(n), b(n);
      format(simd, c).encode(x.data(), a.data(), n, scale);
      format(scalar, c).encode(x.data(), b.data(), n, scale);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << "encode element " << i << " x=" << x[i];

      // Decode every 16-bit pattern (and an odd tail).
      std::vector<uint16_t> all(65536 + 7);
      for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u);
      std::vector<float> da(all.size()), db(all.size());
      format(simd, c).decode(all.data(), da.data(), all.size(), scale);
      format(scalar, c).decode(all.data(), db.data(), all.size(), scale);
      for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(bits_of(da[i]), bits_of(db[i])) << "decode pattern " << all[i];

      // Error feedback: residuals of every magnitude, data and residual updated identically.
      std::vector<float> data_a = x, data_b = x, res_a(n), res_b(n);
      const std::vector<float> r = awkward_floats(n + 3);
      for (size_t i = 0; i < n; ++i) res_a[i] = res_b[i] = std::isfinite(r[i + 3]) ? r[i + 3] * 1e-3f : 0.0f;
      format(simd, c).encode_feedback(data_a.data(), res_a.data(), a.data(), n, scale, 1.0f / scale);
      format(scalar, c).encode_feedback(data_b.data(), res_b.data(), b.data(), n, scale, 1.0f / scale);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(a[i], b[i]) << "encode_feedback element " << i;
        ASSERT_EQ(bits_of(data_a[i]), bits_of(data_b[i])) << "data element " << i;
        ASSERT_EQ(bits_of(res_a[i]), bits_of(res_b[i])) << "residual element " << i;
      }
    }
  }
}

TEST_P(CodecIsa, AllFiniteAgreesWithTheScalarTestOnEveryPattern) {
  const auto& kernels = codec::codec_kernels(GetParam());
  for (Codec c : kCodecs) {
    SCOPED_TRACE(std::string(to_string(c)));
    const auto check = [&](uint16_t h) {
      return c == Codec::fp16 ? codec::nonfinite(codec::f16_t{h}) : codec::nonfinite(codec::bf16_t{h});
    };
    const uint16_t one = encode_one(c, 1.5f);
    std::vector<uint16_t> v(67, one);  // vector bodies and a tail
    for (uint32_t pattern = 0; pattern < 65536; ++pattern) {
      const uint16_t h = static_cast<uint16_t>(pattern);
      const size_t at = pattern % v.size();
      v[at] = h;
      ASSERT_EQ(format(kernels, c).all_finite(v.data(), v.size()), !check(h)) << "pattern " << std::hex << pattern;
      v[at] = one;
    }
    // Several blocks: a bad value in any of them, at block edges.
    std::vector<uint16_t> w(3 * 4096 + 17, one);
    for (size_t at : {size_t(0), size_t(4095), size_t(4096), size_t(8200), w.size() - 1}) {
      w[at] = encode_one(c, -std::numeric_limits<float>::infinity());
      EXPECT_FALSE(format(kernels, c).all_finite(w.data(), w.size())) << "position " << at;
      w[at] = one;
    }
    EXPECT_TRUE(format(kernels, c).all_finite(w.data(), w.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, CodecIsa, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const auto& info) { return std::string(detail::to_string(info.param)); });

TEST(Codec, RoundsToNearestEven) {
  // fp16: spacing 2^-10 just above 1; halfway cases go to the even mantissa.
  EXPECT_EQ(encode_one(Codec::fp16, 1.0f + 0x1p-11f), 0x3C00);             // tie -> 1.0 (even)
  EXPECT_EQ(encode_one(Codec::fp16, 1.0f + 3 * 0x1p-11f), 0x3C02);         // tie -> 1 + 2^-9 (even)
  EXPECT_EQ(encode_one(Codec::fp16, 1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // above the tie -> up
  EXPECT_EQ(encode_one(Codec::fp16, 65504.0f), 0x7BFF);
  EXPECT_EQ(encode_one(Codec::fp16, 65519.0f), 0x7BFF);  // below the 65520 tie: largest finite
  EXPECT_EQ(encode_one(Codec::fp16, 65520.0f), 0x7C00);  // the tie rounds to inf
  EXPECT_EQ(encode_one(Codec::fp16, 0x1p-25f), 0x0000);  // half the smallest subnormal: tie -> 0
  EXPECT_EQ(encode_one(Codec::fp16, 3 * 0x1p-26f), 0x0001);
  EXPECT_EQ(encode_one(Codec::fp16, -3 * 0x1p-26f), 0x8001);
  // bf16: spacing 2^-7 above 1.
  EXPECT_EQ(encode_one(Codec::bf16, 1.0f + 0x1p-8f), 0x3F80);
  EXPECT_EQ(encode_one(Codec::bf16, 1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(encode_one(Codec::bf16, std::numeric_limits<float>::max()), 0x7F80);  // rounds past bf16's max
  EXPECT_EQ(encode_one(Codec::bf16, std::numeric_limits<float>::denorm_min()), 0x0000);
  // Scaling happens in f32 before the rounding: 3 * 0.25 = 0.75 exactly.
  EXPECT_EQ(encode_one(Codec::fp16, 3.0f, 0.25f), 0x3A00);
  float back = 0;
  uint16_t h = 0x3A00;
  decode(Codec::fp16, &h, &back, 1, 4.0f);
  EXPECT_EQ(back, 3.0f);
}

TEST(Codec, NanAndInfinityStayNonFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  for (Codec c : kCodecs) {
    SCOPED_TRACE(std::string(to_string(c)));
    const uint16_t inf16 = c == Codec::fp16 ? 0x7C00 : 0x7F80;
    EXPECT_EQ(encode_one(c, inf), inf16);
    EXPECT_EQ(encode_one(c, -inf), inf16 | 0x8000);
    for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0xFFBFFFFFu}) {
      const uint16_t h = encode_one(c, from_bits(nan));
      float back = 0;
      decode(c, &h, &back, 1, 1.0f);
      EXPECT_TRUE(std::isnan(back)) << std::hex << nan << " -> " << h;
      EXPECT_EQ(h >> 15, nan >> 31) << "sign kept";
    }
    // all_finite finds one bad element anywhere, vector body or tail.
    const size_t n = 10007;
    std::vector<uint16_t> v(n, encode_one(c, 1.5f));
    EXPECT_TRUE(all_finite(c, v.data(), n));
    for (size_t pos : {size_t(0), size_t(4095), size_t(4096), n - 1}) {
      for (float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
        std::vector<uint16_t> w = v;
        w[pos] = encode_one(c, bad);
        EXPECT_FALSE(all_finite(c, w.data(), n)) << "position " << pos;
      }
    }
    EXPECT_TRUE(all_finite(c, nullptr, 0));
  }
  EXPECT_EQ(encode_one(Codec::fp16, 1e6f), 0x7C00);           // beyond fp16: inf (the guard catches it)
  EXPECT_NE(encode_one(Codec::bf16, 1e6f) & 0x7F80, 0x7F80);  // bf16 has f32's exponent range
}

// Error feedback arithmetic on single elements: v is kept, the residual is what rounding dropped.
TEST(Codec, FeedbackKeepsTheRoundingError) {
  float data = 1.0f + 0x1p-12f, residual = 0x1p-13f;  // v = 1 + 3 * 2^-13
  uint16_t h = 0;
  encode_feedback(Codec::fp16, &data, &residual, &h, 1, 0.5f, 2.0f);  // y = v / 2
  EXPECT_EQ(data, 1.0f + 3 * 0x1p-13f);
  EXPECT_EQ(h, 0x3800);               // y = 0.5 + 3 * 2^-14 rounds to 0.5 (spacing 2^-11 there)
  EXPECT_EQ(residual, 3 * 0x1p-13f);  // (y - 0.5) * 2: exactly what was dropped
  float tiny = 1e-9f, r = 0.0f;       // below fp16's subnormals: sent as 0, kept whole
  encode_feedback(Codec::fp16, &tiny, &r, &h, 1, 1.0f, 1.0f);
  EXPECT_EQ(h, 0x0000);
  EXPECT_EQ(r, 1e-9f);
}

// Device buffers: the CUDA kernels are linked in a CUDA build, but no GPU is
// here, so the call fails with a typed error (and without CUDA, is refused).
TEST(Codec, CudaBuffersFailCleanlyWithoutAGpu) {
  std::vector<float> x(16, 1.0f);
  std::vector<uint16_t> h(16);
  if (cuda_kernels_built()) {
    EXPECT_THROW(encode(MemoryType::cuda, Codec::fp16, x.data(), h.data(), h.size(), 1.0f), Error);
  } else {
    EXPECT_THROW(encode(MemoryType::cuda, Codec::fp16, x.data(), h.data(), h.size(), 1.0f), InvalidArgument);
  }
  EXPECT_THROW(encode(MemoryType::cuda, Codec::none, x.data(), h.data(), h.size(), 1.0f), InvalidArgument);
  encode(MemoryType::host, Codec::bf16, x.data(), h.data(), h.size(), 1.0f);
  EXPECT_EQ(h[15], 0x3F80);
  EXPECT_TRUE(all_finite(MemoryType::host, Codec::bf16, h.data(), h.size()));
}

// ---------------------------------------------------------------- all-reduce across ranks

// Deterministic inputs in [-1, 1] with mixed magnitudes.
float input(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>((rank + 1) * 2654435761u) ^ static_cast<uint32_t>(i * 40503u + 7);
  const float unit = float(int(h % 20001) - 10000) / 10000.0f;
  const float magnitude[] = {1.0f, 0.1f, 1e-3f, 1e-5f};
  return unit * magnitude[(h >> 16) % 4];
}

// Every rank holds the same bytes iff the min and max of their hashes agree.
void expect_identical(Communicator& comm, const void* data, size_t bytes) {
  int64_t h[2] = {testing::fnv1a(data, bytes), 0};
  h[1] = h[0];
  comm.allreduce(&h[0], 1, DataType::i64, ReduceOp::min);
  comm.allreduce(&h[1], 1, DataType::i64, ReduceOp::max);
  EXPECT_EQ(h[0], h[1]) << "ranks disagree bitwise";
}

int check_against_reference(const CommOptions& o, bool expect_shared_memory,
                            const ring::RingOptions& ring_options = {}) {
  auto comm = ring::connect(o, ring_options);
  const int n = comm->size(), r = comm->rank();
  EXPECT_EQ(comm->transport_summary().find("shared memory") != std::string::npos, expect_shared_memory && n > 1)
      << comm->transport_summary();
  const size_t count = 100003;
  for (Codec c : kCodecs) {
    CompressedAllreduce compressed(*comm, CompressionOptions{c});
    EXPECT_EQ(compressed.predivide(), double(n));
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      SCOPED_TRACE(std::string(to_string(c)) + " " + std::string(tandem::to_string(op)));
      std::vector<float> x(count);
      for (size_t i = 0; i < count; ++i) x[i] = input(r, i);
      EXPECT_TRUE(compressed.allreduce(x.data(), count, op));
      const double divisor = op == ReduceOp::avg ? n : 1;
      size_t bad = 0;
      double worst = 0;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0, magnitude = 0;
        for (int q = 0; q < n; ++q) {
          exact += input(q, i);
          magnitude += std::fabs(input(q, i));
        }
        const double bound = error_bound(c, n, n, magnitude) / divisor;
        const double err = std::fabs(x[i] - exact / divisor);
        worst = std::max(worst, err / bound);
        if (!(err <= bound) && bad++ < 3) ADD_FAILURE() << "element " << i << ": " << x[i] << " vs " << exact / divisor;
      }
      EXPECT_LE(worst, 1.0);
      expect_identical(*comm, x.data(), count * sizeof(float));
    }
    const CompressionStats& s = compressed.stats();
    EXPECT_EQ(s.calls, 2u);
    EXPECT_EQ(s.compressed_calls, 2u);
    EXPECT_EQ(s.fallbacks, 0u);
    EXPECT_EQ(s.payload_bytes, 2 * count * 4);
    EXPECT_EQ(s.wire_bytes, 2 * count * 2);
    EXPECT_GT(s.cast_seconds, 0.0);
  }
  return 0;
}

class CompressedWorld : public ::testing::TestWithParam<int> {};

TEST_P(CompressedWorld, MatchesReferenceThroughSharedMemory) {
  RankGroup group(GetParam(), [](const CommOptions& o) { return check_against_reference(o, true); });
  group.expect_success(120s);
}

TEST_P(CompressedWorld, MatchesReferenceOverUcxRing) {
  CommOptions base;
  ring::RingOptions ring_base;
  ring_base.shared_memory = false;
  ring_base.allreduce = ring::AllreduceAlgorithm::ring;
  ring_base.segment_bytes = 64 << 10;  // several segments per chunk even at 100k elements
  RankGroup group(
      GetParam(), [ring_base](const CommOptions& o) { return check_against_reference(o, false, ring_base); }, base);
  group.expect_success(120s);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CompressedWorld, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// body runs on every rank with its communicator (gtest assertions fail the rank).
void run_ranks(int n, bool shared_memory, const std::function<void(Communicator&)>& body) {
  CommOptions base;
  ring::RingOptions ring_base;
  ring_base.shared_memory = shared_memory;
  RankGroup group(
      n,
      [&body, ring_base](const CommOptions& o) {
        body(*ring::connect(o, ring_base));
        return 0;
      },
      base);
  group.expect_success(90s);
}

// 4 ranks each near fp16's maximum: predivision by 4 keeps every partial sum
// finite; without it (P = 1) the sum overflows and the call falls back to f32
// (range scale off: it would scale the values beyond fp16's range at once).
TEST(CompressedAllreduce, NearFp16MaxWithFourRanksDoesNotOverflow) {
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory" : "UCX");
    run_ranks(4, shm, [](Communicator& comm) {
      const size_t count = 1000;
      const float big = 60000.0f;
      std::vector<float> x(count);
      auto fill = [&] {
        for (size_t i = 0; i < count; ++i) x[i] = (i % 2 ? -big : big) + float(comm.rank());
      };
      fill();
      CompressedAllreduce predivided(comm, {Codec::fp16, 0, false, /*range_scale=*/false});
      EXPECT_TRUE(predivided.allreduce(x.data(), count, ReduceOp::sum));
      EXPECT_EQ(predivided.stats().fallbacks, 0u);
      for (size_t i = 0; i < count; ++i) {
        const double exact = (i % 2 ? -4.0 : 4.0) * big + 6.0;
        ASSERT_LE(std::fabs(x[i] - exact), error_bound(Codec::fp16, 4, 4, 4.0 * big)) << i;
        ASSERT_TRUE(std::isfinite(x[i]));
      }
      fill();
      CompressedAllreduce undivided(comm, {Codec::fp16, 1.0, false, false});
      EXPECT_FALSE(undivided.allreduce(x.data(), count, ReduceOp::avg));
      EXPECT_EQ(undivided.stats().fallbacks, 1u);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(x[i], ((i % 2 ? -4.0f : 4.0f) * big + 6.0f) / 4.0f) << i;
    });
  }
}

// A value no 16-bit code can hold (on one rank only), or a NaN: every rank
// falls back, and the result is bitwise what a plain f32 all-reduce gives.
TEST(CompressedAllreduce, UnrepresentableValueFallsBackExactlyOnEveryRank) {
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory" : "UCX");
    run_ranks(3, shm, [](Communicator& comm) {
      const size_t count = 50001;
      for (float bad : {1e9f, std::numeric_limits<float>::quiet_NaN()}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
          std::vector<float> x(count);
          for (size_t i = 0; i < count; ++i) x[i] = input(comm.rank(), i);
          if (comm.rank() == 1) x[count / 2] = bad;
          std::vector<float> plain = x;
          comm.allreduce(plain.data(), count, DataType::f32, op);
          CompressedAllreduce compressed(comm, {Codec::fp16});
          EXPECT_FALSE(compressed.allreduce(x.data(), count, op));
          EXPECT_EQ(std::memcmp(x.data(), plain.data(), count * sizeof(float)), 0) << "not the f32 result";
          EXPECT_EQ(compressed.stats().fallbacks, 1u);
          EXPECT_EQ(compressed.stats().compressed_calls, 0u);
          EXPECT_EQ(compressed.stats().wire_bytes, count * 6);
          expect_identical(comm, x.data(), count * sizeof(float));
          // The next call is compressed again: a fallback is per call, not sticky.
          for (size_t i = 0; i < count; ++i) x[i] = 1.0f;
          EXPECT_TRUE(compressed.allreduce(x.data(), count, op));
          EXPECT_EQ(x[count / 2], op == ReduceOp::sum ? 3.0f : 1.0f);
        }
      }
      // With error feedback, the fallback sends data + residual exactly and clears the residual.
      std::vector<float> x(count, 1.0f), residual(count, 0.25f);
      if (comm.rank() == 0) x[7] = 1e6f;  // 1e6 / 3 > 65504
      CompressedAllreduce compressed(comm, {Codec::fp16, 0, true});
      EXPECT_FALSE(compressed.allreduce(x.data(), count, ReduceOp::sum, {}, residual.data()));
      EXPECT_EQ(x[0], 3.75f);
      EXPECT_EQ(x[7], 1e6f + 2.75f);  // exact in f32
      for (float e : residual) ASSERT_EQ(e, 0.0f);
    });
  }
}

// A fixed gradient sequence for 100 steps: the sum of the results drifts from
// the exact sum with plain fp16 (nearly the same rounding every step, and
// values below fp16's subnormals lost each time); error feedback keeps it
// bounded. Both ranks hold the same gradients, so the 2-rank sum of two equal
// 16-bit values is exact and only the encoding's rounding, the one error
// feedback carries over, is measured (the rounding of partial sums at each
// hop or fold is not fed back: no rank owns it).
TEST(CompressedAllreduce, ErrorFeedbackKeepsAccumulatedErrorLower) {
  run_ranks(2, true, [](Communicator& comm) {
    const size_t count = 4096;
    const int steps = 100;
    auto gradient = [&](int step, int /*rank*/, size_t i) -> float {
      if (i % 8 == 0) return 2e-8f * float(i % 5 + 1);  // below fp16's range after predivide
      return 0.01f * (1.0f + float((i * 37) % 97) / 97.0f) * (1.0f + 1e-3f * float(step % 7 - 3));
    };
    CompressedAllreduce with_feedback(comm, {Codec::fp16, 0, true, false});  // range scale off: it would lift
    CompressedAllreduce without(comm, {Codec::fp16, 0, false, false});       // the tiny values into range
    std::vector<float> residual(count, 0.0f), a(count), b(count);
    std::vector<double> exact(count, 0.0), sum_a(count, 0.0), sum_b(count, 0.0);
    for (int t = 0; t < steps; ++t) {
      for (size_t i = 0; i < count; ++i) {
        a[i] = b[i] = gradient(t, comm.rank(), i);
        for (int q = 0; q < comm.size(); ++q) exact[i] += gradient(t, q, i);
      }
      EXPECT_TRUE(with_feedback.allreduce(a.data(), count, ReduceOp::sum, {}, residual.data()));
      EXPECT_TRUE(without.allreduce(b.data(), count, ReduceOp::sum));
      for (size_t i = 0; i < count; ++i) {
        sum_a[i] += a[i];
        sum_b[i] += b[i];
      }
    }
    double err_a = 0, err_b = 0, total = 0;
    for (size_t i = 0; i < count; ++i) {
      err_a += std::fabs(sum_a[i] - exact[i]);
      err_b += std::fabs(sum_b[i] - exact[i]);
      total += std::fabs(exact[i]);
    }
    if (comm.rank() == 0) {
      std::printf("accumulated |error| over %d steps: %.3g with error feedback, %.3g without (|sum| %.3g)\n", steps,
                  err_a, err_b, total);
    }
    EXPECT_LT(err_a, 0.05 * err_b);
    expect_identical(comm, sum_a.data(), count * sizeof(double));
  });
}

// The range scale lifts values below fp16's normal range (2^-14) to full
// precision; it halves after an overflow (that call falls back exactly) and
// doubles after kRangeGrowthCalls calls without one, the same on every rank.
TEST(CompressedAllreduce, RangeScaleKeepsSmallValuesAndFollowsOverflows) {
  run_ranks(2, true, [](Communicator& comm) {
    const size_t count = 4096;
    auto small = [&](size_t i) { return float(int(i % 97) - 48) * 1e-7f * float(comm.rank() + 1); };
    CompressedAllreduce scaled(comm, {Codec::fp16});
    CompressedAllreduce unscaled(comm, {Codec::fp16, 0, false, false});
    EXPECT_EQ(scaled.range_scale(), CompressedAllreduce::kInitialRangeScale);
    EXPECT_EQ(unscaled.range_scale(), 1.0f);
    std::vector<float> a(count), b(count);
    for (size_t i = 0; i < count; ++i) a[i] = b[i] = small(i);
    EXPECT_TRUE(scaled.allreduce(a.data(), count, ReduceOp::sum));
    EXPECT_TRUE(unscaled.allreduce(b.data(), count, ReduceOp::sum));
    double worst_scaled = 0, worst_unscaled = 0;
    for (size_t i = 0; i < count; ++i) {
      const double exact = double(int(i % 97) - 48) * 1e-7 * 3.0;
      if (exact == 0) continue;
      worst_scaled = std::max(worst_scaled, std::fabs(a[i] - exact) / std::fabs(exact));
      worst_unscaled = std::max(worst_unscaled, std::fabs(b[i] - exact) / std::fabs(exact));
    }
    EXPECT_LE(worst_scaled, 4 * 0x1p-11);  // 11 bits: two roundings and the f32 scaling
    EXPECT_GT(worst_unscaled, 0.05);       // subnormal: a few bits at most

    // Both ranks hold `big`: the 16-bit sum is big * S. 40 * 1024 fits fp16, 100 * 1024 does not:
    // that call falls back and halves the scale, after which 100 * 512 fits.
    for (float big : {40.0f, 100.0f, 100.0f}) {
      const float before = scaled.range_scale();
      std::vector<float> x(count, 1.0f);
      x[5] = big;
      const bool compressed = scaled.allreduce(x.data(), count, ReduceOp::sum);
      EXPECT_EQ(x[5], 2 * big);
      EXPECT_EQ(x[6], 2.0f);
      EXPECT_EQ(compressed, big * before < 65504.0f);
      EXPECT_EQ(scaled.range_scale(), compressed ? before : before / 2);
    }
    EXPECT_EQ(scaled.stats().fallbacks, 1u);
    const float settled = scaled.range_scale();
    std::vector<float> one(16, 0.5f);
    for (uint32_t k = 0; k < CompressedAllreduce::kRangeGrowthCalls; ++k)
      ASSERT_TRUE(scaled.allreduce(one.data(), one.size(), ReduceOp::avg));
    EXPECT_EQ(scaled.range_scale(), 2 * settled);
    float mine = scaled.range_scale();
    expect_identical(comm, &mine, sizeof mine);
  });
}

// bf16 has f32's exponent range: 1e30 and 1e-30 travel (fp16 falls back on the first).
TEST(CompressedAllreduce, Bf16KeepsF32Range) {
  run_ranks(3, true, [](Communicator& comm) {
    const float values[] = {1e30f, -2e35f, 1e-30f, 3e-36f, 1.5f};
    const size_t count = std::size(values) * 100;
    std::vector<float> x(count);
    auto fill = [&] {
      for (size_t i = 0; i < count; ++i) x[i] = values[i % std::size(values)] * float(comm.rank() + 1);
    };
    fill();
    CompressedAllreduce bf16(comm, {Codec::bf16});
    EXPECT_TRUE(bf16.allreduce(x.data(), count, ReduceOp::avg));
    for (size_t i = 0; i < count; ++i) {
      const double exact = double(values[i % std::size(values)]) * 2.0;  // (1 + 2 + 3) / 3
      const double magnitude = 6.0 * std::fabs(double(values[i % std::size(values)]));
      ASSERT_LE(std::fabs(x[i] - exact), error_bound(Codec::bf16, 3, 3, magnitude) / 3.0) << "element " << i;
    }
    fill();
    CompressedAllreduce fp16(comm, {Codec::fp16});
    EXPECT_FALSE(fp16.allreduce(x.data(), count, ReduceOp::avg));
  });
}

// Codec none is the plain f32 all-reduce; bad arguments are refused before any communication.
TEST(CompressedAllreduce, NoneIsPlainAndBadArgumentsThrow) {
  run_ranks(2, true, [](Communicator& comm) {
    const size_t count = 3001;
    std::vector<float> x(count), plain(count);
    for (size_t i = 0; i < count; ++i) x[i] = plain[i] = input(comm.rank(), i);
    CompressedAllreduce none(comm, {});
    EXPECT_TRUE(none.allreduce(x.data(), count, ReduceOp::avg));
    comm.allreduce(plain.data(), count, DataType::f32, ReduceOp::avg);
    EXPECT_EQ(std::memcmp(x.data(), plain.data(), count * sizeof(float)), 0);
    EXPECT_EQ(none.stats().wire_bytes, count * 4);
    CompressedAllreduce fp16(comm, {Codec::fp16});
    EXPECT_THROW(fp16.allreduce(x.data(), count, ReduceOp::max), InvalidArgument);
    EXPECT_THROW(fp16.allreduce(nullptr, count, ReduceOp::sum), InvalidArgument);
    EXPECT_THROW(CompressedAllreduce(comm, {Codec::fp16, -1.0}), InvalidArgument);
    EXPECT_THROW(CompressedAllreduce(comm, {Codec::fp16, std::nan("")}), InvalidArgument);
    EXPECT_TRUE(fp16.allreduce(x.data(), 0, ReduceOp::sum));  // empty: still a collective on every rank
    // Growing buckets reuse then regrow the staging buffer.
    for (size_t n : {size_t(10), size_t(5000), size_t(7), size_t(20000)}) {
      std::vector<float> y(n, float(comm.rank() + 1));
      EXPECT_TRUE(fp16.allreduce(y.data(), n, ReduceOp::sum));
      EXPECT_EQ(y[n - 1], 3.0f);
    }
  });
}

}  // namespace
}  // namespace tandem::compression
