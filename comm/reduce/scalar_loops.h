// Scalar loops over the functors, plus the dtype -> storage type switch. Used
// by the scalar kernels and by the SIMD kernels for tails and for the
// (dtype, op) pairs they leave to scalar code.
//
// Everything here sits in an unnamed namespace on purpose: each ISA translation
// unit gets its own copy compiled with its own -m flags, so a copy built with
// AVX-512 can never be picked by the linker for the scalar path.
#pragma once

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
