// Public entry points of comm/reduce: validate arguments, then forward to the
// kernels of the instruction set chosen once at start-up.
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tandem/reduce/kernels.h"
#ifdef TANDEM_WITH_CUDA
#include "reduce_cuda.h"
#endif
#include "tandem/errors.h"
#include "tandem/reduce.h"

namespace tandem {
namespace detail {

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

std::optional<Isa> parse_isa(std::string_view s) {
  for (Isa isa : kAllIsas) {
    if (s == to_string(isa)) return isa;
  }
  return std::nullopt;
}

// F16C from CPUID leaf 1 (clang before 15 has no "f16c" for __builtin_cpu_supports).
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}

bool cpu_supports(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
    case Isa::avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::avx512:
      // reduce_avx512.cc is also built with -mavx2/-mfma/-mf16c/-mavx512dq, so require those too.
      return cpu_supports(Isa::avx2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

const KernelTable& kernel_table(Isa isa) {
  switch (isa) {
    case Isa::avx512: return kAvx512Kernels;
    case Isa::avx2: return kAvx2Kernels;
    case Isa::scalar: break;
  }
  return kScalarKernels;
}

namespace {

// The cap use_reduce_isa() set, as an Isa value; kNoCap: none yet.
constexpr int kNoCap = -1;
std::atomic<int> isa_cap{kNoCap};

Isa pick_isa() {
  const int set = isa_cap.load();
  const Isa cap = set == kNoCap ? Isa::avx512 : Isa(set);
  // Best supported ISA not above the cap; a cap the CPU lacks takes the best one below it.
  for (Isa isa : {Isa::avx512, Isa::avx2}) {
    if (isa <= cap && cpu_supports(isa)) return isa;
  }
  return Isa::scalar;
}

const KernelTable& active_kernels() {
  static const KernelTable& table = kernel_table(active_isa());
  return table;
}

void check(DataType dtype) {
  if (static_cast<uint8_t>(dtype) > static_cast<uint8_t>(DataType::u8)) {
    throw InvalidArgument("reduce: unknown dtype " + std::to_string(static_cast<int>(dtype)));
  }
}

void check(ReduceOp op) {
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::prod)) {
    throw InvalidArgument("reduce: unknown op " + std::to_string(static_cast<int>(op)));
  }
}

void check_pointers(size_t count, const void* p) {
  if (count != 0 && p == nullptr) throw InvalidArgument("reduce: null buffer with count " + std::to_string(count));
}

}  // namespace

Isa active_isa() {
  static const Isa isa = pick_isa();
  return isa;
}

}  // namespace detail

void use_reduce_isa(std::string_view name) {
  const auto isa = detail::parse_isa(name);
  if (!isa)
    throw InvalidArgument("reduce: unknown instruction set '" + std::string(name) + "'; use scalar, avx2 or avx512");
  detail::isa_cap.store(int(*isa));
}

void reduce(DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  detail::check(dtype);
  detail::check(op);
  detail::check_pointers(count, dst);
  detail::check_pointers(count, a);
  detail::check_pointers(count, b);
  detail::active_kernels().reduce(dtype, op, dst, a, b, count);
}

void reduce_many(DataType dtype, ReduceOp op, void* dst, const void* const* sources, size_t nsources, size_t count) {
  detail::check(dtype);
  detail::check(op);
  if (nsources < 2 || !sources) {
    throw InvalidArgument("reduce_many: needs an array of 2 or more sources, got " + std::to_string(nsources));
  }
  detail::check_pointers(count, dst);
  for (size_t j = 0; j < nsources; ++j) detail::check_pointers(count, sources[j]);
  // Two sources: the two-source kernel, so that a 2-rank fold runs what it ran before reduce_many.
  if (nsources == 2) return detail::active_kernels().reduce(dtype, op, dst, sources[0], sources[1], count);
  detail::active_kernels().reduce_many(dtype, op, dst, sources, nsources, count);
}

void scale_avg(DataType dtype, void* data, size_t count, int divisor) {
  detail::check(dtype);
  detail::check_pointers(count, data);
  if (divisor <= 0) throw InvalidArgument("scale_avg: divisor must be positive, got " + std::to_string(divisor));
  detail::active_kernels().scale_avg(dtype, data, count, divisor);
}

namespace {

// On the AMD EPYC hosts measured (glibc 2.36, 2026-11-26) memcpy of 2 KiB-384 KiB
// ran at 1.8-2.8 GB/s instead of 30-80 when dst - src was 1-31 modulo 4 KiB:
// every load matched the page offset of a store just issued (4K aliasing).
// Two heap buffers of one size sit exactly 16 bytes apart that way (malloc's
// header). Copied in 256-byte pieces from the end, no load follows a store to
// its offset: 25-50 GB/s there; elsewhere plain memcpy.
void copy_unaliased(void* dst, const void* src, size_t bytes) {
  constexpr size_t kPiece = 256, kStallMinBytes = 2048;
  const uintptr_t skew = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  if (skew == 0 || skew >= 32 || bytes <= kStallMinBytes) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  size_t end = bytes;
  for (; end >= kPiece; end -= kPiece) std::memcpy(d + end - kPiece, s + end - kPiece, kPiece);
  std::memcpy(d, s, end);
}

}  // namespace

void copy_streaming(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
#if defined(__SSE2__)
  // Whole destination lines by streaming stores: 16-byte stores, four per line.
  const size_t head = std::min(bytes, size_t(-reinterpret_cast<uintptr_t>(d) & 63));
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
    for (size_t k = 0; k < 64; k += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k)));
    }
  }
  _mm_sfence();  // ordered before whatever this thread publishes next
#endif
  std::memcpy(d, s, bytes);
}

#ifndef TANDEM_WITH_CUDA
namespace {

[[noreturn]] void no_cuda(const char* what) {
  throw InvalidArgument(std::string(what) + ": CUDA buffers need a build with TANDEM_WITH_CUDA=ON (and a GPU)");
}

}  // namespace
#endif

bool cuda_kernels_built() {
#ifdef TANDEM_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void reduce(MemoryType memory, DataType dtype, ReduceOp op, void* dst, const void* a, const void* b, size_t count) {
  if (memory == MemoryType::host) return reduce(dtype, op, dst, a, b, count);
#ifdef TANDEM_WITH_CUDA
  detail::reduce_cuda(dtype, op, dst, a, b, count, nullptr);
  detail::synchronize_cuda(nullptr);  // the result is sent right after
#else
  (void)dtype, (void)op, (void)dst, (void)a, (void)b, (void)count;
  no_cuda("reduce");
#endif
}

void scale_avg(MemoryType memory, DataType dtype, void* data, size_t count, int divisor) {
  if (memory == MemoryType::host) return scale_avg(dtype, data, count, divisor);
#ifdef TANDEM_WITH_CUDA
  detail::scale_avg_cuda(dtype, data, count, divisor, nullptr);
  detail::synchronize_cuda(nullptr);
#else
  (void)dtype, (void)data, (void)count, (void)divisor;
  no_cuda("scale_avg");
#endif
}

void copy(MemoryType memory, void* dst, const void* src, size_t bytes) {
  if (memory == MemoryType::host) {
    if (bytes > 0 && dst != src) copy_unaliased(dst, src, bytes);
    return;
  }
#ifdef TANDEM_WITH_CUDA
  detail::copy_cuda(dst, src, bytes, nullptr);
  detail::synchronize_cuda(nullptr);
#else
  (void)dst, (void)src, (void)bytes;
  no_cuda("copy");
#endif
}

void* allocate(MemoryType memory, size_t bytes) {
  if (memory == MemoryType::host) {
    void* p = std::aligned_alloc(4096, (bytes + 4095) & ~size_t(4095));
    if (!p) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
#ifdef TANDEM_WITH_CUDA
  return detail::allocate_cuda(bytes);
#else
  no_cuda("allocate");
#endif
}

void deallocate(MemoryType memory, void* p) {
  if (memory == MemoryType::host) return std::free(p);
#ifdef TANDEM_WITH_CUDA
  detail::free_cuda(p);
#else
  (void)p;
#endif
}

std::string_view reduce_isa() { return detail::to_string(detail::active_isa()); }

void f32_to_f16(const float* src, uint16_t* dst, size_t count) { detail::active_kernels().f32_to_f16(src, dst, count); }
void f16_to_f32(const uint16_t* src, float* dst, size_t count) { detail::active_kernels().f16_to_f32(src, dst, count); }
void f32_to_bf16(const float* src, uint16_t* dst, size_t count) {
  detail::active_kernels().f32_to_bf16(src, dst, count);
}
void bf16_to_f32(const uint16_t* src, float* dst, size_t count) {
  detail::active_kernels().bf16_to_f32(src, dst, count);
}

}  // namespace tandem
