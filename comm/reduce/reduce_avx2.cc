// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; only called
// when the CPU has them). Results are bitwise identical to the scalar functors.
#include <immintrin.h>

#include "simd_loop.h"
#include "tandem/reduce/kernels.h"

namespace tandem::detail {
namespace {

using fn::bf16_t;
using fn::f16_t;

// ---- arithmetic on registers ----

struct F32Ops {
  static __m256 sum(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static __m256 prod(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  // minps/maxps return b when either input is NaN (and on ties), matching
  // fn::MinOp/MaxOp except when a is NaN: then the functors return a.
  static __m256 min(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256 max(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256 div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
  static __m256 splat(int d) { return _mm256_set1_ps(static_cast<float>(d)); }
};

struct F64Ops {
  static __m256d sum(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
  static __m256d prod(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
  static __m256d min(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static __m256d max(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
  static __m256d div(__m256d a, __m256d b) { return _mm256_div_pd(a, b); }
  static __m256d splat(int d) { return _mm256_set1_pd(static_cast<double>(d)); }
};

struct I32Ops {
  static __m256i sum(__m256i a, __m256i b) { return _mm256_add_epi32(a, b); }
  static __m256i prod(__m256i a, __m256i b) { return _mm256_mullo_epi32(a, b); }  // low 32 bits: wraps
  static __m256i min(__m256i a, __m256i b) { return _mm256_min_epi32(a, b); }
  static __m256i max(__m256i a, __m256i b) { return _mm256_max_epi32(a, b); }
};

struct I64Ops {
  static __m256i sum(__m256i a, __m256i b) { return _mm256_add_epi64(a, b); }
  // No 64-bit mullo in AVX2: lo*lo + ((hi*lo + lo*hi) << 32), all mod 2^64.
  static __m256i prod(__m256i a, __m256i b) {
    const __m256i lo = _mm256_mul_epu32(a, b);
    const __m256i cross =
        _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), b), _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)));
    return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
  }
  static __m256i min(__m256i a, __m256i b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b)); }
  static __m256i max(__m256i a, __m256i b) { return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(b, a)); }
};

struct U8Ops {
  static __m256i sum(__m256i a, __m256i b) { return _mm256_add_epi8(a, b); }
  // No 8-bit multiply: multiply even and odd bytes as 16-bit lanes, keep the low byte of each.
  static __m256i prod(__m256i a, __m256i b) {
    const __m256i even = _mm256_mullo_epi16(a, b);
    const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
    return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xFF)), _mm256_slli_epi16(odd, 8));
  }
  static __m256i min(__m256i a, __m256i b) { return _mm256_min_epu8(a, b); }
  static __m256i max(__m256i a, __m256i b) { return _mm256_max_epu8(a, b); }
};

// ---- lane traits: how a dtype is loaded into and stored from registers ----

struct F32 {
  using T = float;
  using V = __m256;
  using Ops = F32Ops;
  static constexpr size_t W = 8;
  static V load(const T* p) { return _mm256_loadu_ps(p); }
  static void store(T* p, V v) { _mm256_storeu_ps(p, v); }
};

struct F64 {
  using T = double;
  using V = __m256d;
  using Ops = F64Ops;
  static constexpr size_t W = 4;
  static V load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
};

// f16: F16C widens exactly and narrows with round-to-nearest-even, quietening NaN.
struct F16 {
  using T = f16_t;
  using V = __m256;
  using Ops = F32Ops;
  static constexpr size_t W = 8;
  static V load(const T* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(T* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// bf16: widen by shifting into the high half; narrow with the +0x7FFF+lsb
// rounding trick, NaN lanes replaced by the truncated bits with the quiet bit set.
struct BF16 {
  using T = bf16_t;
  using V = __m256;
  using Ops = F32Ops;
  static constexpr size_t W = 8;
  static V load(const T* p) {
    const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
  }
  static void store(T* p, V v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    // Every lane is <= 0xFFFF, so the unsigned-saturating pack just narrows.
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};

template <class Elem, class IntOps>
struct Int {
  using T = Elem;
  using V = __m256i;
  using Ops = IntOps;
  static constexpr size_t W = 32 / sizeof(Elem);
  static V load(const T* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(T* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};
using I32 = Int<int32_t, I32Ops>;
using I64 = Int<int64_t, I64Ops>;
using U8 = Int<uint8_t, U8Ops>;

}  // namespace

extern const KernelTable kAvx2Kernels = simd::Table<F32, F64, F16, BF16, I32, I64, U8>::kernels();

}  // namespace tandem::detail
