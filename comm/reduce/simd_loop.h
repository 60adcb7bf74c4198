// Generic SIMD loops shared by reduce_avx2.cc and reduce_avx512.cc. Each ISA
// file supplies "lane traits" per dtype:
//
//   struct Tr {
//     using T = ...;      // storage element type (float, fn::f16_t, int32_t, ...)
//     using V = ...;      // register type arithmetic happens in (f16/bf16 widen to f32 lanes)
//     using Ops = ...;    // static sum/min/max (and prod, div where vectorised) on V
//     static constexpr size_t W = ...;  // elements per V
//     static V load(const T*);          // unaligned
//     static void store(T*, V);         // unaligned
//   };
//
// Tails and operations an Ops type does not provide fall back to the scalar
// functors, which compute the same bits.
//
// Unnamed namespace for the same reason as scalar_loops.h: per-ISA copies.
#pragma once

#include <cstddef>
#include <type_traits>

#include "scalar_loops.h"
#include "tandem/reduce/kernels.h"

namespace tandem::detail::simd {
namespace {

// dst = vop(a, b) vector by vector (two per iteration to keep both load ports
// busy), then sop on the tail. Each block loads both inputs before storing, so
// dst may alias a or b exactly.
template <class Tr, class VOp, class SOp>
inline void binary_loop(VOp vop, SOp sop, typename Tr::T* dst, const typename Tr::T* a, const typename Tr::T* b,
                        size_t n) {
  constexpr size_t W = Tr::W;
  size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const auto a0 = Tr::load(a + i), b0 = Tr::load(b + i);
    const auto a1 = Tr::load(a + i + W), b1 = Tr::load(b + i + W);
    Tr::store(dst + i, vop(a0, b0));
    Tr::store(dst + i + W, vop(a1, b1));
  }
  if (i + W <= n) {
    Tr::store(dst + i, vop(Tr::load(a + i), Tr::load(b + i)));
    i += W;
  }
  for (; i < n; ++i) dst[i] = sop(a[i], b[i]);
}

// visit_vector_op's vector functor for an op the lanes have no vector form of.
struct ScalarOnly {};

// Calls loop(vop, sop) with op's vector and scalar functors (avg combines as
// sum); for a prod the lanes have no vector form of, vop is ScalarOnly and
// `loop` runs sop in scalar code.
template <class Tr, class Loop>
inline void visit_vector_op(ReduceOp op, Loop&& loop) {
  using V = typename Tr::V;
  using Ops = typename Tr::Ops;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return loop([](V x, V y) { return Ops::sum(x, y); }, fn::Sum{});
    case ReduceOp::min: return loop([](V x, V y) { return Ops::min(x, y); }, fn::Min{});
    case ReduceOp::max: return loop([](V x, V y) { return Ops::max(x, y); }, fn::Max{});
    case ReduceOp::prod:
      if constexpr (requires(V x) { Ops::prod(x, x); }) {
        return loop([](V x, V y) { return Ops::prod(x, y); }, fn::Prod{});
      } else {
        return loop(ScalarOnly{}, fn::Prod{});
      }
  }
}

template <class VOp>
constexpr bool on_vectors = !std::is_same_v<VOp, ScalarOnly>;

template <class Tr>
inline void reduce_typed(ReduceOp op, void* dst_v, const void* a_v, const void* b_v, size_t n) {
  using T = typename Tr::T;
  T* dst = static_cast<T*>(dst_v);
  const T* a = static_cast<const T*>(a_v);
  const T* b = static_cast<const T*>(b_v);
  visit_vector_op<Tr>(op, [&](auto vop, auto sop) {
    if constexpr (on_vectors<decltype(vop)>) {
      binary_loop<Tr>(vop, sop, dst, a, b, n);
    } else {
      scalar::binary(sop, dst, a, b, n);
    }
  });
}

// dst = vop(...vop(vop(s[0], s[1]), s[2])..., s[k-1]) for k >= 2 sources,
// vector by vector: each source read once and dst written once, where a
// chain of binary_loop calls reads and writes dst k - 1 times. Widened lanes
// (f16/bf16) round to their storage type between steps, as that chain's
// stores do, so the bits are the same. Each block loads every source before
// storing, so dst may alias any source exactly.
template <class Tr, class VOp, class SOp>
inline void many_loop(VOp vop, SOp sop, typename Tr::T* dst, const void* const* s, size_t k, size_t n) {
  using T = typename Tr::T;
  using V = typename Tr::V;
  constexpr size_t W = Tr::W;
  auto at = [s](size_t j, size_t i) { return static_cast<const T*>(s[j]) + i; };
  auto step = [vop](V acc, V x) {
    if constexpr (sizeof(T) * W < sizeof(V)) {
      alignas(64) T rounded[W];
      Tr::store(rounded, acc);
      acc = Tr::load(rounded);
    }
    return vop(acc, x);
  };
  size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    V a0 = vop(Tr::load(at(0, i)), Tr::load(at(1, i)));
    V a1 = vop(Tr::load(at(0, i + W)), Tr::load(at(1, i + W)));
    for (size_t j = 2; j < k; ++j) {
      a0 = step(a0, Tr::load(at(j, i)));
      a1 = step(a1, Tr::load(at(j, i + W)));
    }
    Tr::store(dst + i, a0);
    Tr::store(dst + i + W, a1);
  }
  if (i + W <= n) {
    V a0 = vop(Tr::load(at(0, i)), Tr::load(at(1, i)));
    for (size_t j = 2; j < k; ++j) a0 = step(a0, Tr::load(at(j, i)));
    Tr::store(dst + i, a0);
    i += W;
  }
  scalar::many<T>(sop, dst, s, k, i, n);
}

template <class Tr>
inline void reduce_many_typed(ReduceOp op, void* dst_v, const void* const* s, size_t k, size_t n) {
  using T = typename Tr::T;
  T* dst = static_cast<T*>(dst_v);
  visit_vector_op<Tr>(op, [&](auto vop, auto sop) {
    if constexpr (on_vectors<decltype(vop)>) {
      many_loop<Tr>(vop, sop, dst, s, k, n);
    } else {
      scalar::many<T>(sop, dst, s, k, 0, n);
    }
  });
}

// In-place data = data / divisor for float lanes (Ops::div is true division,
// like AvgDiv); integer dtypes use the scalar loop.
template <class Tr>
inline void scale_avg_typed(void* data_v, size_t n, int divisor) {
  using T = typename Tr::T;
  using V = typename Tr::V;
  using Ops = typename Tr::Ops;
  T* data = static_cast<T*>(data_v);
  if constexpr (requires(V x) { Ops::div(x, x); }) {
    const V d = Ops::splat(divisor);
    const fn::AvgDiv sdiv{divisor};
    binary_loop<Tr>([d](V x, V) { return Ops::div(x, d); }, [sdiv](T x, T) { return sdiv(x); }, data, data, data, n);
  } else {
    scalar::scale_avg_typed(data, n, divisor);
  }
}

// dst = Dst::store(Src::load(src)): f32 <-> f16/bf16 buffer conversion; both
// traits must share the lane type and width.
template <class Src, class Dst, class SOp>
inline void convert_loop(SOp sop, const typename Src::T* src, typename Dst::T* dst, size_t n) {
  static_assert(Src::W == Dst::W);
  constexpr size_t W = Src::W;
  size_t i = 0;
  for (; i + W <= n; i += W) Dst::store(dst + i, Src::load(src + i));
  for (; i < n; ++i) dst[i] = sop(src[i]);
}

// One ISA's KernelTable, from its lane traits for each dtype.
template <class F32, class F64, class F16, class BF16, class I32, class I64, class U8>
struct Table {
  // Calls f(scalar::TypeTag<lane traits of dtype>{}).
  template <class F>
  static void with_lanes(DataType dtype, F&& f) {
    switch (dtype) {
      case DataType::f32: return f(scalar::TypeTag<F32>{});
      case DataType::f64: return f(scalar::TypeTag<F64>{});
      case DataType::f16: return f(scalar::TypeTag<F16>{});
      case DataType::bf16: return f(scalar::TypeTag<BF16>{});
      case DataType::i32: return f(scalar::TypeTag<I32>{});
      case DataType::i64: return f(scalar::TypeTag<I64>{});
      case DataType::u8: return f(scalar::TypeTag<U8>{});
    }
  }
  static void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t n) {
    with_lanes(dtype, [&](auto lanes) { reduce_typed<typename decltype(lanes)::type>(op, dst, a, b, n); });
  }
  static void reduce_many(DataType dtype, ReduceOp op, void* dst, const void* const* s, size_t k, size_t n) {
    with_lanes(dtype, [&](auto lanes) { reduce_many_typed<typename decltype(lanes)::type>(op, dst, s, k, n); });
  }
  static void scale_avg(DataType dtype, void* data, size_t n, int divisor) {
    with_lanes(dtype, [&](auto lanes) { scale_avg_typed<typename decltype(lanes)::type>(data, n, divisor); });
  }
  static void f32_to_f16(const float* src, uint16_t* dst, size_t n) {
    convert_loop<F32, F16>([](float x) { return fn::f16_t{fn::f32_to_f16_bits(x)}; }, src,
                           reinterpret_cast<fn::f16_t*>(dst), n);
  }
  static void f16_to_f32(const uint16_t* src, float* dst, size_t n) {
    convert_loop<F16, F32>([](fn::f16_t x) { return fn::f16_bits_to_f32(x.bits); },
                           reinterpret_cast<const fn::f16_t*>(src), dst, n);
  }
  static void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
    convert_loop<F32, BF16>([](float x) { return fn::bf16_t{fn::f32_to_bf16_bits(x)}; }, src,
                            reinterpret_cast<fn::bf16_t*>(dst), n);
  }
  static void bf16_to_f32(const uint16_t* src, float* dst, size_t n) {
    convert_loop<BF16, F32>([](fn::bf16_t x) { return fn::bf16_bits_to_f32(x.bits); },
                            reinterpret_cast<const fn::bf16_t*>(src), dst, n);
  }
  static constexpr KernelTable kernels() {
    return {&reduce, &scale_avg, &f32_to_f16, &f16_to_f32, &f32_to_bf16, &bf16_to_f32, &reduce_many};
  }
};

}  // namespace
}  // namespace tandem::detail::simd
