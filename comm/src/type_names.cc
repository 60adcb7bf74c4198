// DataType / ReduceOp sizes, names and parsing: nothing but the standard
// library, so tests/gpu builds this file too.
#include <algorithm>
#include <cctype>
#include <string>

#include "tandem/types.h"

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
      {"f32", DataType::f32},     {"float", DataType::f32},   {"float32", DataType::f32},   {"f64", DataType::f64},
      {"double", DataType::f64},  {"float64", DataType::f64}, {"f16", DataType::f16},       {"half", DataType::f16},
      {"float16", DataType::f16}, {"bf16", DataType::bf16},   {"bfloat16", DataType::bf16}, {"i32", DataType::i32},
      {"int32", DataType::i32},   {"int", DataType::i32},     {"i64", DataType::i64},       {"int64", DataType::i64},
      {"u8", DataType::u8},       {"uint8", DataType::u8},
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

}  // namespace tandem
