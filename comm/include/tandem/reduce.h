// Element-wise reduction kernels (comm/reduce/). Every (dtype, op) pair has a
// vectorised CPU kernel chosen once at start-up by CPU features (AVX-512,
// AVX2+F16C, scalar); f16/bf16 are widened to f32, combined, and rounded
// back to nearest-even.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tandem/types.h"

namespace tandem {

// dst[i] = a[i] op b[i] for i < count; dst may alias a or b (exactly, not
// partially). For ReduceOp::avg this combines as sum; finish with scale_avg.
void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// dst[i] = (...((sources[0][i] op sources[1][i]) op sources[2][i]) ...) over
// nsources >= 2 sources, in one pass: the same bits as the chain of reduce()
// calls (f16/bf16 round after every step), with each source read once and
// dst written once instead of k - 1 times. dst may alias any source exactly.
void reduce_many(DataType dtype, ReduceOp op, void* dst, const void* const* sources, size_t nsources, size_t count);

// data[i] = data[i] / divisor, with the rounding rules of ReduceOp::avg.
void scale_avg(DataType dtype, void* data, size_t count, int divisor);

// The same on buffers of the given memory type. MemoryType::cuda runs the CUDA
// kernels (functors shared with the CPU path) and waits for them; it throws
// InvalidArgument in a build without TANDEM_WITH_CUDA.
void reduce(MemoryType memory, DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count);
void scale_avg(MemoryType memory, DataType dtype, void* data, size_t count, int divisor);
// On the host, memcpy without its 4K-aliasing stall (a destination 1-31
// bytes past the source modulo 4 KiB is copied backwards in pieces).
void copy(MemoryType memory, void* dst, const void* src, size_t bytes);
// A host copy by non-temporal stores: dst's lines are neither read first
// (write-allocate) nor kept in cache. For destinations past the caches that
// nobody reads soon.
void copy_streaming(void* dst, const void* src, size_t bytes);
// Scratch memory of the given type (aligned to 4 KiB on the host).
void* allocate(MemoryType memory, size_t bytes);
void deallocate(MemoryType memory, void* p);
// Whether this build has the CUDA kernels.
bool cuda_kernels_built();

// The instruction set the dispatcher picked: "avx512", "avx2", or "scalar".
std::string_view reduce_isa();
// Caps the dispatcher's pick at `name` ("scalar", "avx2", "avx512";
// TANDEM_REDUCE_ISA, applied by the settings reader); without a call, the
// best ISA the CPU has. Takes effect before the first reduction; throws
// InvalidArgument for another name.
void use_reduce_isa(std::string_view name);

// Scalar reference used by tests; same contract as reduce().
void reduce_scalar(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count);

// f16/bf16 <-> f32 conversion of a whole buffer (round to nearest even).
void f32_to_f16(const float* src, uint16_t* dst, size_t count);
void f16_to_f32(const uint16_t* src, float* dst, size_t count);
void f32_to_bf16(const float* src, uint16_t* dst, size_t count);
void bf16_to_f32(const uint16_t* src, float* dst, size_t count);

}  // namespace tandem
