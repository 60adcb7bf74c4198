// CUDA kernels for every (dtype, op): one grid-stride kernel templated on the
// element type and the functor from functors.h, so the arithmetic is the one
// the CPU tests check. Nothing on a GPU-less machine runs this; it is compile-checked.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "tandem/reduce/functors.h"
#include "reduce_cuda.h"
#include "tandem/errors.h"

namespace tandem::detail {
namespace {

using fn::bf16_t;
using fn::f16_t;

template <class T, class F>
__global__ void binary_kernel(F f, T* dst, const T* a, const T* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = f(a[i], b[i]);
  }
}

template <class T>
__global__ void scale_kernel(fn::AvgDiv div, T* data, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    data[i] = div(data[i]);
  }
}

constexpr unsigned kThreads = 256;

// Enough blocks to fill any current GPU; the grid-stride loop covers the rest.
unsigned blocks_for(size_t n) {
  const size_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<size_t>(wanted, 4096));
}

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
}

template <class T, class F>
void launch_binary(F f, void* dst, const void* a, const void* b, size_t n, cudaStream_t stream) {
  binary_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(f, static_cast<T*>(dst), static_cast<const T*>(a),
                                                           static_cast<const T*>(b), n);
}

template <class T>
void reduce_typed(ReduceOp op, void* dst, const void* a, const void* b, size_t n, cudaStream_t stream) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return launch_binary<T>(fn::Sum{}, dst, a, b, n, stream);
    case ReduceOp::prod: return launch_binary<T>(fn::Prod{}, dst, a, b, n, stream);
    case ReduceOp::min: return launch_binary<T>(fn::Min{}, dst, a, b, n, stream);
    case ReduceOp::max: return launch_binary<T>(fn::Max{}, dst, a, b, n, stream);
  }
}

template <class T>
void scale_typed(void* data, size_t n, int divisor, cudaStream_t stream) {
  scale_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(fn::AvgDiv{divisor}, static_cast<T*>(data), n);
}

}  // namespace

void reduce_cuda(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count, void* stream) {
  if (count == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DataType::f32: reduce_typed<float>(op, dst, a, b, count, s); break;
    case DataType::f64: reduce_typed<double>(op, dst, a, b, count, s); break;
    case DataType::f16: reduce_typed<f16_t>(op, dst, a, b, count, s); break;
    case DataType::bf16: reduce_typed<bf16_t>(op, dst, a, b, count, s); break;
    case DataType::i32: reduce_typed<int32_t>(op, dst, a, b, count, s); break;
    case DataType::i64: reduce_typed<int64_t>(op, dst, a, b, count, s); break;
    case DataType::u8: reduce_typed<uint8_t>(op, dst, a, b, count, s); break;
  }
  check_launch("reduce_cuda");
}

void scale_avg_cuda(DataType dtype, void* data, size_t count, int divisor, void* stream) {
  if (count == 0) return;
  if (divisor <= 0) throw InvalidArgument("scale_avg_cuda: divisor must be positive, got " + std::to_string(divisor));
  const auto s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case DataType::f32: scale_typed<float>(data, count, divisor, s); break;
    case DataType::f64: scale_typed<double>(data, count, divisor, s); break;
    case DataType::f16: scale_typed<f16_t>(data, count, divisor, s); break;
    case DataType::bf16: scale_typed<bf16_t>(data, count, divisor, s); break;
    case DataType::i32: scale_typed<int32_t>(data, count, divisor, s); break;
    case DataType::i64: scale_typed<int64_t>(data, count, divisor, s); break;
    case DataType::u8: scale_typed<uint8_t>(data, count, divisor, s); break;
  }
  check_launch("scale_avg_cuda");
}

void copy_cuda(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return;
  const cudaError_t err =
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) throw Error(std::string("copy_cuda: ") + cudaGetErrorString(err));
}

void* allocate_cuda(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) throw Error(std::string("cudaMalloc: ") + cudaGetErrorString(err));
  return p;
}

void free_cuda(void* p) { cudaFree(p); }

void synchronize_cuda(void* stream) {
  const cudaError_t err = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) throw Error(std::string("CUDA stream synchronize: ") + cudaGetErrorString(err));
}

}  // namespace tandem::detail
