// Reading and writing elements of any tandem dtype as double, for tests that
// state expected values in closed form.
#pragma once

#include <cstdint>
#include <cstring>

#include "tandem/reduce.h"
#include "tandem/types.h"

namespace tandem::testing {

inline uint16_t to_half(float x, DataType t) {
  uint16_t h;
  if (t == DataType::f16) f32_to_f16(&x, &h, 1);
  else f32_to_bf16(&x, &h, 1);
  return h;
}
inline float from_half(uint16_t h, DataType t) {
  float x;
  if (t == DataType::f16) f16_to_f32(&h, &x, 1);
  else bf16_to_f32(&h, &x, 1);
  return x;
}

inline void put(DataType t, void* buf, size_t i, double v) {
  switch (t) {
    case DataType::f32: static_cast<float*>(buf)[i] = float(v); break;
    case DataType::f64: static_cast<double*>(buf)[i] = v; break;
    case DataType::f16:
    case DataType::bf16: static_cast<uint16_t*>(buf)[i] = to_half(float(v), t); break;
    case DataType::i32: static_cast<int32_t*>(buf)[i] = int32_t(v); break;
    case DataType::i64: static_cast<int64_t*>(buf)[i] = int64_t(v); break;
    case DataType::u8: static_cast<uint8_t*>(buf)[i] = uint8_t(v); break;
  }
}

inline double get(DataType t, const void* buf, size_t i) {
  switch (t) {
    case DataType::f32: return static_cast<const float*>(buf)[i];
    case DataType::f64: return static_cast<const double*>(buf)[i];
    case DataType::f16:
    case DataType::bf16: return from_half(static_cast<const uint16_t*>(buf)[i], t);
    case DataType::i32: return static_cast<const int32_t*>(buf)[i];
    case DataType::i64: return double(static_cast<const int64_t*>(buf)[i]);
    case DataType::u8: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

inline bool is_float(DataType t) {
  return t == DataType::f32 || t == DataType::f64 || t == DataType::f16 || t == DataType::bf16;
}

// The value ReduceOp::avg yields for an exact integer sum over n ranks.
inline double avg_of(DataType t, double sum, int n) {
  switch (t) {
    case DataType::f64: return sum / n;
    case DataType::f32: return double(float(sum) / float(n));
    case DataType::f16:
    case DataType::bf16: return from_half(to_half(float(sum) / float(n), t), t);
    default: return double(int64_t(sum) / n);  // integers truncate toward zero
  }
}

// Inputs chosen so every partial result is exact in every dtype (u8 included):
// rank r's element i, and the expected result over n ranks, per operation.
inline double input_value(ReduceOp op, DataType t, int r, size_t i) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return double((r + 1) * int(i % 5 + 1));
    case ReduceOp::prod: return double(1 + (i + r) % 2);
    case ReduceOp::min:
    case ReduceOp::max: return double(int((i + 3 * r) % 11)) - (t == DataType::u8 ? 0 : 5);
  }
  return 0;
}

inline double expected_value(ReduceOp op, DataType t, int n, size_t i) {
  switch (op) {
    case ReduceOp::sum: return double(i % 5 + 1) * n * (n + 1) / 2;
    case ReduceOp::avg: return avg_of(t, double(i % 5 + 1) * n * (n + 1) / 2, n);
    case ReduceOp::prod: {
      // ranks r with (i + r) odd contribute a factor 2
      int twos = (i % 2 == 0) ? n / 2 : (n + 1) / 2;
      return double(int64_t(1) << twos);
    }
    case ReduceOp::min:
    case ReduceOp::max: {
      double best = input_value(op, t, 0, i);
      for (int r = 1; r < n; ++r) {
        double v = input_value(op, t, r, i);
        best = op == ReduceOp::min ? std::min(best, v) : std::max(best, v);
      }
      return best;
    }
  }
  return 0;
}

// FNV-1a over raw bytes: equal hashes across ranks show bitwise-identical results.
inline int64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return int64_t(h >> 1);
}

}  // namespace tandem::testing
