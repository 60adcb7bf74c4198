// Element-wise arithmetic shared by every reduction path: the scalar CPU
// kernels, the SIMD kernels' tails and the CUDA kernels. Because the CUDA
// kernels use exactly these functors, the CPU tests cover their arithmetic.
//
// Must stay C++17 and free of host-only library calls (nvcc compiles it too).
//
// Semantics (the SIMD paths reproduce them bit for bit):
//  - f16/bf16 are widened to f32 exactly, combined in f32 and rounded back to
//    nearest-even. Narrowing turns any NaN into a quiet NaN with the sign and
//    the top payload bits kept (what F16C's vcvtps2ph does); f16 widening also
//    quietens NaN (as vcvtph2ps does); bf16 widening is the exact 16-bit shift.
//  - Integer sum/prod wrap modulo 2^bits (computed in the unsigned type: no UB).
//  - Float min/max propagate NaN like torch: if a is NaN the result is a,
//    else if b is NaN the result is b. Otherwise min = (a < b ? a : b) and
//    max = (a > b ? a : b), so min(-0, +0) = +0 and min(+0, -0) = -0 (the
//    second operand wins ties), which is exactly what minps/maxps do.
//  - avg combines as sum; the division happens once in scale_avg (AvgDiv).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TANDEM_HOST_DEVICE __attribute__((always_inline)) inline
#endif

namespace tandem::fn {

// Each ISA translation unit includes this header with different -m flags. The
// inline namespace gives its copies of these inline functions distinct names,
// so the linker can never pick an AVX-512 build of a helper for the scalar path.
#if defined(__AVX512F__)
inline namespace isa_avx512 {
#elif defined(__AVX2__)
inline namespace isa_avx2 {
#else
inline namespace isa_base {
#endif

// Storage types of the 16-bit floats: distinct types so overloads can tell them apart.
struct f16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

TANDEM_HOST_DEVICE uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

TANDEM_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// ---- f16 <-> f32, integer-only so FTZ/DAZ modes cannot change the result ----
// (On the GPU, non-NaN values take the hardware conversion, which gives the
// same bits and keeps the f16 kernels at memory speed; tests/gpu checks it.)

TANDEM_HOST_DEVICE uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7FFFFFFFu;
#if defined(__CUDA_ARCH__)
  // The GPU's conversion rounds to nearest-even as below; only its NaN (canonical) differs.
  if (abs <= 0x7F800000u) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
  }
#endif
  if (abs >= 0x7F800000u) {  // inf stays inf; NaN becomes quiet, keeping the top payload bits
    return static_cast<uint16_t>(abs == 0x7F800000u ? sign | 0x7C00u : sign | 0x7E00u | ((abs >> 13) & 0x3FFu));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {                                               // below 2^-14: f16 subnormal or zero
    if (abs <= 0x33000000u) return static_cast<uint16_t>(sign);          // <= 2^-25 (a tie) rounds to zero
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // in [14, 24]: value / 2^-24 = mant >> shift
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;  // may carry into the smallest normal: fine
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias the exponent, then round the 13 dropped bits to nearest-even.
  // A carry out of the mantissa bumps the exponent, up to inf, which is right.
  const uint32_t odd = (abs >> 13) & 1u;
  const uint32_t r = abs - ((127u - 15u) << 23) + 0xFFFu + odd;
  return static_cast<uint16_t>(sign | (r >> 13));
}

TANDEM_HOST_DEVICE float f16_bits_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  if ((h & 0x7FFFu) <= 0x7C00u) {  // exact on the GPU too; NaN takes the path below
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
#endif
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1Fu) {  // inf, or NaN made quiet
    return bits_float(sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  }
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    exp = 1;  // subnormal: normalise so the implicit bit is set
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3FFu;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));  // 112 = 127 - 15
}

// ---- bf16 <-> f32 ----

TANDEM_HOST_DEVICE uint16_t f32_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  // Round to nearest-even: add 0x7FFF plus the lsb of the kept half, then truncate.
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

TANDEM_HOST_DEVICE float bf16_bits_to_f32(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// ---- widening to the type arithmetic happens in ----

template <class T>
struct Arith {  // f32, f64 and integers compute in their own type
  using type = T;
  TANDEM_HOST_DEVICE static T widen(T x) { return x; }
  TANDEM_HOST_DEVICE static T narrow(T x) { return x; }
};
template <>
struct Arith<f16_t> {
  using type = float;
  TANDEM_HOST_DEVICE static float widen(f16_t x) { return f16_bits_to_f32(x.bits); }
  TANDEM_HOST_DEVICE static f16_t narrow(float x) { return f16_t{f32_to_f16_bits(x)}; }
};
template <>
struct Arith<bf16_t> {
  using type = float;
  TANDEM_HOST_DEVICE static float widen(bf16_t x) { return bf16_bits_to_f32(x.bits); }
  TANDEM_HOST_DEVICE static bf16_t narrow(float x) { return bf16_t{f32_to_bf16_bits(x)}; }
};

template <class T>
TANDEM_HOST_DEVICE bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return x != x;
  } else {
    return false;
  }
}

// ---- binary operations on the arithmetic type ----

struct SumOp {
  template <class C>
  TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      using U = std::make_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <class C>
  TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      // Promote at least to unsigned int so u8*u8 is not done in (signed) int.
      using U = std::common_type_t<std::make_unsigned_t<C>, unsigned int>;
      return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
};

struct MinOp {
  template <class C>
  TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if (is_nan(a)) return a;
    return a < b ? a : b;  // b NaN -> b
  }
};

struct MaxOp {
  template <class C>
  TANDEM_HOST_DEVICE C operator()(C a, C b) const {
    if (is_nan(a)) return a;
    return a > b ? a : b;  // b NaN -> b
  }
};

// dst = a op b on storage type T: widen, combine, narrow.
template <class Op>
struct Elementwise {
  template <class T>
  TANDEM_HOST_DEVICE T operator()(T a, T b) const {
    using A = Arith<T>;
    return A::narrow(Op{}(A::widen(a), A::widen(b)));
  }
};

using Sum = Elementwise<SumOp>;
using Prod = Elementwise<ProdOp>;
using Min = Elementwise<MinOp>;
using Max = Elementwise<MaxOp>;

// Final division of avg: true division (the correctly rounded quotient) in f32
// for f32/f16/bf16, in f64 for f64; integers truncate toward zero. divisor > 0.
struct AvgDiv {
  int divisor;

  template <class T>
  TANDEM_HOST_DEVICE T operator()(T x) const {
    using A = Arith<T>;
    using C = typename A::type;
    if constexpr (std::is_integral_v<C>) {
      // In int64 so a divisor larger than the type (e.g. u8) is still exact.
      return static_cast<T>(static_cast<int64_t>(x) / static_cast<int64_t>(divisor));
    } else {
      return A::narrow(A::widen(x) / static_cast<C>(divisor));
    }
  }
};

}  // inline namespace
}  // namespace tandem::fn
