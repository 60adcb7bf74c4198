// CUDA codec kernels (codec_cuda.cu, built only with TANDEM_WITH_CUDA): the
// casts of tandem::compression::encode / encode_feedback / decode / all_finite
// on device memory, using the same element functors (codec_functors.h), so
// the CPU tests cover their arithmetic; tests/gpu runs them on a GPU.
// Launches are asynchronous on `stream` (a cudaStream_t; nullptr = default);
// all_finite_cuda waits for its result. Launch errors throw tandem::Error.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::codec {

enum class Format : uint8_t { f16, bf16 };

void encode_cuda(Format f, const float* src, uint16_t* dst, size_t n, float scale, void* stream);
void encode_feedback_cuda(Format f, float* data, float* residual, uint16_t* dst, size_t n, float scale, float unscale,
                          void* stream);
void decode_cuda(Format f, const uint16_t* src, float* dst, size_t n, float scale, void* stream);
// Sets *found (device-visible memory) to 1 if any of the n codes is inf or NaN; never clears it. Asynchronous.
void nonfinite_cuda(Format f, const uint16_t* src, size_t n, unsigned* found, void* stream);
bool all_finite_cuda(Format f, const uint16_t* src, size_t n, void* stream);
void synchronize_cuda(void* stream);

}  // namespace tandem::codec
