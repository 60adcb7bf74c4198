// AVX-512 codec kernels (AVX-512 F/BW/VL/DQ with AVX2, FMA and F16C, as
// comm/reduce's; only called when the CPU has them). Bitwise identical to the
// scalar functors, as the AVX2 kernels. bf16 is rounded with integer
// operations: vcvtneps2bf16 (AVX512_BF16) treats subnormals as zero.
// GCC 12 warns falsely inside its own intrinsics headers (GCC PR105593), as in
// comm/reduce/reduce_avx512.cc; the suppression covers only the header.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "codec_loops.h"

namespace tandem::codec {
namespace {

struct F32Lanes {
  using V = __m512;
  static constexpr size_t W = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V splat(float x) { return _mm512_set1_ps(x); }
};

// W 16-bit values of storage type T_ in one register.
template <class T_>
struct Lanes16 : F32Lanes {
  using T = T_;
  using H = __m256i;
  static H load16(const T* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store16(T* p, H h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
};

struct F16Lanes : Lanes16<f16_t> {
  static H narrow(V v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V widen(H h) { return _mm512_cvtph_ps(h); }
};

struct BF16Lanes : Lanes16<bf16_t> {
  static H narrow(V v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7F800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));  // lanes fit in 16 bits
  }
  static V widen(H h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
};

}  // namespace

const CodecKernels kAvx512Codecs = {format_kernels<F16Lanes>(), format_kernels<BF16Lanes>()};

}  // namespace tandem::codec
