// Gradient compression: f32 all-reduces whose values travel in 16 bits.
//
// A CompressedAllreduce wraps a Communicator. Each call
//   1. prescales the f32 input by R/P (P = predivide factor, default the
//      world size; R the range scale below) and rounds it to fp16 or bf16 (nearest-even) into a 16-bit
//      staging buffer from Communicator::allocate_shared (so on one host the
//      direct shared-memory path carries the 16-bit values, reused across calls);
//   2. all-reduces the staging buffer with the communicator's f16/bf16 sum,
//      which widens to f32, adds and rounds back once per ring hop or
//      shared-memory fold: accumulation is never done in 16 bits;
//   3. checks the 16-bit result for inf/NaN. The all-reduce leaves every rank
//      with bitwise-identical bytes, so every rank takes the same branch with
//      no extra agreement step. Finite: widen to f32 and postscale (sum: by P/R;
//      avg: by P/(N R)) into the caller's buffer. Not finite (an overflow, or a
//      non-finite input): the call re-runs as a plain f32 all-reduce of the
//      caller's untouched data and counts a fallback. No inf produced by the
//      codec ever reaches the caller; the result is non-finite only when the
//      f32 all-reduce's own result is.
//
// Predivide, as Horovod's gradient_predivide_factor: values are divided by P
// before the sum and multiplied back after it (avg: by P/N, so the division
// by N is split between before and after). P = N (the default here, 0)
// keeps the 16-bit partial sums within the range of the inputs, so N ranks
// near fp16's maximum do not overflow; P = 1 is "sum, then divide".
//
// Range scale (fp16 only, on by default): fp16's normal range starts at
// 2^-14, and most gradient components lie below it (subnormal, or 0 below
// 2^-24), so the encoding also multiplies by a power of two R and the
// decoding divides by it: exact, and it lifts small values into the range
// where fp16 keeps 11 bits. R starts at 2^10, halves after a call that
// overflowed (which falls back as above; never below 1) and doubles after
// 1000 calls in a row that did not (never above 2^24): AMP's dynamic loss
// scaling, moved to the wire. Every rank sees the same 16-bit result, so
// every rank moves R the same way with no agreement step.
//
// Error feedback (optional, per call): the caller owns a residual of `count`
// floats (zero at first). The call sends v = data + residual (and leaves v in
// `data` until the result overwrites it) and stores the new rounding error
// (v R/P - 16-bit(v R/P)) * P/R in the residual, so what rounding dropped in
// one step is sent in the next. On a fallback v travels exactly in f32 and
// the residual is cleared.
//
// Not thread-safe: one call at a time per object (as for a collective).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "tandem/communicator.h"
#include "tandem/types.h"

namespace tandem::compression {

enum class Codec : uint8_t { none, fp16, bf16 };

// "fp16"/"bf16"/"none" (also "float16", "half", "bfloat16"), and Determined's
// gradient_compression booleans: "true" -> fp16, "false" -> none.
// Case-insensitive; nullopt for anything else.
std::optional<Codec> parse_codec(std::string_view s);
std::string_view to_string(Codec c);

// The communicator's dtype for a 16-bit codec (f16 or bf16); none -> f32.
DataType wire_dtype(Codec c);

// The stated error bound of one compressed all-reduce at one element, for op
// sum (divide by N for avg): with u the unit roundoff (fp16 2^-11, bf16 2^-8),
// N ranks, P the predivide factor and S the sum over ranks of |x_r|, each
// input is rounded once when encoded and each of the N-1 additions rounds its
// partial sum (at most S/P) once, so
//   |result - exact| <= 2N u S + 2N P 2^-24 (fp16's subnormal spacing; bf16: 0)
// (2N rather than 2N-1 leaves room for the f32 scaling). none: 0. The range
// scale R >= 1 only divides the subnormal term, so the bound holds for any R.
double error_bound(Codec c, int world_size, double predivide, double magnitude_sum);

struct CompressionOptions {
  Codec codec = Codec::none;
  // P, Horovod's gradient_predivide_factor: prescale by 1/P before the sum,
  // postscale after (sum: by P, avg: by P/N). 0 = the world size. Must be >= 0.
  double predivide_factor = 0;
  // Whether callers are expected to pass a residual (informational for the
  // gradient-sync engine; allreduce() uses whatever residual it is given).
  bool error_feedback = false;
  // fp16's range scale (above). false: values travel at 1/P, as before it.
  bool range_scale = true;
};

struct CompressionStats {                                   // cumulative
  uint64_t calls = 0, compressed_calls = 0, fallbacks = 0;  // fallbacks: re-sent uncompressed after inf/NaN
  uint64_t payload_bytes = 0, wire_bytes = 0;               // f32 bytes handed in, bytes actually reduced
  double cast_seconds = 0;                                  // encode, inf/NaN scan, decode
};

class CompressedAllreduce {
 public:
  // Throws InvalidArgument for a negative or non-finite predivide factor.
  CompressedAllreduce(Communicator& comm, CompressionOptions options);
  ~CompressedAllreduce();
  CompressedAllreduce(const CompressedAllreduce&) = delete;
  CompressedAllreduce& operator=(const CompressedAllreduce&) = delete;

  // In-place all-reduce of f32 `data` (op sum or avg; others throw
  // InvalidArgument) through the codec; host memory only. residual: optional
  // error-feedback memory of `count` floats owned by the caller (added before
  // encoding, updated with the new rounding error). Returns false when it fell
  // back to f32 for this call (the same on every rank). Codec::none is a plain
  // f32 all-reduce. Collective errors propagate as from Communicator::allreduce.
  bool allreduce(float* data, size_t count, ReduceOp op, const CollectiveOptions& opts = {}, float* residual = nullptr);

  const CompressionStats& stats() const { return stats_; }
  const CompressionOptions& options() const { return options_; }
  // The predivide factor in effect (options().predivide_factor, or the world size for 0).
  double predivide() const;
  // The range scale R the next call encodes with (1 unless fp16 with range_scale).
  float range_scale() const { return range_scale_; }

  static constexpr float kInitialRangeScale = 0x1p10f, kMaxRangeScale = 0x1p24f;
  static constexpr uint32_t kRangeGrowthCalls = 1000;

 private:
  void reserve_stage(size_t count);
  void adjust_range_scale(bool overflowed);

  Communicator& comm_;
  CompressionOptions options_;
  CompressionStats stats_;
  uint16_t* stage_ = nullptr;  // allocate_shared, grown on demand, reused across calls
  size_t stage_count_ = 0;
  float range_scale_ = 1.0f;
  uint32_t calls_since_overflow_ = 0;
};

// ---- the codec on its own (run-time dispatch: AVX-512, AVX2+F16C, scalar) ----
// codec must be fp16 or bf16 (InvalidArgument otherwise). Rounding is to
// nearest-even; NaN stays NaN (made quiet), inf stays inf, and finite values
// beyond the format's range become inf (fp16: |x| >= 65520).

// dst[i] = 16-bit(src[i] * scale)
void encode(Codec codec, const float* src, uint16_t* dst, size_t count, float scale);
// Error feedback: v = data[i] + residual[i]; y = v * scale; dst[i] = 16-bit(y);
// data[i] = v; residual[i] = (y - f32(dst[i])) * unscale.
void encode_feedback(Codec codec, float* data, float* residual, uint16_t* dst, size_t count, float scale,
                     float unscale);
// dst[i] = f32(src[i]) * scale
void decode(Codec codec, const uint16_t* src, float* dst, size_t count, float scale);
// Whether no element is inf or NaN.
bool all_finite(Codec codec, const uint16_t* src, size_t count);

// The same on buffers of the given memory type. MemoryType::cuda runs the CUDA
// kernels (the same element functors; tests/gpu checks them on a GPU) and
// waits for them; it throws InvalidArgument in a build without
// TANDEM_WITH_CUDA, and tandem::Error when the launch fails.
void encode(MemoryType memory, Codec codec, const float* src, uint16_t* dst, size_t count, float scale);
void encode_feedback(MemoryType memory, Codec codec, float* data, float* residual, uint16_t* dst, size_t count,
                     float scale, float unscale);
void decode(MemoryType memory, Codec codec, const uint16_t* src, float* dst, size_t count, float scale);
bool all_finite(MemoryType memory, Codec codec, const uint16_t* src, size_t count);

}  // namespace tandem::compression
