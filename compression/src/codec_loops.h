// Generic codec loops shared by the scalar, AVX2 and AVX-512 kernels. Each
// ISA supplies lane traits per 16-bit format:
//
//   struct Lanes {
//     using T = fn::f16_t or fn::bf16_t;   // storage element
//     using V = ...;                       // W f32 lanes
//     using H = ...;                       // W 16-bit lanes
//     static constexpr size_t W = ...;
//     static V load(const float*); static void store(float*, V);       // unaligned
//     static H load16(const T*);   static void store16(T*, H);         // unaligned
//     static V mul(V, V); static V add(V, V); static V sub(V, V); static V splat(float);
//     static H narrow(V);          // round to nearest-even, as fn::Arith<T>::narrow
//     static V widen(H);           // exact, as fn::Arith<T>::widen
//   };
//
// Tails use the scalar functors (codec_functors.h), which compute the same bits.
// Unnamed namespace: each ISA's translation unit gets its own copies.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "codec_functors.h"
#include "codec_kernels.h"

namespace tandem::codec {
namespace {

template <class L>
void encode_loop(const float* src, uint16_t* dst_bits, size_t n, float scale) {
  using T = typename L::T;
  T* dst = reinterpret_cast<T*>(dst_bits);
  size_t i = 0;
  if constexpr (L::W > 1) {
    const auto s = L::splat(scale);
    for (; i + L::W <= n; i += L::W) L::store16(dst + i, L::narrow(L::mul(L::load(src + i), s)));
  }
  const Encode<T> f{scale};
  for (; i < n; ++i) dst[i] = f(src[i]);
}

template <class L>
void encode_feedback_loop(float* data, float* residual, uint16_t* dst_bits, size_t n, float scale, float unscale) {
  using T = typename L::T;
  T* dst = reinterpret_cast<T*>(dst_bits);
  size_t i = 0;
  if constexpr (L::W > 1) {
    const auto s = L::splat(scale), u = L::splat(unscale);
    for (; i + L::W <= n; i += L::W) {
      const auto v = L::add(L::load(data + i), L::load(residual + i));
      const auto y = L::mul(v, s);
      const auto c = L::narrow(y);
      L::store(data + i, v);
      L::store(residual + i, L::mul(L::sub(y, L::widen(c)), u));
      L::store16(dst + i, c);
    }
  }
  const EncodeFeedback<T> f{scale, unscale};
  for (; i < n; ++i) dst[i] = f(data[i], residual[i]);
}

template <class L>
void decode_loop(const uint16_t* src_bits, float* dst, size_t n, float scale) {
  using T = typename L::T;
  const T* src = reinterpret_cast<const T*>(src_bits);
  size_t i = 0;
  if constexpr (L::W > 1) {
    const auto s = L::splat(scale);
    for (; i + L::W <= n; i += L::W) L::store(dst + i, L::mul(L::widen(L::load16(src + i)), s));
  }
  const Decode<T> f{scale};
  for (; i < n; ++i) dst[i] = f(src[i]);
}

// No lane traits needed: adding the exponent field's lowest bit to the masked
// field carries into bit 15 exactly when the field is all ones, so a block is
// and, add and or over 16-bit integers, which the compiler vectorises with the
// translation unit's instruction set. Stops at the first block with a bad value.
template <class L>
bool all_finite_loop(const uint16_t* bits, size_t n) {
  constexpr uint16_t kField = kExponentBits<typename L::T>;
  constexpr uint16_t kLowest = kField & static_cast<uint16_t>(-kField);
  constexpr size_t kBlock = 4096;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    const size_t end = std::min(n, begin + kBlock);
    uint16_t carries = 0;
    for (size_t i = begin; i < end; ++i) carries |= static_cast<uint16_t>((bits[i] & kField) + kLowest);
    if (carries & 0x8000u) return false;
  }
  return true;
}

template <class L>
constexpr FormatKernels format_kernels() {
  return {&encode_loop<L>, &encode_feedback_loop<L>, &decode_loop<L>, &all_finite_loop<L>};
}

// Scalar lanes: W = 1, everything through the functors.
template <class T_>
struct ScalarLanes {
  using T = T_;
  static constexpr size_t W = 1;
};

}  // namespace
}  // namespace tandem::codec
