// CUDA codec kernels: grid-stride loops over the element functors of
// codec_functors.h (built with -fmad=false, as the CPU side with
// -ffp-contract=off, so scaling rounds twice on both). Nothing on a GPU-less
// machine runs this; it is compile-checked and linked.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "codec_cuda.h"
#include "codec_functors.h"
#include "tandem/errors.h"

namespace tandem::codec {
namespace {

constexpr unsigned kThreads = 256;

unsigned blocks_for(size_t n) {
  const size_t wanted = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(wanted, 4096)));
}

__device__ size_t first_index() { return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ size_t grid_stride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

template <class T>
__global__ void encode_kernel(Encode<T> f, const float* src, T* dst, size_t n) {
  for (size_t i = first_index(); i < n; i += grid_stride()) dst[i] = f(src[i]);
}

template <class T>
__global__ void encode_feedback_kernel(EncodeFeedback<T> f, float* data, float* residual, T* dst, size_t n) {
  for (size_t i = first_index(); i < n; i += grid_stride()) dst[i] = f(data[i], residual[i]);
}

template <class T>
__global__ void decode_kernel(Decode<T> f, const T* src, float* dst, size_t n) {
  for (size_t i = first_index(); i < n; i += grid_stride()) dst[i] = f(src[i]);
}

template <class T>
__global__ void nonfinite_kernel(const T* src, size_t n, unsigned* found) {
  bool bad = false;
  for (size_t i = first_index(); i < n; i += grid_stride()) bad |= nonfinite(src[i]);
  if (bad) atomicOr(found, 1u);
}

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(err));
}

void check_launch(const char* what) { check(cudaGetLastError(), what); }

template <class T>
T* as(uint16_t* p) {
  return reinterpret_cast<T*>(p);
}
template <class T>
const T* as(const uint16_t* p) {
  return reinterpret_cast<const T*>(p);
}

}  // namespace

void encode_cuda(Format f, const float* src, uint16_t* dst, size_t n, float scale, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (f == Format::f16) {
    encode_kernel<<<blocks_for(n), kThreads, 0, s>>>(Encode<f16_t>{scale}, src, as<f16_t>(dst), n);
  } else {
    encode_kernel<<<blocks_for(n), kThreads, 0, s>>>(Encode<bf16_t>{scale}, src, as<bf16_t>(dst), n);
  }
  check_launch("encode_cuda");
}

void encode_feedback_cuda(Format f, float* data, float* residual, uint16_t* dst, size_t n, float scale,
                          float unscale, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (f == Format::f16) {
    encode_feedback_kernel<<<blocks_for(n), kThreads, 0, s>>>(EncodeFeedback<f16_t>{scale, unscale}, data, residual,
                                                               as<f16_t>(dst), n);
  } else {
    encode_feedback_kernel<<<blocks_for(n), kThreads, 0, s>>>(EncodeFeedback<bf16_t>{scale, unscale}, data,
                                                               residual, as<bf16_t>(dst), n);
  }
  check_launch("encode_feedback_cuda");
}

void decode_cuda(Format f, const uint16_t* src, float* dst, size_t n, float scale, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (f == Format::f16) {
    decode_kernel<<<blocks_for(n), kThreads, 0, s>>>(Decode<f16_t>{scale}, as<f16_t>(src), dst, n);
  } else {
    decode_kernel<<<blocks_for(n), kThreads, 0, s>>>(Decode<bf16_t>{scale}, as<bf16_t>(src), dst, n);
  }
  check_launch("decode_cuda");
}

bool all_finite_cuda(Format f, const uint16_t* src, size_t n, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  unsigned* found = nullptr;
  check(cudaMalloc(&found, sizeof(unsigned)), "all_finite_cuda: cudaMalloc");
  unsigned host = 0;
  try {
    check(cudaMemsetAsync(found, 0, sizeof(unsigned), s), "all_finite_cuda: cudaMemsetAsync");
    if (f == Format::f16) {
      nonfinite_kernel<<<blocks_for(n), kThreads, 0, s>>>(as<f16_t>(src), n, found);
    } else {
      nonfinite_kernel<<<blocks_for(n), kThreads, 0, s>>>(as<bf16_t>(src), n, found);
    }
    check_launch("all_finite_cuda");
    check(cudaMemcpyAsync(&host, found, sizeof(unsigned), cudaMemcpyDeviceToHost, s), "all_finite_cuda: copy");
    check(cudaStreamSynchronize(s), "all_finite_cuda: synchronize");
  } catch (...) {
    cudaFree(found);
    throw;
  }
  cudaFree(found);
  return host == 0;
}

void synchronize_cuda(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "codec: cudaStreamSynchronize");
}

}  // namespace tandem::codec
