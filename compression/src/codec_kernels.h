// Internal to compression/: one table of codec kernels per instruction set
// (the ISAs and their run-time choice are comm/reduce's, so TANDEM_REDUCE_ISA
// caps both). Tests use codec_kernels() to run a specific ISA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/reduce/kernels.h"  // Isa, cpu_supports, active_isa

namespace tandem::codec {

// Contracts as tandem::compression::encode / encode_feedback / decode / all_finite, for one 16-bit format.
struct FormatKernels {
  void (*encode)(const float* src, uint16_t* dst, size_t n, float scale);
  void (*encode_feedback)(float* data, float* residual, uint16_t* dst, size_t n, float scale, float unscale);
  void (*decode)(const uint16_t* src, float* dst, size_t n, float scale);
  bool (*all_finite)(const uint16_t* src, size_t n);
};

struct CodecKernels {
  FormatKernels f16, bf16;
};

// Defined in codec_scalar.cc, codec_avx2.cc and codec_avx512.cc.
extern const CodecKernels kScalarCodecs;
extern const CodecKernels kAvx2Codecs;
extern const CodecKernels kAvx512Codecs;

// The kernels for `isa`; the caller must have checked detail::cpu_supports(isa).
const CodecKernels& codec_kernels(detail::Isa isa);

}  // namespace tandem::codec
