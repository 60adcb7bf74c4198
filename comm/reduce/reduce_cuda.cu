// CUDA kernels for every (dtype, op): the element-wise functors of
// functors.h (the arithmetic the CPU tests check) run by elementwise_cuda.cuh's
// packed kernels, 16 bytes a thread. tests/gpu checks them against the
// functors on a GPU and measures them against a device-to-device copy.
#include <cuda_runtime.h>

#include <string>

#include "reduce_cuda.h"
#include "tandem/errors.h"
#include "tandem/reduce/elementwise_cuda.cuh"
#include "tandem/reduce/functors.h"

namespace tandem::detail {
namespace {

using fn::bf16_t;
using fn::f16_t;

template <class T>
constexpr int kPerPack = static_cast<int>(16 / sizeof(T));

// dst = f(a, b); dst may be a or b.
template <class T, class F>
struct BinaryBody {
  static constexpr int E = kPerPack<T>;
  using P = cuda::Pack<T, E>;
  struct Loaded {
    P a, b;
  };
  F f;
  T* dst;
  const T* a;
  const T* b;

  __device__ Loaded load(size_t i) const { return {cuda::load_pack<T, E>(a + i), cuda::load_pack<T, E>(b + i)}; }
  __device__ void store(size_t i, const Loaded& x) const {
    P r;
#pragma unroll
    for (int e = 0; e < E; ++e) r.set(e, f(x.a.get(e), x.b.get(e)));
    cuda::store_pack(dst + i, r);
  }
  __device__ void one(size_t i) const { dst[i] = f(a[i], b[i]); }
};

// data = data / divisor, in place.
template <class T>
struct ScaleBody {
  static constexpr int E = kPerPack<T>;
  using Loaded = cuda::Pack<T, E>;
  fn::AvgDiv div;
  T* data;

  __device__ Loaded load(size_t i) const { return cuda::load_pack<T, E>(data + i); }
  __device__ void store(size_t i, Loaded x) const {
#pragma unroll
    for (int e = 0; e < E; ++e) x.set(e, div(x.get(e)));
    cuda::store_pack(data + i, x);
  }
  __device__ void one(size_t i) const { data[i] = div(data[i]); }
};

void check_launch(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw Error(std::string(what) + ": kernel launch failed: " + cudaGetErrorString(err));
}

template <class T, class F>
void launch_binary(F f, void* dst, const void* a, const void* b, size_t n, cudaStream_t stream) {
  const BinaryBody<T, F> body{f, static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b)};
  cuda::launch(body, n, {{dst, sizeof(T)}, {a, sizeof(T)}, {b, sizeof(T)}}, stream);
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
  cuda::launch(ScaleBody<T>{fn::AvgDiv{divisor}, static_cast<T*>(data)}, n, {{data, sizeof(T)}}, stream);
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
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
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
