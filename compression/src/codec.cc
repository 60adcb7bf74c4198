// The codec's public entry points: names, validation, and run-time dispatch
// to the kernels of the instruction set comm/reduce chose.
#include <algorithm>
#include <cctype>
#include <string>

#include "codec_cuda.h"
#include "codec_functors.h"
#include "codec_kernels.h"
#include "tandem/compression/compression.h"
#include "tandem/errors.h"

namespace tandem::codec {

const CodecKernels& codec_kernels(detail::Isa isa) {
  switch (isa) {
    case detail::Isa::avx512: return kAvx512Codecs;
    case detail::Isa::avx2: return kAvx2Codecs;
    case detail::Isa::scalar: break;
  }
  return kScalarCodecs;
}

}  // namespace tandem::codec

namespace tandem::compression {
namespace {

const codec::FormatKernels& kernels_for(Codec c, const char* what) {
  static const codec::CodecKernels& active = codec::codec_kernels(detail::active_isa());
  switch (c) {
    case Codec::fp16: return active.f16;
    case Codec::bf16: return active.bf16;
    case Codec::none: break;
  }
  throw InvalidArgument(std::string(what) + ": codec must be fp16 or bf16, got " + std::string(to_string(c)));
}

codec::Format cuda_format(Codec c, const char* what) {
  kernels_for(c, what);  // validates the codec
  return c == Codec::fp16 ? codec::Format::f16 : codec::Format::bf16;
}

}  // namespace

std::optional<Codec> parse_codec(std::string_view s) {
  std::string v(s);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (v == "fp16" || v == "float16" || v == "half" || v == "true") return Codec::fp16;
  if (v == "bf16" || v == "bfloat16") return Codec::bf16;
  if (v == "none" || v == "false") return Codec::none;
  return std::nullopt;
}

std::string_view to_string(Codec c) {
  switch (c) {
    case Codec::none: return "none";
    case Codec::fp16: return "fp16";
    case Codec::bf16: return "bf16";
  }
  return "unknown";
}

DataType wire_dtype(Codec c) {
  switch (c) {
    case Codec::fp16: return DataType::f16;
    case Codec::bf16: return DataType::bf16;
    case Codec::none: break;
  }
  return DataType::f32;
}

double error_bound(Codec c, int world_size, double predivide, double magnitude_sum) {
  const double n2 = 2.0 * world_size;
  switch (c) {
    case Codec::fp16: return n2 * 0x1p-11 * magnitude_sum + n2 * predivide * 0x1p-24;
    case Codec::bf16: return n2 * 0x1p-8 * magnitude_sum;
    case Codec::none: break;
  }
  return 0;
}

void encode(Codec c, const float* src, uint16_t* dst, size_t count, float scale) {
  kernels_for(c, "encode").encode(src, dst, count, scale);
}

void encode_feedback(Codec c, float* data, float* residual, uint16_t* dst, size_t count, float scale, float unscale) {
  kernels_for(c, "encode_feedback").encode_feedback(data, residual, dst, count, scale, unscale);
}

void decode(Codec c, const uint16_t* src, float* dst, size_t count, float scale) {
  kernels_for(c, "decode").decode(src, dst, count, scale);
}

bool all_finite(Codec c, const uint16_t* src, size_t count) {
  return kernels_for(c, "all_finite").all_finite(src, count);
}

// Device buffers: the CUDA kernels wait for their stream (the result is used
// right after). In a build without CUDA, codec_no_cuda.cc's versions refuse.
void encode(MemoryType memory, Codec c, const float* src, uint16_t* dst, size_t count, float scale) {
  if (memory == MemoryType::host) return encode(c, src, dst, count, scale);
  codec::encode_cuda(cuda_format(c, "encode"), src, dst, count, scale, nullptr);
  codec::synchronize_cuda(nullptr);
}

void encode_feedback(MemoryType memory, Codec c, float* data, float* residual, uint16_t* dst, size_t count, float scale,
                     float unscale) {
  if (memory == MemoryType::host) return encode_feedback(c, data, residual, dst, count, scale, unscale);
  codec::encode_feedback_cuda(cuda_format(c, "encode_feedback"), data, residual, dst, count, scale, unscale, nullptr);
  codec::synchronize_cuda(nullptr);
}

void decode(MemoryType memory, Codec c, const uint16_t* src, float* dst, size_t count, float scale) {
  if (memory == MemoryType::host) return decode(c, src, dst, count, scale);
  codec::decode_cuda(cuda_format(c, "decode"), src, dst, count, scale, nullptr);
  codec::synchronize_cuda(nullptr);
}

bool all_finite(MemoryType memory, Codec c, const uint16_t* src, size_t count) {
  if (memory == MemoryType::host) return all_finite(c, src, count);
  return codec::all_finite_cuda(cuda_format(c, "all_finite"), src, count, nullptr);
}

}  // namespace tandem::compression
