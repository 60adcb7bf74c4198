// AVX-512 (F/BW/VL/DQ) kernels; same structure as reduce_avx2.cc with 512-bit
// registers and mask-based blends. Bitwise identical to the scalar functors.
// GCC 12 warns falsely about _mm512_undefined_*() inside its own intrinsics
// headers (GCC PR105593); the suppression covers only the header's lines.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "simd_loop.h"
#include "tandem/reduce/kernels.h"

namespace tandem::detail {
namespace {

using fn::bf16_t;
using fn::f16_t;

// ---- arithmetic on registers ----

struct F32Ops {
  static __m512 sum(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static __m512 prod(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  // vminps/vmaxps return b when either input is NaN; the functors return a when a is NaN.
  static __m512 min(__m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_min_ps(a, b), a);
  }
  static __m512 max(__m512 a, __m512 b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
  }
  static __m512 div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
  static __m512 splat(int d) { return _mm512_set1_ps(static_cast<float>(d)); }
};

struct F64Ops {
  static __m512d sum(__m512d a, __m512d b) { return _mm512_add_pd(a, b); }
  static __m512d prod(__m512d a, __m512d b) { return _mm512_mul_pd(a, b); }
  static __m512d min(__m512d a, __m512d b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), _mm512_min_pd(a, b), a);
  }
  static __m512d max(__m512d a, __m512d b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), _mm512_max_pd(a, b), a);
  }
  static __m512d div(__m512d a, __m512d b) { return _mm512_div_pd(a, b); }
  static __m512d splat(int d) { return _mm512_set1_pd(static_cast<double>(d)); }
};

struct I32Ops {
  static __m512i sum(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }
  static __m512i prod(__m512i a, __m512i b) { return _mm512_mullo_epi32(a, b); }
  static __m512i min(__m512i a, __m512i b) { return _mm512_min_epi32(a, b); }
  static __m512i max(__m512i a, __m512i b) { return _mm512_max_epi32(a, b); }
};

struct I64Ops {
  static __m512i sum(__m512i a, __m512i b) { return _mm512_add_epi64(a, b); }
  static __m512i prod(__m512i a, __m512i b) { return _mm512_mullo_epi64(a, b); }  // AVX512DQ
  static __m512i min(__m512i a, __m512i b) { return _mm512_min_epi64(a, b); }
  static __m512i max(__m512i a, __m512i b) { return _mm512_max_epi64(a, b); }
};

struct U8Ops {
  static __m512i sum(__m512i a, __m512i b) { return _mm512_add_epi8(a, b); }
  // No 8-bit multiply: multiply even and odd bytes as 16-bit lanes, keep the low byte of each.
  static __m512i prod(__m512i a, __m512i b) {
    const __m512i even = _mm512_mullo_epi16(a, b);
    const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
    return _mm512_mask_blend_epi8(0xAAAAAAAAAAAAAAAAull, even, _mm512_slli_epi16(odd, 8));
  }
  static __m512i min(__m512i a, __m512i b) { return _mm512_min_epu8(a, b); }
  static __m512i max(__m512i a, __m512i b) { return _mm512_max_epu8(a, b); }
};

// ---- lane traits ----

struct F32 {
  using T = float;
  using V = __m512;
  using Ops = F32Ops;
  static constexpr size_t W = 16;
  static V load(const T* p) { return _mm512_loadu_ps(p); }
  static void store(T* p, V v) { _mm512_storeu_ps(p, v); }
};

struct F64 {
  using T = double;
  using V = __m512d;
  using Ops = F64Ops;
  static constexpr size_t W = 8;
  static V load(const T* p) { return _mm512_loadu_pd(p); }
  static void store(T* p, V v) { _mm512_storeu_pd(p, v); }
};

struct F16 {
  using T = f16_t;
  using V = __m512;
  using Ops = F32Ops;
  static constexpr size_t W = 16;
  static V load(const T* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(T* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// Not vcvtneps2bf16 (AVX512_BF16): it flushes subnormals, so it would not match the functors.
struct BF16 {
  using T = bf16_t;
  using V = __m512;
  using Ops = F32Ops;
  static constexpr size_t W = 16;
  static V load(const T* p) {
    const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  }
  static void store(T* p, V v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i hi = _mm512_srli_epi32(x, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __m512i nan = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    const __m512i r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));  // truncating narrow
  }
};

template <class Elem, class IntOps>
struct Int {
  using T = Elem;
  using V = __m512i;
  using Ops = IntOps;
  static constexpr size_t W = 64 / sizeof(Elem);
  static V load(const T* p) { return _mm512_loadu_si512(p); }
  static void store(T* p, V v) { _mm512_storeu_si512(p, v); }
};
using I32 = Int<int32_t, I32Ops>;
using I64 = Int<int64_t, I64Ops>;
using U8 = Int<uint8_t, U8Ops>;

}  // namespace

extern const KernelTable kAvx512Kernels = simd::Table<F32, F64, F16, BF16, I32, I64, U8>::kernels();

}  // namespace tandem::detail
