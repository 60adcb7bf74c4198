// Element-wise CUDA kernels at the memory's speed, shared by the reduction
// (comm/reduce/reduce_cuda.cu) and codec (compression/src/codec_cuda.cu)
// kernels. A Body says what one element, or one pack of E elements, does;
// launch() runs it over n elements:
//  - each thread moves whole packs by 16-byte words (8-byte for a pack of
//    four 16-bit elements) and loads kUnroll packs before it stores any
//    (a destination may alias a source, so the compiler cannot reorder);
//  - consecutive threads' packs are adjacent, so every warp access covers
//    whole 32-byte sectors (a pack of two words per array would leave each
//    store instruction half-filling sectors: 35 % slower, measured);
//  - a scalar head brings every array to 16-byte alignment together and a
//    scalar tail finishes what no pack covers; arrays whose misalignments
//    never meet run element by element;
//  - one block per kThreads * kUnroll packs, so a large call gives every
//    multiprocessor many blocks and the scheduler balances them.
// nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

namespace tandem::cuda {

constexpr unsigned kThreads = 256;
constexpr unsigned kUnroll = 4;  // packs a thread has in flight

// E elements of T moved as 16-byte words (8-byte where the pack is 8 bytes).
// The words stay packed until get() and set(): elements unpacked at the load
// cost registers (74 against 44 for an f16 sum, measured) and so occupancy.
template <class T, int E>
struct Pack {
  static constexpr size_t kBytes = E * sizeof(T);
  static_assert(kBytes == 8 || kBytes % 16 == 0, "a pack is 8 bytes or whole 16-byte words");
  using Word = std::conditional_t<kBytes == 8, uint2, uint4>;
  static constexpr int kWords = static_cast<int>(kBytes / sizeof(Word));
  Word w[kWords];

  __device__ __forceinline__ T get(int e) const {
    T x;
    memcpy(&x, reinterpret_cast<const char*>(w) + e * sizeof(T), sizeof x);
    return x;
  }
  __device__ __forceinline__ void set(int e, T x) { memcpy(reinterpret_cast<char*>(w) + e * sizeof(T), &x, sizeof x); }
};

template <class T, int E>
__device__ __forceinline__ Pack<T, E> load_pack(const T* p) {  // p aligned to the pack's word
  using P = Pack<T, E>;
  P out;
#pragma unroll
  for (int k = 0; k < P::kWords; ++k) out.w[k] = reinterpret_cast<const typename P::Word*>(p)[k];
  return out;
}

// Explicit vector stores: left to itself, nvcc split some 16-byte stores into
// 4-byte ones (seen in the PTX of the first unrolled pack).
__device__ __forceinline__ void store_word(void* p, uint4 w) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(w.x), "r"(w.y), "r"(w.z), "r"(w.w) : "memory");
}
__device__ __forceinline__ void store_word(void* p, uint2 w) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(w.x), "r"(w.y) : "memory");
}

template <class T, int E>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, E>& x) {  // p aligned to the pack's word
#pragma unroll
  for (int k = 0; k < Pack<T, E>::kWords; ++k) store_word(reinterpret_cast<typename Pack<T, E>::Word*>(p) + k, x.w[k]);
}

// A Body has: static constexpr int E (elements a pack); a type Loaded; and the device members
//   Loaded load(size_t i) const;                // elements [i, i + E), every array aligned there
//   void store(size_t i, const Loaded&) const;  // computes and writes them
//   void one(size_t i) const;                   // element i alone
template <class Body>
__global__ void __launch_bounds__(kThreads) packed_kernel(Body body, size_t head, size_t packs, size_t n) {
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
  typename Body::Loaded in[kUnroll];
#pragma unroll
  for (unsigned u = 0; u < kUnroll; ++u) {
    const size_t p = first + u * kThreads;
    if (p < packs) in[u] = body.load(head + p * Body::E);
  }
#pragma unroll
  for (unsigned u = 0; u < kUnroll; ++u) {
    const size_t p = first + u * kThreads;
    if (p < packs) body.store(head + p * Body::E, in[u]);
  }
  if (blockIdx.x == 0) {  // head and tail: fewer than 16 elements each
    const size_t t = threadIdx.x, tail = head + packs * Body::E;
    if (t < head) body.one(t);
    if (tail + t < n) body.one(tail + t);
  }
}

template <class Body>
__global__ void __launch_bounds__(kThreads) scalar_kernel(Body body, size_t n) {
  const size_t first = static_cast<size_t>(blockIdx.x) * kThreads * kUnroll + threadIdx.x;
#pragma unroll
  for (unsigned u = 0; u < kUnroll; ++u) {
    const size_t i = first + u * kThreads;
    if (i < n) body.one(i);
  }
}

// One array a kernel touches: its address and element size.
struct Array {
  const void* data;
  size_t element;
};

constexpr size_t kNeverAligned = ~size_t{0};

// The fewest leading elements after which every array sits on a 16-byte boundary.
inline size_t aligned_head(std::initializer_list<Array> arrays) {
  for (size_t h = 0; h < 16; ++h) {
    bool all = true;
    for (const Array& a : arrays) all = all && (reinterpret_cast<uintptr_t>(a.data) + h * a.element) % 16 == 0;
    if (all) return h;
  }
  return kNeverAligned;
}

inline unsigned blocks_for(size_t units) {
  constexpr size_t kPerBlock = size_t{kThreads} * kUnroll;
  return static_cast<unsigned>(std::max<size_t>(1, (units + kPerBlock - 1) / kPerBlock));
}

// Runs body over elements [0, n) on stream; `arrays` are the ones it reads and writes.
template <class Body>
void launch(const Body& body, size_t n, std::initializer_list<Array> arrays, cudaStream_t stream) {
  if (n == 0) return;
  const size_t head = aligned_head(arrays);
  if (head == kNeverAligned) {
    scalar_kernel<<<blocks_for(n), kThreads, 0, stream>>>(body, n);
    return;
  }
  const size_t h = std::min(head, n);
  const size_t packs = (n - h) / Body::E;
  packed_kernel<<<blocks_for(packs), kThreads, 0, stream>>>(body, h, packs, n);
}

}  // namespace tandem::cuda
