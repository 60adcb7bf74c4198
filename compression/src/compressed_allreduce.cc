// CompressedAllreduce: the codec around the communicator's 16-bit all-reduce.
// Terms: P is the predivide factor, N the world size; "stage" is the 16-bit
// buffer (allocate_shared memory) that the all-reduce runs on.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "tandem/compression/compression.h"
#include "tandem/errors.h"

namespace tandem::compression {
namespace {

using Seconds = std::chrono::duration<double>;

double elapsed(Clock::time_point since) { return Seconds(Clock::now() - since).count(); }

}  // namespace

CompressedAllreduce::CompressedAllreduce(Communicator& comm, CompressionOptions options)
    : comm_(comm), options_(options) {
  if (!(options_.predivide_factor >= 0) || !std::isfinite(options_.predivide_factor)) {
    throw InvalidArgument("compression: predivide_factor must be finite and >= 0 (0 = world size), got " +
                          std::to_string(options_.predivide_factor));
  }
  if (options_.codec != Codec::none && options_.codec != Codec::fp16 && options_.codec != Codec::bf16) {
    throw InvalidArgument("compression: unknown codec " + std::to_string(static_cast<int>(options_.codec)));
  }
  if (options_.codec == Codec::fp16 && options_.range_scale) range_scale_ = kInitialRangeScale;
}

CompressedAllreduce::~CompressedAllreduce() {
  if (stage_) comm_.free_shared(stage_);
}

double CompressedAllreduce::predivide() const {
  return options_.predivide_factor > 0 ? options_.predivide_factor : double(comm_.size());
}

void CompressedAllreduce::reserve_stage(size_t count) {
  if (count <= stage_count_) return;
  // Every rank grows at the same calls (counts match across ranks), by at least
  // half, so a growing sequence of buckets reallocates only a few times.
  const size_t grown = std::max(count, stage_count_ + stage_count_ / 2);
  if (stage_) comm_.free_shared(stage_);
  stage_ = nullptr;
  stage_count_ = 0;
  stage_ = static_cast<uint16_t*>(comm_.allocate_shared(grown * sizeof(uint16_t)));
  stage_count_ = grown;
}

bool CompressedAllreduce::allreduce(float* data, size_t count, ReduceOp op, const CollectiveOptions& opts,
                                    float* residual) {
  if (op != ReduceOp::sum && op != ReduceOp::avg) {
    throw InvalidArgument("compressed allreduce: op must be sum or avg, got " + std::string(tandem::to_string(op)));
  }
  if (opts.memory != MemoryType::host) {
    throw InvalidArgument(
        "compressed allreduce: host buffers only (encode and decode device buffers with the MemoryType overloads)");
  }
  if (count != 0 && data == nullptr) {
    throw InvalidArgument("compressed allreduce: null buffer with count " + std::to_string(count));
  }
  ++stats_.calls;
  stats_.payload_bytes += count * sizeof(float);
  if (options_.codec == Codec::none) {
    comm_.allreduce(data, count, DataType::f32, op, opts);
    stats_.wire_bytes += count * sizeof(float);
    return true;
  }

  const double p = predivide();
  const double s = range_scale_;  // a power of two: scaling by it is exact
  const float prescale = static_cast<float>(s / p);
  const float postscale = static_cast<float>((op == ReduceOp::sum ? p : p / comm_.size()) / s);
  reserve_stage(std::max<size_t>(count, 1));

  auto t0 = Clock::now();
  if (residual) {
    encode_feedback(options_.codec, data, residual, stage_, count, prescale, static_cast<float>(p / s));
  } else {
    encode(options_.codec, data, stage_, count, prescale);
  }
  stats_.cast_seconds += elapsed(t0);

  comm_.allreduce(stage_, count, wire_dtype(options_.codec), ReduceOp::sum, opts);
  stats_.wire_bytes += count * sizeof(uint16_t);

  // Every rank holds the same 16 bits, so every rank decides the same here.
  t0 = Clock::now();
  const bool finite = all_finite(options_.codec, stage_, count);
  if (finite) decode(options_.codec, stage_, data, count, postscale);
  stats_.cast_seconds += elapsed(t0);
  adjust_range_scale(!finite);
  if (finite) {
    ++stats_.compressed_calls;
    return true;
  }

  // Overflow or a non-finite input: `data` still holds what was encoded; send it exactly.
  ++stats_.fallbacks;
  comm_.allreduce(data, count, DataType::f32, op, opts);
  stats_.wire_bytes += count * sizeof(float);
  if (residual) std::memset(residual, 0, count * sizeof(float));
  return false;
}

// Identical 16-bit results on every rank: every rank takes the same branch.
void CompressedAllreduce::adjust_range_scale(bool overflowed) {
  if (options_.codec != Codec::fp16 || !options_.range_scale) return;
  if (overflowed) {
    range_scale_ = std::max(1.0f, range_scale_ / 2);
    calls_since_overflow_ = 0;
  } else if (++calls_since_overflow_ >= kRangeGrowthCalls) {
    range_scale_ = std::min(kMaxRangeScale, range_scale_ * 2);
    calls_since_overflow_ = 0;
  }
}

}  // namespace tandem::compression
