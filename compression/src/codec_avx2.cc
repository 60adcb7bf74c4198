// AVX2 + F16C codec kernels (built with -mavx2 -mfma -mf16c; only called when
// the CPU has them). Bitwise identical to the scalar functors: vcvtps2ph with
// round-to-nearest-even and vcvtph2ps are exactly fn::f32_to_f16_bits and
// fn::f16_bits_to_f32; bf16 is rounded with integer operations as fn does.
#include <immintrin.h>

#include "codec_loops.h"

namespace tandem::codec {
namespace {

struct F32Lanes {
  using V = __m256;
  static constexpr size_t W = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V splat(float x) { return _mm256_set1_ps(x); }
};

// W 16-bit values of storage type T_ in one register.
template <class T_>
struct Lanes16 : F32Lanes {
  using T = T_;
  using H = __m128i;
  static H load16(const T* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static void store16(T* p, H h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
};

struct F16Lanes : Lanes16<f16_t> {
  static H narrow(V v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static V widen(H h) { return _mm256_cvtph_ps(h); }
};

struct BF16Lanes : Lanes16<bf16_t> {
  // fn::f32_to_bf16_bits: NaN -> (x >> 16) | 0x40, else (x + 0x7FFF + lsb) >> 16.
  static H narrow(V v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);  // every lane in [0, 0xFFFF]
    // packus works per 128-bit half: [a0..a3 a0..a3 | a4..a7 a4..a7]; gather quadwords 0 and 2.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
    return _mm256_castsi256_si128(packed);
  }
  static V widen(H h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
};

}  // namespace

const CodecKernels kAvx2Codecs = {format_kernels<F16Lanes>(), format_kernels<BF16Lanes>()};

}  // namespace tandem::codec
