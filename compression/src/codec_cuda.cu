// CUDA codec kernels: the element functors of codec_functors.h run by
// elementwise_cuda.cuh's packed kernels, 4 elements a pack (16 bytes of
// floats, 8 of 16-bit codes) so every warp access fills whole sectors; the
// non-finite scan, which reads codes only, 8 (16 bytes). Built with
// -fmad=false, as the CPU side with -ffp-contract=off, so scaling rounds
// twice on both; tests/gpu checks them against the functors on a GPU and
// measures them against a device copy.
#include <cuda_runtime.h>

#include <string>

#include "codec_cuda.h"
#include "codec_functors.h"
#include "tandem/errors.h"
#include "tandem/reduce/elementwise_cuda.cuh"

namespace tandem::codec {
namespace {

constexpr int kPack = 4;
template <class T>
using Codes = cuda::Pack<T, kPack>;
using Floats = cuda::Pack<float, kPack>;

template <class T>
struct EncodeBody {
  static constexpr int E = kPack;
  using Loaded = Floats;
  Encode<T> f;
  const float* src;
  T* dst;

  __device__ Loaded load(size_t i) const { return cuda::load_pack<float, E>(src + i); }
  __device__ void store(size_t i, const Loaded& x) const {
    Codes<T> c;
#pragma unroll
    for (int e = 0; e < E; ++e) c.set(e, f(x.get(e)));
    cuda::store_pack(dst + i, c);
  }
  __device__ void one(size_t i) const { dst[i] = f(src[i]); }
};

template <class T>
struct DecodeBody {
  static constexpr int E = kPack;
  using Loaded = Codes<T>;
  Decode<T> f;
  const T* src;
  float* dst;

  __device__ Loaded load(size_t i) const { return cuda::load_pack<T, E>(src + i); }
  __device__ void store(size_t i, const Loaded& c) const {
    Floats x;
#pragma unroll
    for (int e = 0; e < E; ++e) x.set(e, f(c.get(e)));
    cuda::store_pack(dst + i, x);
  }
  __device__ void one(size_t i) const { dst[i] = f(src[i]); }
};

template <class T>
struct EncodeFeedbackBody {
  static constexpr int E = kPack;
  struct Loaded {
    Floats data, residual;
  };
  EncodeFeedback<T> f;
  float* data;
  float* residual;
  T* dst;

  __device__ Loaded load(size_t i) const {
    return {cuda::load_pack<float, E>(data + i), cuda::load_pack<float, E>(residual + i)};
  }
  __device__ void store(size_t i, Loaded x) const {
    Codes<T> c;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      float d = x.data.get(e), r = x.residual.get(e);
      c.set(e, f(d, r));
      x.data.set(e, d);
      x.residual.set(e, r);
    }
    cuda::store_pack(data + i, x.data);
    cuda::store_pack(residual + i, x.residual);
    cuda::store_pack(dst + i, c);
  }
  __device__ void one(size_t i) const { dst[i] = f(data[i], residual[i]); }
};

// Sets *found to 1 when any code is inf or NaN, one write per warp that saw one.
template <class T>
struct NonfiniteBody {
  static constexpr int E = 8;
  using Loaded = cuda::Pack<T, E>;
  const T* src;
  unsigned* found;

  __device__ Loaded load(size_t i) const { return cuda::load_pack<T, E>(src + i); }
  __device__ void store(size_t, const Loaded& c) const {
    bool bad = false;
#pragma unroll
    for (int e = 0; e < E; ++e) bad |= nonfinite(c.get(e));
    report(bad);
  }
  __device__ void one(size_t i) const { report(nonfinite(src[i])); }
  __device__ void report(bool bad) const {
    const unsigned active = __activemask();
    if (__any_sync(active, bad) && threadIdx.x % 32 == static_cast<unsigned>(__ffs(active) - 1)) *found = 1u;
  }
};

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

template <class T>
void encode_typed(const float* src, uint16_t* dst, size_t n, float scale, cudaStream_t s) {
  cuda::launch(EncodeBody<T>{{scale}, src, as<T>(dst)}, n, {{src, 4}, {dst, 2}}, s);
}

template <class T>
void encode_feedback_typed(float* data, float* residual, uint16_t* dst, size_t n, float scale, float unscale,
                           cudaStream_t s) {
  cuda::launch(EncodeFeedbackBody<T>{{scale, unscale}, data, residual, as<T>(dst)}, n,
               {{data, 4}, {residual, 4}, {dst, 2}}, s);
}

template <class T>
void decode_typed(const uint16_t* src, float* dst, size_t n, float scale, cudaStream_t s) {
  cuda::launch(DecodeBody<T>{{scale}, as<T>(src), dst}, n, {{src, 2}, {dst, 4}}, s);
}

}  // namespace

void encode_cuda(Format f, const float* src, uint16_t* dst, size_t n, float scale, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (f == Format::f16) {
    encode_typed<f16_t>(src, dst, n, scale, s);
  } else {
    encode_typed<bf16_t>(src, dst, n, scale, s);
  }
  check_launch("encode_cuda");
}

void encode_feedback_cuda(Format f, float* data, float* residual, uint16_t* dst, size_t n, float scale, float unscale,
                          void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (f == Format::f16) {
    encode_feedback_typed<f16_t>(data, residual, dst, n, scale, unscale, s);
  } else {
    encode_feedback_typed<bf16_t>(data, residual, dst, n, scale, unscale, s);
  }
  check_launch("encode_feedback_cuda");
}

void decode_cuda(Format f, const uint16_t* src, float* dst, size_t n, float scale, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (f == Format::f16) {
    decode_typed<f16_t>(src, dst, n, scale, s);
  } else {
    decode_typed<bf16_t>(src, dst, n, scale, s);
  }
  check_launch("decode_cuda");
}

void nonfinite_cuda(Format f, const uint16_t* src, size_t n, unsigned* found, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (f == Format::f16) {
    cuda::launch(NonfiniteBody<f16_t>{as<f16_t>(src), found}, n, {{src, 2}}, s);
  } else {
    cuda::launch(NonfiniteBody<bf16_t>{as<bf16_t>(src), found}, n, {{src, 2}}, s);
  }
  check_launch("nonfinite_cuda");
}

// The answer travels through a pinned word the GPU writes directly (one per
// thread, kept): a call costs a launch and a synchronisation, no allocation or copy.
bool all_finite_cuda(Format f, const uint16_t* src, size_t n, void* stream) {
  struct Word {
    unsigned* host = nullptr;
    unsigned* device = nullptr;  // the same word as the GPU addresses it (portable: every device)
    ~Word() {
      if (host) cudaFreeHost(host);
    }
  };
  thread_local Word word;
  if (!word.host) {
    check(cudaHostAlloc(reinterpret_cast<void**>(&word.host), sizeof(unsigned),
                        cudaHostAllocMapped | cudaHostAllocPortable),
          "all_finite_cuda: cudaHostAlloc");
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&word.device), word.host, 0),
          "all_finite_cuda: device pointer");
  }
  *static_cast<volatile unsigned*>(word.host) = 0;
  nonfinite_cuda(f, src, n, word.device, stream);
  synchronize_cuda(stream);
  return *static_cast<volatile unsigned*>(word.host) == 0;
}

void synchronize_cuda(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "codec: cudaStreamSynchronize");
}

}  // namespace tandem::codec
