// f32 values at the edges of the 16-bit formats and of f32 itself, for the
// codec and conversion checks on the CPU (compression_test) and on the GPU
// (tests/gpu): signed zeros and ones; f16's largest value, the last that
// rounds down to it and the first that rounds to inf; f16's subnormal range
// and its ties; ties at 11 (f16) and 8 (bf16) bits, and just past one; f32's
// largest, a subnormal and the smallest; infinities; NaNs (quiet, signalling,
// negative with a payload).
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace tandem::testing {

inline const std::vector<float>& edge_floats() {
  const auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  using limits = std::numeric_limits<float>;
  static const std::vector<float> values = {0.0f,
                                            -0.0f,
                                            1.0f,
                                            -1.0f,
                                            65504.0f,
                                            65519.0f,
                                            65520.0f,
                                            -65520.0f,
                                            1e-8f,
                                            6e-8f,
                                            3e-8f,
                                            1.0f + 0x1p-11f,
                                            1.0f + 0x1p-8f,
                                            1.0f + 0x1p-8f + 0x1p-24f,
                                            3e38f,
                                            limits::max(),
                                            1e-40f,
                                            limits::denorm_min(),
                                            limits::infinity(),
                                            -limits::infinity(),
                                            limits::quiet_NaN(),
                                            bits(0x7F800001u),
                                            bits(0xFFC12345u)};
  return values;
}

}  // namespace tandem::testing
