// Element-wise CUDA kernels at the memory's speed, shared by the reduction
// (comm/reduce/reduce_cuda.cu) and codec (compression/src/codec_cuda.cu)
// kernels. A Body says what one element, or one pack of E elements, does;
// launch() runs it over n elements:
//  - each thread moves 16-byte words and loads Body::kUnroll packs before it
//    stores any (a destination may alias a source, so the compiler cannot
//    reorder): 4 in general, 2 where a pack's elements need many registers;
//  - a scalar head brings every array to 16-byte alignment together and a
//    scalar tail finishes what no pack covers; arrays whose misalignments
//    never meet run element by element;
//  - one block per kThreads * Body::kUnroll packs, so a large call gives every
//    multiprocessor many blocks and the scheduler balances them.
// nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace tandem::cuda {

constexpr unsigned kThreads = 256;

// E elements of T in registers, moved as 16-byte words.
template <class T, int E>
struct Pack {
  static_assert(E * sizeof(T) % 16 == 0, "a pack is whole 16-byte words");
  static constexpr int kWords = static_cast<int>(E * sizeof(T) / 16);
  T v[E];
};

template <class T, int E>
__device__ __forceinline__ Pack<T, E> load_pack(const T* p) {  // p 16-byte aligned
  uint4 w[Pack<T, E>::kWords];
#pragma unroll
  for (int k = 0; k < Pack<T, E>::kWords; ++k) w[k] = reinterpret_cast<const uint4*>(p)[k];
  Pack<T, E> out;
  memcpy(&out, w, sizeof out);
  return out;
}

// An explicit 16-byte store: left to itself, nvcc split some of these into
// 4-byte stores (seen in the PTX of the first unrolled pack).
template <class T, int E>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, E>& x) {  // p 16-byte aligned
#pragma unroll
  for (int k = 0; k < Pack<T, E>::kWords; ++k) {
    uint4 w;
    memcpy(&w, reinterpret_cast<const char*>(&x) + 16 * k, 16);
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(reinterpret_cast<uint4*>(p) + k), "r"(w.x),
                 "r"(w.y), "r"(w.z), "r"(w.w)
                 : "memory");
  }
}

// A Body has: static constexpr int E (elements a pack) and unsigned kUnroll
// (packs a thread has in flight); a type Loaded; and the device members
//   Loaded load(size_t i) const;                // elements [i, i + E), every array aligned there
//   void store(size_t i, const Loaded&) const;  // computes and writes them
//   void one(size_t i) const;                   // element i alone
template <class Body>
__global__ void __launch_bounds__(kThreads) packed_kernel(Body body, size_t head, size_t packs, size_t n) {
  constexpr unsigned kUnroll = Body::kUnroll;
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
  constexpr unsigned kUnroll = Body::kUnroll;
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

inline unsigned blocks_for(size_t units, unsigned unroll) {
  const size_t kPerBlock = size_t{kThreads} * unroll;
  return static_cast<unsigned>(std::max<size_t>(1, (units + kPerBlock - 1) / kPerBlock));
}

// Runs body over elements [0, n) on stream; `arrays` are the ones it reads and writes.
template <class Body>
void launch(const Body& body, size_t n, std::initializer_list<Array> arrays, cudaStream_t stream) {
  if (n == 0) return;
  const size_t head = aligned_head(arrays);
  if (head == kNeverAligned) {
    scalar_kernel<<<blocks_for(n, Body::kUnroll), kThreads, 0, stream>>>(body, n);
    return;
  }
  const size_t h = std::min(head, n);
  const size_t packs = (n - h) / Body::E;
  packed_kernel<<<blocks_for(packs, Body::kUnroll), kThreads, 0, stream>>>(body, h, packs, n);
}

}  // namespace tandem::cuda
