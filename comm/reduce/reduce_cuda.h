// CUDA reduction kernels (reduce_cuda.cu, built only with TANDEM_WITH_CUDA).
// Same contract and arithmetic as tandem::reduce / tandem::scale_avg (the
// kernels use the functors in functors.h), on device memory. Launches are
// asynchronous on `stream` (a cudaStream_t; nullptr = the default stream).
// Arguments are validated by the caller like the CPU entry points; launch
// errors throw tandem::Error.
#pragma once

#include <cstddef>

#include "tandem/types.h"

namespace tandem::detail {

void reduce_cuda(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count, void* stream);
void scale_avg_cuda(DataType dtype, void* data, size_t count, int divisor, void* stream);
void copy_cuda(void* dst, const void* src, size_t bytes, void* stream);  // any direction (cudaMemcpyDefault)
void synchronize_cuda(void* stream);
void* allocate_cuda(size_t bytes);
void free_cuda(void* p);

}  // namespace tandem::detail
