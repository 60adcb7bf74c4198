// Reduction kernels (comm/reduce): every ISA x dtype x op against
//  (1) the scalar functors, bit for bit (NaN results only need to be NaN: which
//      NaN payload survives a + b is not specified, and the compiler may swap
//      the operands of a commutative add), and
//  (2) an independent reference computed in long double / 64-bit integers.
//      Tolerance: integers exact (wrapping); float results within 1 ulp of the
//      reference rounded to the dtype. (In fact f32/f16/bf16 come out exact: a
//      wider format with >= 2p+2 bits rounds +,*,/ innocuously. f64 against an
//      80-bit reference can be off by one ulp through double rounding.)
// Plus the f16/bf16 conversions (exhaustive over all 65536 patterns), scale_avg
// rounding, integer wraparound, NaN/inf/-0 semantics and the public dispatcher.
#include "tandem/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "tandem/errors.h"
#include "tandem/reduce/functors.h"
#include "tandem/reduce/kernels.h"
#include "tandem/types.h"

namespace tandem {

// Readable parameter names in gtest output.
void PrintTo(DataType t, std::ostream* os) { *os << to_string(t); }
void PrintTo(ReduceOp op, std::ostream* os) { *os << to_string(op); }
namespace detail {
void PrintTo(Isa isa, std::ostream* os) { *os << to_string(isa); }
}  // namespace detail

namespace {

using detail::Isa;
using fn::bf16_t;
using fn::f16_t;

constexpr size_t kCounts[] = {0, 1, 7, 15, 16, 17, 31, 33, 64, 1000, 1027};

// ---- per-type helpers for the test (independent of the kernels) ----

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint64_t bits_of(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// f16 value straight from the definition: (-1)^s * 2^(e-15) * 1.m, or 2^-14 * 0.m.
long double decode_f16(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 0x1F) return m ? std::numeric_limits<long double>::quiet_NaN() : sign * HUGE_VALL;
  if (e == 0) return sign * std::ldexp(static_cast<long double>(m), -24);
  return sign * std::ldexp(static_cast<long double>(1024 + m), e - 25);
}

// Monotone integer image of a float's bit pattern, so ulp distance = difference.
int64_t ordinal(uint64_t bits, int width) {
  const uint64_t sign = uint64_t{1} << (width - 1);
  const int64_t mag = static_cast<int64_t>(bits & (sign - 1));
  return (bits & sign) ? -mag : mag;
}

template <class T>
struct Num;

template <>
struct Num<float> {
  static constexpr DataType dtype = DataType::f32;
  static constexpr bool is_float = true;
  static constexpr int width = 32;
  static long double value(float x) { return x; }
  static float from(long double v) { return static_cast<float>(v); }
  static uint64_t bits(float x) { return bits_of(x); }
  static bool is_nan(float x) { return std::isnan(x); }
};
template <>
struct Num<double> {
  static constexpr DataType dtype = DataType::f64;
  static constexpr bool is_float = true;
  static constexpr int width = 64;
  static long double value(double x) { return x; }
  static double from(long double v) { return static_cast<double>(v); }
  static uint64_t bits(double x) { return bits_of(x); }
  static bool is_nan(double x) { return std::isnan(x); }
};
template <>
struct Num<f16_t> {
  static constexpr DataType dtype = DataType::f16;
  static constexpr bool is_float = true;
  static constexpr int width = 16;
  static long double value(f16_t x) { return decode_f16(x.bits); }
  static f16_t from(long double v) { return f16_t{fn::f32_to_f16_bits(static_cast<float>(v))}; }
  static uint64_t bits(f16_t x) { return x.bits; }
  static bool is_nan(f16_t x) { return (x.bits & 0x7FFF) > 0x7C00; }
};
template <>
struct Num<bf16_t> {
  static constexpr DataType dtype = DataType::bf16;
  static constexpr bool is_float = true;
  static constexpr int width = 16;
  static long double value(bf16_t x) { return float_of(static_cast<uint32_t>(x.bits) << 16); }
  static bf16_t from(long double v) { return bf16_t{fn::f32_to_bf16_bits(static_cast<float>(v))}; }
  static uint64_t bits(bf16_t x) { return x.bits; }
  static bool is_nan(bf16_t x) { return (x.bits & 0x7FFF) > 0x7F80; }
};
template <class I, DataType D>
struct IntNum {
  static constexpr DataType dtype = D;
  static constexpr bool is_float = false;
  static constexpr int width = 8 * sizeof(I);
  static uint64_t bits(I x) {
    return static_cast<uint64_t>(x) & (width == 64 ? ~uint64_t{0} : (uint64_t{1} << width) - 1);
  }
  static bool is_nan(I) { return false; }
};
template <>
struct Num<int32_t> : IntNum<int32_t, DataType::i32> {};
template <>
struct Num<int64_t> : IntNum<int64_t, DataType::i64> {};
template <>
struct Num<uint8_t> : IntNum<uint8_t, DataType::u8> {};

// Calls f(T{}) for the storage type of dtype.
template <class F>
void with_type(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::f32: return f(float{});
    case DataType::f64: return f(double{});
    case DataType::f16: return f(f16_t{});
    case DataType::bf16: return f(bf16_t{});
    case DataType::i32: return f(int32_t{});
    case DataType::i64: return f(int64_t{});
    case DataType::u8: return f(uint8_t{});
  }
}

// Random inputs that exercise every class: mostly moderate values (so prod and
// sum round rather than overflow), some raw bit patterns (NaN, inf, subnormal,
// huge), some hand-picked specials.
template <class T>
std::vector<T> random_values(size_t n, std::mt19937_64& rng) {
  std::vector<T> v(n);
  std::uniform_int_distribution<uint64_t> any;
  std::uniform_int_distribution<int> pick(0, 19);
  for (T& x : v) {
    const uint64_t r = any(rng);
    const int kind = pick(rng);
    if constexpr (std::is_integral_v<T>) {
      // Half small (min/max ties, no wrap), half full range (wraparound).
      x = kind < 10 ? static_cast<T>(static_cast<int64_t>(r % 201) - 100) : static_cast<T>(r);
    } else {
      using Raw = std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>;
      const long double moderate =
          std::ldexp(static_cast<long double>(r % (1u << 20)) / (1u << 20) + 1.0L, static_cast<int>(r >> 60) - 8) *
          ((r >> 59) & 1 ? -1 : 1);
      const long double specials[] = {0.0L, -0.0L, HUGE_VALL, -HUGE_VALL, 1.0L, -1.0L, 1e-40L, 3e-8L};
      if (kind < 14) {
        x = Num<T>::from(moderate);
      } else if (kind < 18) {
        const Raw raw = static_cast<Raw>(r);
        std::memcpy(&x, &raw, sizeof(T));
      } else {
        x = Num<T>::from(specials[r % 8]);
      }
    }
  }
  return v;
}

// Independent reference for a op b.
template <class T>
T reference(ReduceOp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return static_cast<T>(ua + ub);  // modular, as C++20 defines the narrowing
      case ReduceOp::prod: return static_cast<T>(ua * ub);
      case ReduceOp::min: return std::min(a, b);
      case ReduceOp::max: return std::max(a, b);
    }
    return T{};
  } else {
    const long double x = Num<T>::value(a), y = Num<T>::value(b);
    long double r = 0;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: r = x + y; break;
      case ReduceOp::prod: r = x * y; break;
      case ReduceOp::min: r = (std::isnan(x) || std::isnan(y)) ? NAN : (y < x ? y : x); break;
      case ReduceOp::max: r = (std::isnan(x) || std::isnan(y)) ? NAN : (y > x ? y : x); break;
    }
    return Num<T>::from(r);
  }
}

// got == want bitwise, or both NaN.
template <class T>
bool same_bits(T got, T want) {
  return Num<T>::bits(got) == Num<T>::bits(want) || (Num<T>::is_nan(got) && Num<T>::is_nan(want));
}

// Within 1 ulp of the reference (exact for integers); NaN iff the reference is NaN.
template <class T>
bool near_reference(T got, T want) {
  if constexpr (std::is_integral_v<T>) {
    return got == want;
  } else {
    if (Num<T>::is_nan(got) || Num<T>::is_nan(want)) return Num<T>::is_nan(got) && Num<T>::is_nan(want);
    if (Num<T>::value(got) == Num<T>::value(want)) return true;  // includes -0 vs +0 on min/max ties
    const int64_t d = ordinal(Num<T>::bits(got), Num<T>::width) - ordinal(Num<T>::bits(want), Num<T>::width);
    return d >= -1 && d <= 1;
  }
}

template <class T>
std::string show(T x) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(+x);
  } else {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9Lg (0x%llx)", Num<T>::value(x),
                  static_cast<unsigned long long>(Num<T>::bits(x)));
    return buf;
  }
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : detail::kAllIsas) {
    if (detail::cpu_supports(isa)) out.push_back(isa);
  }
  return out;
}

// ---- reduce: ISA x dtype x op ----

enum class Alias { none, dst_is_a, dst_is_b };

using ReduceParam = std::tuple<Isa, DataType, ReduceOp>;

auto every_isa_dtype_op() {
  return ::testing::Combine(::testing::ValuesIn(detail::kAllIsas), ::testing::ValuesIn(kAllDataTypes),
                            ::testing::ValuesIn(kAllReduceOps));
}

std::string isa_dtype_op_name(const ::testing::TestParamInfo<ReduceParam>& info) {
  return std::string(detail::to_string(std::get<0>(info.param))) + "_" +
         std::string(to_string(std::get<1>(info.param))) + "_" + std::string(to_string(std::get<2>(info.param)));
}

class ReduceMatrix : public ::testing::TestWithParam<ReduceParam> {};

template <class T>
void check_reduce(Isa isa, ReduceOp op) {
  const auto& kernels = detail::kernel_table(isa);
  std::mt19937_64 rng(1234 + static_cast<int>(op));
  for (size_t count : kCounts) {
    for (size_t offset : {0, 1}) {  // offset 1: every pointer misaligned by one element
      for (Alias alias : {Alias::none, Alias::dst_is_a, Alias::dst_is_b}) {
        SCOPED_TRACE("count=" + std::to_string(count) + " offset=" + std::to_string(offset) +
                     " alias=" + std::to_string(static_cast<int>(alias)));
        const std::vector<T> a_buf = random_values<T>(count + offset, rng);
        const std::vector<T> b_buf = random_values<T>(count + offset, rng);
        const T* a = a_buf.data() + offset;
        const T* b = b_buf.data() + offset;

        std::vector<T> want(count);  // scalar functors
        reduce_scalar(Num<T>::dtype, op, want.data(), a, b, count);

        std::vector<T> out_buf = alias == Alias::dst_is_b ? b_buf : a_buf;
        T* out = out_buf.data() + offset;
        const T* in_a = alias == Alias::dst_is_a ? out : a;
        const T* in_b = alias == Alias::dst_is_b ? out : b;
        kernels.reduce(Num<T>::dtype, op, out, in_a, in_b, count);

        size_t failures = 0;
        for (size_t i = 0; i < count && failures < 5; ++i) {
          if (!same_bits(out[i], want[i])) {
            ADD_FAILURE() << "vs scalar at " << i << ": a=" << show(a[i]) << " b=" << show(b[i])
                          << " got=" << show(out[i]) << " scalar=" << show(want[i]);
            ++failures;
          }
          const T ref = reference(op, a[i], b[i]);
          if (!near_reference(out[i], ref)) {
            ADD_FAILURE() << "vs reference at " << i << ": a=" << show(a[i]) << " b=" << show(b[i])
                          << " got=" << show(out[i]) << " reference=" << show(ref);
            ++failures;
          }
        }
        // The element past the end (offset 0: none; offset 1: the prefix) is untouched.
        if (offset == 1) {
          const std::vector<T>& orig = alias == Alias::dst_is_b ? b_buf : a_buf;
          EXPECT_EQ(Num<T>::bits(out_buf[0]), Num<T>::bits(orig[0])) << "wrote before dst";
        }
        if (failures) return;
      }
    }
  }
}

TEST_P(ReduceMatrix, MatchesScalarAndReference) {
  const auto [isa, dtype, op] = GetParam();
  if (!detail::cpu_supports(isa)) GTEST_SKIP() << "CPU lacks " << detail::to_string(isa);
  with_type(dtype, [&](auto t) { check_reduce<decltype(t)>(isa, op); });
}

INSTANTIATE_TEST_SUITE_P(All, ReduceMatrix, every_isa_dtype_op(), isa_dtype_op_name);

// ---- reduce_many: ISA x dtype x op, against the chain of scalar reduces ----

class ReduceManyMatrix : public ::testing::TestWithParam<ReduceParam> {};

// Every source count from 2 to 9, every count of kCounts (the vector loop's
// blocks and tails) and more, misaligned by one element, and dst aliasing each source
// in turn: the bits of reduce_scalar(dst, s0, s1), then (dst, dst, s2), ...
template <class T>
void check_reduce_many(Isa isa, ReduceOp op) {
  const auto& kernels = detail::kernel_table(isa);
  std::mt19937_64 rng(99 + static_cast<int>(op));
  std::vector<size_t> counts(std::begin(kCounts), std::end(kCounts));
  counts.push_back(5003);  // the scalar loop's aliased blocks of 2048, and a tail
  for (size_t k = 2; k <= 9; ++k) {
    for (size_t count : counts) {
      std::vector<std::vector<T>> bufs;
      for (size_t j = 0; j < k; ++j) bufs.push_back(random_values<T>(count + 1, rng));
      std::vector<T> want(count);
      reduce_scalar(Num<T>::dtype, op, want.data(), bufs[0].data() + 1, bufs[1].data() + 1, count);
      for (size_t j = 2; j < k; ++j)
        reduce_scalar(Num<T>::dtype, op, want.data(), want.data(), bufs[j].data() + 1, count);
      for (size_t alias = 0; alias <= k; ++alias) {  // k: dst apart from every source
        SCOPED_TRACE("k=" + std::to_string(k) + " count=" + std::to_string(count) + " alias=" + std::to_string(alias));
        std::vector<std::vector<T>> in = bufs;
        std::vector<T> apart(count + 1);
        T* dst = alias < k ? in[alias].data() + 1 : apart.data() + 1;
        std::vector<const void*> sources;
        for (size_t j = 0; j < k; ++j) sources.push_back(in[j].data() + 1);
        kernels.reduce_many(Num<T>::dtype, op, dst, sources.data(), k, count);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(same_bits(dst[i], want[i]))
              << "at " << i << ": got " << show(dst[i]) << " chain " << show(want[i]);
        }
        const T& before = alias < k ? in[alias][0] : apart[0];
        const T& was = alias < k ? bufs[alias][0] : T{};
        EXPECT_EQ(Num<T>::bits(before), Num<T>::bits(was)) << "wrote before dst";
      }
    }
  }
}

TEST_P(ReduceManyMatrix, MatchesTheChainOfScalarReduces) {
  const auto [isa, dtype, op] = GetParam();
  if (!detail::cpu_supports(isa)) GTEST_SKIP() << "CPU lacks " << detail::to_string(isa);
  with_type(dtype, [&](auto t) { check_reduce_many<decltype(t)>(isa, op); });
}

INSTANTIATE_TEST_SUITE_P(All, ReduceManyMatrix, every_isa_dtype_op(), isa_dtype_op_name);

// ---- scale_avg: ISA x dtype ----

using ScaleParam = std::tuple<Isa, DataType>;
class ScaleAvgMatrix : public ::testing::TestWithParam<ScaleParam> {};

template <class T>
void check_scale_avg(Isa isa) {
  const auto& kernels = detail::kernel_table(isa);
  std::mt19937_64 rng(99);
  for (int divisor : {1, 2, 3, 7, 8, 1000}) {
    for (size_t count : kCounts) {
      SCOPED_TRACE("divisor=" + std::to_string(divisor) + " count=" + std::to_string(count));
      const std::vector<T> in_buf = random_values<T>(count + 1, rng);
      std::vector<T> buf = in_buf;
      T* data = buf.data() + 1;  // misaligned
      kernels.scale_avg(Num<T>::dtype, data, count, divisor);
      const fn::AvgDiv div{divisor};
      for (size_t i = 0; i < count; ++i) {
        const T x = in_buf[i + 1];
        ASSERT_TRUE(same_bits(data[i], div(x))) << "x=" << show(x) << " got=" << show(data[i]);
        if constexpr (std::is_integral_v<T>) {
          ASSERT_EQ(data[i], static_cast<T>(static_cast<int64_t>(x) / divisor));
        } else {
          ASSERT_TRUE(near_reference(data[i], Num<T>::from(Num<T>::value(x) / divisor)))
              << "x=" << show(x) << " got=" << show(data[i]);
        }
      }
    }
  }
}

TEST_P(ScaleAvgMatrix, MatchesFunctorAndReference) {
  const auto [isa, dtype] = GetParam();
  if (!detail::cpu_supports(isa)) GTEST_SKIP() << "CPU lacks " << detail::to_string(isa);
  with_type(dtype, [&](auto t) { check_scale_avg<decltype(t)>(isa); });
}

INSTANTIATE_TEST_SUITE_P(All, ScaleAvgMatrix,
                         ::testing::Combine(::testing::ValuesIn(detail::kAllIsas), ::testing::ValuesIn(kAllDataTypes)),
                         [](const ::testing::TestParamInfo<ScaleParam>& info) {
                           return std::string(detail::to_string(std::get<0>(info.param))) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

TEST(ScaleAvg, IntegersTruncateTowardZero) {
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(detail::to_string(isa)));
    std::vector<int32_t> v = {
        7, -7, 8, -8, 1, -1, 0, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), -5,
        5, -9, 9, -2, 2, 3,  -3};
    detail::kernel_table(isa).scale_avg(DataType::i32, v.data(), v.size(), 4);
    const std::vector<int32_t> want = {1, -1, 2, -2, 0, 0, 0, -536870912, 536870911, -1, 1, -2, 2, 0, 0, 0, 0};
    EXPECT_EQ(v, want);

    std::vector<int64_t> w = {-7, 7, std::numeric_limits<int64_t>::min(), -1};
    detail::kernel_table(isa).scale_avg(DataType::i64, w.data(), w.size(), 2);
    EXPECT_EQ(w, (std::vector<int64_t>{-3, 3, std::numeric_limits<int64_t>::min() / 2, 0}));

    std::vector<uint8_t> u = {255, 254, 3, 0};
    detail::kernel_table(isa).scale_avg(DataType::u8, u.data(), u.size(), 4);
    EXPECT_EQ(u, (std::vector<uint8_t>{63, 63, 0, 0}));
    u = {255, 200};
    detail::kernel_table(isa).scale_avg(DataType::u8, u.data(), u.size(), 300);  // divisor wider than u8
    EXPECT_EQ(u, (std::vector<uint8_t>{0, 0}));
  }
}

TEST(ScaleAvg, FloatsUseTrueDivision) {
  // x / 3 and x * (1/3.f) differ for some x; true division must win everywhere.
  std::vector<float> xs(4096);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = 1.0f + static_cast<float>(i) / 4096.0f;
  size_t differs_from_reciprocal = 0;
  for (float x : xs) differs_from_reciprocal += (x / 3.0f != x * (1.0f / 3.0f));
  ASSERT_GT(differs_from_reciprocal, 0u) << "test data does not separate division from reciprocal";
  for (Isa isa : supported_isas()) {
    std::vector<float> v = xs;
    detail::kernel_table(isa).scale_avg(DataType::f32, v.data(), v.size(), 3);
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(bits_of(v[i]), bits_of(xs[i] / 3.0f)) << detail::to_string(isa);
  }
  // f16 divides in f32 and rounds once more: 1.0 / 3 -> 0x3555 (0.33325).
  uint16_t h = 0x3C00;
  scale_avg(DataType::f16, &h, 1, 3);
  EXPECT_EQ(h, 0x3555);
}

TEST(ScaleAvg, RejectsNonPositiveDivisor) {
  float x = 1;
  EXPECT_THROW(scale_avg(DataType::f32, &x, 1, 0), InvalidArgument);
  EXPECT_THROW(scale_avg(DataType::f32, &x, 1, -2), InvalidArgument);
}

// ---- integer wraparound and float special values, on every ISA ----

template <class T>
std::vector<T> run(Isa isa, ReduceOp op, const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> out(a.size());
  detail::kernel_table(isa).reduce(Num<T>::dtype, op, out.data(), a.data(), b.data(), a.size());
  return out;
}

// Repeats a pattern to 40 elements so both the vector body and the tail see it.
template <class T>
std::vector<T> tile(std::vector<T> v) {
  const size_t n = v.size();
  while (v.size() < 40) v.push_back(v[v.size() % n]);
  return v;
}

TEST(Reduce, IntegerWraparound) {
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(detail::to_string(isa)));
    constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max(), kMin32 = std::numeric_limits<int32_t>::min();
    auto s32 = run(isa, ReduceOp::sum, tile<int32_t>({kMax32, kMin32, -1}), tile<int32_t>({1, -1, kMin32}));
    EXPECT_EQ(s32[0], kMin32);
    EXPECT_EQ(s32[1], kMax32);
    EXPECT_EQ(s32[2], kMax32);
    auto p32 = run(isa, ReduceOp::prod, tile<int32_t>({65536, kMin32, 3}), tile<int32_t>({65536, -1, -5}));
    EXPECT_EQ(p32[0], 0);
    EXPECT_EQ(p32[1], kMin32);
    EXPECT_EQ(p32[2], -15);

    constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max(), kMin64 = std::numeric_limits<int64_t>::min();
    auto s64 = run(isa, ReduceOp::sum, tile<int64_t>({kMax64, kMin64}), tile<int64_t>({1, -1}));
    EXPECT_EQ(s64[0], kMin64);
    EXPECT_EQ(s64[1], kMax64);
    auto p64 = run(isa, ReduceOp::prod, tile<int64_t>({int64_t{1} << 32, 0x123456789LL, -3}),
                   tile<int64_t>({int64_t{1} << 32, 0x987654321LL, 7}));
    EXPECT_EQ(p64[0], 0);
    EXPECT_EQ(static_cast<uint64_t>(p64[1]), uint64_t{0x123456789} * uint64_t{0x987654321});
    EXPECT_EQ(p64[2], -21);
    auto m64 = run(isa, ReduceOp::min, tile<int64_t>({kMax64, -1}), tile<int64_t>({kMin64, 1}));
    EXPECT_EQ(m64[0], kMin64);
    EXPECT_EQ(m64[1], -1);

    auto s8 = run(isa, ReduceOp::sum, tile<uint8_t>({200, 255}), tile<uint8_t>({100, 1}));
    EXPECT_EQ(s8[0], 44);
    EXPECT_EQ(s8[1], 0);
    auto p8 = run(isa, ReduceOp::prod, tile<uint8_t>({16, 255, 3}), tile<uint8_t>({16, 255, 5}));
    EXPECT_EQ(p8[0], 0);
    EXPECT_EQ(p8[1], 1);  // 65025 mod 256
    EXPECT_EQ(p8[2], 15);
    auto x8 = run(isa, ReduceOp::max, tile<uint8_t>({200, 0}), tile<uint8_t>({100, 255}));
    EXPECT_EQ(x8[0], 200);  // unsigned compare
    EXPECT_EQ(x8[1], 255);
  }
}

TEST(Reduce, FloatNaNPropagatesAndSignedZeroTies) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = HUGE_VALF;
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(detail::to_string(isa)));
    const auto a = tile<float>({nan, 1.0f, nan, -0.0f, 0.0f, inf, inf, 2.0f});
    const auto b = tile<float>({1.0f, nan, nan, 0.0f, -0.0f, -inf, 1.0f, -inf});
    const auto mn = run(isa, ReduceOp::min, a, b);
    const auto mx = run(isa, ReduceOp::max, a, b);
    const auto sm = run(isa, ReduceOp::sum, a, b);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(std::isnan(mn[i])) << i;
      EXPECT_TRUE(std::isnan(mx[i])) << i;
      EXPECT_TRUE(std::isnan(sm[i])) << i;
    }
    // Ties between zeros return the second operand (documented in functors.h).
    EXPECT_EQ(bits_of(mn[3]), bits_of(0.0f));
    EXPECT_EQ(bits_of(mn[4]), bits_of(-0.0f));
    EXPECT_EQ(bits_of(mx[3]), bits_of(0.0f));
    EXPECT_TRUE(std::isnan(sm[5]));  // inf + -inf
    EXPECT_EQ(mn[5], -inf);
    EXPECT_EQ(mx[6], inf);
    EXPECT_EQ(mn[7], -inf);
    const auto scalar_mn = run(Isa::scalar, ReduceOp::min, a, b);
    for (size_t i = 0; i < mn.size(); ++i) EXPECT_TRUE(same_bits(mn[i], scalar_mn[i])) << i;
  }
}

TEST(Reduce, HalfPrecisionNaNAndInfinity) {
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(detail::to_string(isa)));
    // f16: 65504 + 65504 overflows to inf; NaN in either input gives NaN; max(NaN, x) is NaN.
    const auto a = tile<f16_t>({{0x7BFF}, {0x7E00}, {0x3C00}, {0x0001}});
    const auto b = tile<f16_t>({{0x7BFF}, {0x3C00}, {0x7D00}, {0x0001}});
    const auto s = run(isa, ReduceOp::sum, a, b);
    EXPECT_EQ(s[0].bits, 0x7C00);
    EXPECT_TRUE(Num<f16_t>::is_nan(s[1]));
    EXPECT_TRUE(Num<f16_t>::is_nan(s[2]));
    EXPECT_EQ(s[3].bits, 0x0002);  // subnormal + subnormal, exact
    const auto m = run(isa, ReduceOp::max, a, b);
    EXPECT_EQ(m[1].bits, 0x7E00);
    EXPECT_EQ(m[2].bits, 0x7F00);  // signalling NaN comes back quiet

    // bf16: 1 + 2^-8 is a tie between 1 and 1+2^-7: rounds to even (1.0).
    const auto c = tile<bf16_t>({{0x3F80}, {0x7F7F}, {0xFFC1}});
    const auto d = tile<bf16_t>({{0x3B80}, {0x7F7F}, {0x3F80}});
    const auto t = run(isa, ReduceOp::sum, c, d);
    EXPECT_EQ(t[0].bits, 0x3F80);
    EXPECT_EQ(t[1].bits, 0x7F80);  // max finite * 2 -> inf
    EXPECT_EQ(t[2].bits, 0xFFC1);  // NaN payload kept
  }
}

// ---- conversions ----

TEST(Convert, F16AllPatternsRoundTrip) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(detail::to_string(isa)));
    const auto& k = detail::kernel_table(isa);
    std::vector<float> wide(all.size());
    std::vector<uint16_t> back(all.size());
    k.f16_to_f32(all.data(), wide.data(), all.size());
    k.f32_to_f16(wide.data(), back.data(), all.size());
    for (uint32_t i = 0; i < 65536; ++i) {
      const long double want = decode_f16(static_cast<uint16_t>(i));
      const bool nan = (i & 0x7FFF) > 0x7C00;
      if (nan) {
        ASSERT_TRUE(std::isnan(wide[i])) << std::hex << i;
        // Quietened, sign and payload kept.
        ASSERT_EQ(bits_of(wide[i]), ((i & 0x8000u) << 16) | 0x7FC00000u | ((i & 0x3FFu) << 13)) << std::hex << i;
        ASSERT_EQ(back[i], i | 0x200u) << std::hex << i;
      } else {
        ASSERT_EQ(static_cast<long double>(wide[i]), want) << std::hex << i;
        ASSERT_EQ(std::signbit(wide[i]), (i & 0x8000) != 0) << std::hex << i;
        ASSERT_EQ(back[i], i) << std::hex << i;
      }
    }
  }
}

TEST(Convert, Bf16AllPatternsRoundTrip) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(std::string(detail::to_string(isa)));
    const auto& k = detail::kernel_table(isa);
    std::vector<float> wide(all.size());
    std::vector<uint16_t> back(all.size());
    k.bf16_to_f32(all.data(), wide.data(), all.size());
    k.f32_to_bf16(wide.data(), back.data(), all.size());
    for (uint32_t i = 0; i < 65536; ++i) {
      ASSERT_EQ(bits_of(wide[i]), i << 16) << std::hex << i;  // widening is exact, NaN included
      const bool nan = (i & 0x7FFF) > 0x7F80;
      ASSERT_EQ(back[i], nan ? (i | 0x40u) : i) << std::hex << i;
    }
  }
}

// Midpoints between neighbouring finite values round to the even one; a hair
// above/below rounds away/toward. Midpoints are exact in f32 for both formats.
TEST(Convert, MidpointsRoundToNearestEven) {
  for (uint32_t h = 0; h < 0x7BFF; ++h) {  // positive finite f16 pairs (h, h+1)
    const long double lo = decode_f16(static_cast<uint16_t>(h)), hi = decode_f16(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<long double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(fn::f32_to_f16_bits(mid), even) << std::hex << h;
    ASSERT_EQ(fn::f32_to_f16_bits(-mid), even | 0x8000) << std::hex << h;
    ASSERT_EQ(fn::f32_to_f16_bits(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    ASSERT_EQ(fn::f32_to_f16_bits(std::nextafter(mid, HUGE_VALF)), h + 1) << std::hex << h;
  }
  for (uint32_t h = 0; h < 0x7F7F; ++h) {  // positive finite bf16 pairs
    const float lo = float_of(h << 16), hi = float_of((h + 1) << 16);
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(fn::f32_to_bf16_bits(mid), even) << std::hex << h;
    ASSERT_EQ(fn::f32_to_bf16_bits(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    ASSERT_EQ(fn::f32_to_bf16_bits(std::nextafter(mid, HUGE_VALF)), h + 1) << std::hex << h;
  }
}

TEST(Convert, F32ToF16SpecialValues) {
  struct Case {
    float in;
    uint16_t want;
  };
  const Case cases[] = {
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {1.0f, 0x3C00},
      {65504.0f, 0x7BFF},
      {65519.99f, 0x7BFF},
      {65520.0f, 0x7C00},  // tie between max finite (odd) and 2^16: rounds to inf
      {1e10f, 0x7C00},
      {-1e10f, 0xFC00},
      {HUGE_VALF, 0x7C00},
      {-HUGE_VALF, 0xFC00},
      {std::ldexp(1.0f, -24), 0x0001},  // smallest subnormal
      {std::ldexp(1.0f, -25), 0x0000},  // tie with zero: even
      {std::ldexp(1.5f, -25), 0x0001},
      {std::ldexp(3.0f, -25), 0x0002},     // tie 1.5 units: even (2)
      {std::ldexp(1023.0f, -24), 0x03FF},  // largest subnormal
      {std::ldexp(1.0f, -14), 0x0400},     // smallest normal
      {std::ldexp(2047.0f, -25), 0x0400},  // tie: largest subnormal (odd) -> smallest normal
      {1e-40f, 0x0000},                    // f32 subnormal
      {float_of(0x7FC00000), 0x7E00},      // quiet NaN
      {float_of(0x7F800001), 0x7E00},      // signalling NaN becomes quiet
      {float_of(0xFFC02000), 0xFE01},      // payload and sign kept
  };
  for (Isa isa : supported_isas()) {
    for (const Case& c : cases) {
      std::vector<float> in(40, c.in);  // vector body and tail
      std::vector<uint16_t> out(in.size());
      detail::kernel_table(isa).f32_to_f16(in.data(), out.data(), in.size());
      EXPECT_EQ(out[0], c.want) << detail::to_string(isa) << " in=" << std::hexfloat << c.in;
      EXPECT_EQ(out[39], c.want) << detail::to_string(isa) << " tail in=" << std::hexfloat << c.in;
    }
  }
}

TEST(Convert, F32ToBf16SpecialValues) {
  struct Case {
    uint32_t in;
    uint16_t want;
  };
  const Case cases[] = {
      {0x00000000, 0x0000}, {0x80000000, 0x8000}, {0x3F800000, 0x3F80}, {0x3F808000, 0x3F80},  // tie, even stays
      {0x3F818000, 0x3F82},                                                                    // tie, odd rounds up
      {0x3F808001, 0x3F81},                                                                    // just above the tie
      {0x7F7FFFFF, 0x7F80},                                                                    // max f32 rounds to inf
      {0x7F800000, 0x7F80}, {0xFF800000, 0xFF80}, {0x00000001, 0x0000},  // tiny subnormal rounds to zero
      {0x00018000, 0x0002},                                              // subnormal tie, odd rounds up
      {0x7FC00000, 0x7FC0}, {0x7F800001, 0x7FC0},                        // signalling NaN becomes quiet
      {0xFFFF0000, 0xFFFF},  // NaN whose low bits would carry: no overflow into sign
  };
  for (Isa isa : supported_isas()) {
    for (const Case& c : cases) {
      std::vector<float> in(40, float_of(c.in));
      std::vector<uint16_t> out(in.size());
      detail::kernel_table(isa).f32_to_bf16(in.data(), out.data(), in.size());
      EXPECT_EQ(out[0], c.want) << detail::to_string(isa) << " in=0x" << std::hex << c.in;
      EXPECT_EQ(out[39], c.want) << detail::to_string(isa) << " tail in=0x" << std::hex << c.in;
    }
  }
}

// Random f32 bit patterns (every class, NaN payloads included): every ISA
// narrows exactly like the scalar functors, so F16C agrees with fn::f32_to_f16_bits.
TEST(Convert, RandomPatternsMatchScalar) {
  std::mt19937 rng(7);
  std::vector<float> in(1 << 20);
  for (float& x : in) x = float_of(rng());
  std::vector<uint16_t> want16(in.size()), wantb(in.size());
  detail::kScalarKernels.f32_to_f16(in.data(), want16.data(), in.size());
  detail::kScalarKernels.f32_to_bf16(in.data(), wantb.data(), in.size());
  for (Isa isa : supported_isas()) {
    std::vector<uint16_t> got(in.size());
    detail::kernel_table(isa).f32_to_f16(in.data() + 1, got.data() + 1, in.size() - 1);
    for (size_t i = 1; i < in.size(); ++i) {
      ASSERT_EQ(got[i], want16[i]) << detail::to_string(isa) << " f16 in=0x" << std::hex << bits_of(in[i]);
    }
    detail::kernel_table(isa).f32_to_bf16(in.data() + 1, got.data() + 1, in.size() - 1);
    for (size_t i = 1; i < in.size(); ++i) {
      ASSERT_EQ(got[i], wantb[i]) << detail::to_string(isa) << " bf16 in=0x" << std::hex << bits_of(in[i]);
    }
  }
}

TEST(Convert, PublicEntryPointsCountZeroAndTail) {
  const float in[3] = {1.0f, -2.0f, 0.5f};
  uint16_t h[3] = {0, 0, 0};
  f32_to_f16(in, h, 0);
  EXPECT_EQ(h[0], 0);
  f32_to_f16(in, h, 3);
  EXPECT_EQ(h[1], 0xC000);
  float back[3];
  f16_to_f32(h, back, 3);
  EXPECT_EQ(back[2], 0.5f);
  f32_to_bf16(in, h, 3);
  EXPECT_EQ(h[0], 0x3F80);
  bf16_to_f32(h, back, 3);
  EXPECT_EQ(back[1], -2.0f);
}

// ---- dispatcher and public API ----

TEST(Dispatch, PicksASupportedIsa) {
  const std::string_view name = reduce_isa();
  const auto isa = detail::parse_isa(name);
  ASSERT_TRUE(isa.has_value()) << name;
  EXPECT_TRUE(detail::cpu_supports(*isa));
  EXPECT_EQ(*isa, detail::active_isa());
  if (const char* env = std::getenv("TANDEM_REDUCE_ISA")) {
    if (auto forced = detail::parse_isa(env)) {
      EXPECT_LE(*isa, *forced);
    }
  } else {
    // Without an override, the best ISA the CPU has.
    for (Isa better : detail::kAllIsas) {
      if (better > *isa) {
        EXPECT_FALSE(detail::cpu_supports(better)) << detail::to_string(better);
      }
    }
  }
}

TEST(Dispatch, PublicReduceMatchesScalar) {
  std::mt19937_64 rng(5);
  const auto a = random_values<float>(1027, rng), b = random_values<float>(1027, rng);
  std::vector<float> got(a.size()), want(a.size());
  reduce(DataType::f32, ReduceOp::sum, got.data(), a.data(), b.data(), a.size());
  reduce_scalar(DataType::f32, ReduceOp::sum, want.data(), a.data(), b.data(), a.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(same_bits(got[i], want[i])) << i;
}

TEST(Dispatch, RejectsBadArguments) {
  float x = 0;
  EXPECT_THROW(reduce(static_cast<DataType>(99), ReduceOp::sum, &x, &x, &x, 1), InvalidArgument);
  EXPECT_THROW(reduce(DataType::f32, static_cast<ReduceOp>(99), &x, &x, &x, 1), InvalidArgument);
  EXPECT_THROW(reduce(DataType::f32, ReduceOp::sum, nullptr, &x, &x, 1), InvalidArgument);
  EXPECT_NO_THROW(reduce(DataType::f32, ReduceOp::sum, nullptr, nullptr, nullptr, 0));
  const void* one[] = {&x};
  EXPECT_THROW(reduce_many(DataType::f32, ReduceOp::sum, &x, one, 1, 1), InvalidArgument);
  EXPECT_THROW(reduce_many(DataType::f32, ReduceOp::sum, &x, nullptr, 2, 1), InvalidArgument);
  const void* with_null[] = {&x, nullptr};
  EXPECT_THROW(reduce_many(DataType::f32, ReduceOp::sum, &x, with_null, 2, 1), InvalidArgument);
}

// ---- host copies ----

// Both host copies at every alignment of source and destination within a
// line, lengths around a line and past pieces: the bytes in [dst, dst + n)
// are the source's, the guard bytes around them untouched.
TEST(Copy, HostCopiesMatchTheSourceAtEveryAlignment) {
  std::vector<unsigned char> src(80000), dst(80000 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (int streaming = 0; streaming < 2; ++streaming) {
    for (size_t n : {0, 1, 15, 63, 64, 65, 4113, 70001}) {
      for (size_t d_off = 0; d_off < 64; d_off += 7) {
        for (size_t s_off : {0, 5, 16, 63}) {
          std::fill(dst.begin(), dst.end(), 0xEE);
          unsigned char* d = dst.data() + 64 + d_off;
          if (streaming) {
            copy_streaming(d, src.data() + s_off, n);
          } else {
            copy(MemoryType::host, d, src.data() + s_off, n);
          }
          ASSERT_EQ(std::memcmp(d, src.data() + s_off, n), 0) << "streaming " << streaming << " n " << n;
          for (unsigned char* g = dst.data(); g < d; ++g) ASSERT_EQ(*g, 0xEE);
          for (unsigned char* g = d + n; g < dst.data() + dst.size(); ++g) ASSERT_EQ(*g, 0xEE);
        }
      }
    }
  }
}

// ---- types.cc ----

TEST(Types, NamesRoundTrip) {
  for (DataType t : kAllDataTypes) {
    EXPECT_EQ(parse_dtype(to_string(t)), t);
    EXPECT_GT(dtype_size(t), 0u);
  }
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(parse_reduce_op(to_string(op)), op);
  EXPECT_EQ(dtype_size(DataType::bf16), 2u);
  EXPECT_EQ(dtype_size(DataType::i64), 8u);
}

TEST(Types, ParsesAliases) {
  const std::pair<const char*, DataType> aliases[] = {
      {"float", DataType::f32}, {"float32", DataType::f32}, {"double", DataType::f64},    {"float64", DataType::f64},
      {"half", DataType::f16},  {"float16", DataType::f16}, {"bfloat16", DataType::bf16}, {"int", DataType::i32},
      {"int32", DataType::i32}, {"int64", DataType::i64},   {"uint8", DataType::u8},      {"FLOAT", DataType::f32},
  };
  for (const auto& [name, t] : aliases) EXPECT_EQ(parse_dtype(name), t) << name;
  EXPECT_EQ(parse_dtype("int8"), std::nullopt);  // no signed 8-bit type
  EXPECT_EQ(parse_dtype(""), std::nullopt);
  EXPECT_EQ(parse_dtype("f33"), std::nullopt);
  EXPECT_EQ(parse_reduce_op("MAX"), ReduceOp::max);
  EXPECT_EQ(parse_reduce_op("mean"), std::nullopt);
}

}  // namespace
}  // namespace tandem
