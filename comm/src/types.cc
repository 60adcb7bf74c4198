// Element access for checks and tools: load_element / store_element.
#include "tandem/types.h"

#include "tandem/reduce.h"

namespace tandem {

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
