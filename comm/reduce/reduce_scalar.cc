// Scalar reference kernels: a plain loop over the shared functors. This is
// the semantics every other path (SIMD, CUDA) must reproduce bit for bit.
#include "scalar_loops.h"
#include "tandem/reduce.h"
#include "tandem/reduce/kernels.h"

namespace tandem {
namespace detail {
namespace {

void scale_avg_scalar(DataType dtype, void* data, size_t count, int divisor) {
  scalar::scale_avg(dtype, data, count, divisor);
}

void f32_to_f16_scalar(const float* src, uint16_t* dst, size_t n) { scalar::f32_to_f16(src, dst, n); }
void f16_to_f32_scalar(const uint16_t* src, float* dst, size_t n) { scalar::f16_to_f32(src, dst, n); }
void f32_to_bf16_scalar(const float* src, uint16_t* dst, size_t n) { scalar::f32_to_bf16(src, dst, n); }
void bf16_to_f32_scalar(const uint16_t* src, float* dst, size_t n) { scalar::bf16_to_f32(src, dst, n); }
void reduce_many_scalar(DataType dtype, ReduceOp op, void* dst, const void* const* s, size_t k, size_t n) {
  scalar::reduce_many(dtype, op, dst, s, k, n);
}

}  // namespace

extern const KernelTable kScalarKernels = {
    &tandem::reduce_scalar, &scale_avg_scalar,   &f32_to_f16_scalar,  &f16_to_f32_scalar,
    &f32_to_bf16_scalar,    &bf16_to_f32_scalar, &reduce_many_scalar,
};

}  // namespace detail

void reduce_scalar(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  detail::scalar::reduce(dtype, op, dst, a, b, count);
}

}  // namespace tandem
