// Scalar loops over the functors, plus the dtype -> storage type switch. Used
// by the scalar kernels and by the SIMD kernels for tails and for the
// (dtype, op) pairs they leave to scalar code.
//
// Everything here sits in an unnamed namespace on purpose: each ISA translation
// unit gets its own copy compiled with its own -m flags, so a copy built with
// AVX-512 can never be picked by the linker for the scalar path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "tandem/reduce/functors.h"
#include "tandem/types.h"

namespace tandem::detail::scalar {
namespace {

using fn::bf16_t;
using fn::f16_t;

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<storage type>{}); does nothing for an out-of-range dtype
// (the public entry points validate before calling a kernel).
template <class F>
inline void visit_dtype(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::f32: return f(TypeTag<float>{});
    case DataType::f64: return f(TypeTag<double>{});
    case DataType::f16: return f(TypeTag<f16_t>{});
    case DataType::bf16: return f(TypeTag<bf16_t>{});
    case DataType::i32: return f(TypeTag<int32_t>{});
    case DataType::i64: return f(TypeTag<int64_t>{});
    case DataType::u8: return f(TypeTag<uint8_t>{});
  }
}

// Calls f(functor) with the element-wise functor of `op` (avg combines as sum).
template <class F>
inline void visit_op(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return f(fn::Sum{});
    case ReduceOp::prod: return f(fn::Prod{});
    case ReduceOp::min: return f(fn::Min{});
    case ReduceOp::max: return f(fn::Max{});
  }
}

template <class T, class F>
inline void binary(F f, T* dst, const T* a, const T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
}

template <class T, class F>
inline void binary(F f, void* dst, const void* a, const void* b, size_t n) {
  binary(f, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
}

template <class T>
inline void reduce_typed(ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  visit_op(op, [&](auto f) { binary<T>(f, dst, a, b, n); });
}

inline void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
  visit_dtype(dtype, [&](auto tag) { reduce_typed<typename decltype(tag)::type>(op, dst, a, b, n); });
}

// reduce_many from element `from`: the chain of binary() calls, in dst where
// only s[0] may alias it; else over blocks built apart and then stored, so
// that dst may alias any source.
template <class T, class F>
inline void many(F f, T* dst, const void* const* s, size_t k, size_t from, size_t n) {
  auto src = [s](size_t j) { return static_cast<const T*>(s[j]); };
  bool apart = true;
  for (size_t j = 1; j < k; ++j) apart = apart && src(j) != dst;
  constexpr size_t kBlock = 2048;
  T block[kBlock];
  for (size_t b = from, m = 0; b < n; b += m) {
    m = apart ? n - b : std::min(kBlock, n - b);
    T* acc = apart ? dst + b : block;
    binary(f, acc, src(0) + b, src(1) + b, m);
    for (size_t j = 2; j < k; ++j) binary(f, acc, acc, src(j) + b, m);
    if (!apart) std::copy_n(acc, m, dst + b);
  }
}

inline void reduce_many(DataType dtype, ReduceOp op, void* dst, const void* const* s, size_t k, size_t n) {
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    visit_op(op, [&](auto f) { many<T>(f, static_cast<T*>(dst), s, k, 0, n); });
  });
}

template <class T>
inline void scale_avg_typed(T* data, size_t n, int divisor) {
  const fn::AvgDiv div{divisor};
  for (size_t i = 0; i < n; ++i) data[i] = div(data[i]);
}

inline void scale_avg(DataType dtype, void* data, size_t n, int divisor) {
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scale_avg_typed(static_cast<T*>(data), n, divisor);
  });
}

inline void f32_to_f16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fn::f32_to_f16_bits(src[i]);
}
inline void f16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fn::f16_bits_to_f32(src[i]);
}
inline void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fn::f32_to_bf16_bits(src[i]);
}
inline void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = fn::bf16_bits_to_f32(src[i]);
}

}  // namespace
}  // namespace tandem::detail::scalar
