// Element-wise arithmetic of the codecs, shared by the scalar kernels, the
// SIMD kernels' tails and the CUDA kernels (codec_cuda.cu), so the CPU tests
// cover the CUDA arithmetic too. The 16-bit conversions are comm/reduce's
// (functors.h): the same bits the all-reduce's own f16/bf16 kernels produce.
//
// Must stay C++17 and free of host-only library calls (nvcc compiles it too).
// Built with -ffp-contract=off: y = v * scale and (y - w) * unscale are two
// roundings each, never one fused operation, on every path.
#pragma once

#include <cstdint>

#include "tandem/reduce/functors.h"

namespace tandem::codec {

using fn::bf16_t;
using fn::f16_t;

// T is fn::f16_t or fn::bf16_t.
template <class T>
struct Encode {
  float scale;
  TANDEM_HOST_DEVICE T operator()(float x) const { return fn::Arith<T>::narrow(x * scale); }
};

template <class T>
struct Decode {
  float scale;
  TANDEM_HOST_DEVICE float operator()(T c) const { return fn::Arith<T>::widen(c) * scale; }
};

// Error feedback for one element: sends v = data + residual, keeps v in data,
// and leaves the rounding error of v (in data's units) in residual.
template <class T>
struct EncodeFeedback {
  float scale, unscale;
  TANDEM_HOST_DEVICE T operator()(float& data, float& residual) const {
    const float v = data + residual;
    const float y = v * scale;
    const T c = fn::Arith<T>::narrow(y);
    data = v;
    residual = (y - fn::Arith<T>::widen(c)) * unscale;
    return c;
  }
};

// The exponent field's bits; all of them set is inf or NaN.
template <class T>
constexpr uint16_t kExponentBits = 0;
template <>
constexpr uint16_t kExponentBits<f16_t> = 0x7C00u;
template <>
constexpr uint16_t kExponentBits<bf16_t> = 0x7F80u;

template <class T>
TANDEM_HOST_DEVICE bool nonfinite(T c) {
  return (c.bits & kExponentBits<T>) == kExponentBits<T>;
}

}  // namespace tandem::codec
