// DataType / ReduceOp names and parsing.
#include "tandem/types.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "tandem/reduce.h"

namespace tandem {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::f32: return 4;
    case DataType::f64: return 8;
    case DataType::f16: return 2;
    case DataType::bf16: return 2;
    case DataType::i32: return 4;
    case DataType::i64: return 8;
    case DataType::u8: return 1;
  }
  return 0;
}

std::string_view to_string(DataType t) {
  switch (t) {
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::f16: return "f16";
    case DataType::bf16: return "bf16";
    case DataType::i32: return "i32";
    case DataType::i64: return "i64";
    case DataType::u8: return "u8";
  }
  return "unknown";
}

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::prod: return "prod";
  }
  return "unknown";
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

}  // namespace

// Case-insensitive. There is no signed 8-bit type, so nccl-tests' "int8" is rejected
// rather than silently treated as u8 (min/max would differ).
std::optional<DataType> parse_dtype(std::string_view s) {
  struct Name {
    std::string_view name;
    DataType type;
  };
  static constexpr Name kNames[] = {
      {"f32", DataType::f32},       {"float", DataType::f32},     {"float32", DataType::f32},
      {"f64", DataType::f64},       {"double", DataType::f64},    {"float64", DataType::f64},
      {"f16", DataType::f16},       {"half", DataType::f16},      {"float16", DataType::f16},
      {"bf16", DataType::bf16},     {"bfloat16", DataType::bf16}, {"i32", DataType::i32},
      {"int32", DataType::i32},     {"int", DataType::i32},       {"i64", DataType::i64},
      {"int64", DataType::i64},     {"u8", DataType::u8},         {"uint8", DataType::u8},
  };
  const std::string key = lower(s);
  for (const Name& n : kNames) {
    if (key == n.name) return n.type;
  }
  return std::nullopt;
}

std::optional<ReduceOp> parse_reduce_op(std::string_view s) {
  const std::string key = lower(s);
  for (ReduceOp op : kAllReduceOps) {
    if (key == to_string(op)) return op;
  }
  return std::nullopt;
}

double load_element(DataType t, const void* buffer, size_t i) {
  float f;
  switch (t) {
    case DataType::f32: return static_cast<const float*>(buffer)[i];
    case DataType::f64: return static_cast<const double*>(buffer)[i];
    case DataType::f16: f16_to_f32(static_cast<const uint16_t*>(buffer) + i, &f, 1); return f;
    case DataType::bf16: bf16_to_f32(static_cast<const uint16_t*>(buffer) + i, &f, 1); return f;
    case DataType::i32: return static_cast<const int32_t*>(buffer)[i];
    case DataType::i64: return double(static_cast<const int64_t*>(buffer)[i]);
    case DataType::u8: return static_cast<const uint8_t*>(buffer)[i];
  }
  return 0;
}

void store_element(DataType t, void* buffer, size_t i, double value) {
  const float f = float(value);
  switch (t) {
    case DataType::f32: static_cast<float*>(buffer)[i] = f; break;
    case DataType::f64: static_cast<double*>(buffer)[i] = value; break;
    case DataType::f16: f32_to_f16(&f, static_cast<uint16_t*>(buffer) + i, 1); break;
    case DataType::bf16: f32_to_bf16(&f, static_cast<uint16_t*>(buffer) + i, 1); break;
    case DataType::i32: static_cast<int32_t*>(buffer)[i] = int32_t(value); break;
    case DataType::i64: static_cast<int64_t*>(buffer)[i] = int64_t(value); break;
    case DataType::u8: static_cast<uint8_t*>(buffer)[i] = uint8_t(int64_t(value)); break;
  }
}

}  // namespace tandem
