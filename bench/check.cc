#include "tandem/bench/check.h"

#include <algorithm>
#include <cmath>

namespace tandem::bench {
namespace {

// What ReduceOp::avg yields for an exact sum over n ranks.
double avg_of(DataType t, double sum, int n) {
  switch (t) {
    case DataType::f64: return sum / n;
    case DataType::f32: return double(float(sum) / float(n));  // true division in f32
    case DataType::f16:
    case DataType::bf16: {
      uint16_t h;  // the f32 quotient rounded to the dtype
      store_element(t, &h, 0, double(float(sum) / float(n)));
      return load_element(t, &h, 0);
    }
    default: return double(int64_t(sum) / n);  // integers truncate toward zero
  }
}

// Integer sums and products wrap in their dtype.
double wrap(DataType t, double v) {
  if (v >= 9.2e18) return v;  // beyond any test's reach
  if (t == DataType::u8) return double(uint8_t(int64_t(v)));
  if (t == DataType::i32) return double(int32_t(int64_t(v)));
  return v;
}

// Relative tolerance: inputs are small integers, so results are exact until
// partial sums outgrow the dtype's mantissa (many ranks).
double tolerance(DataType t, int n) {
  switch (t) {
    case DataType::f16: return n <= 8 ? 0 : 2e-3;
    case DataType::bf16: return n <= 4 ? 0 : 1.6e-2;
    default: return 0;
  }
}

}  // namespace

double input_value(ReduceOp op, DataType t, int rank, size_t i) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return double((rank + 1) * int(i % 5 + 1));
    case ReduceOp::prod: return double(1 + (i + rank) % 2);
    case ReduceOp::min:
    case ReduceOp::max: return double(int((i + 3 * size_t(rank)) % 11)) - (t == DataType::u8 ? 0 : 5);
  }
  return 0;
}

double expected_value(ReduceOp op, DataType t, int n, size_t i) {
  const double sum = double(i % 5 + 1) * n * (n + 1) / 2;
  switch (op) {
    case ReduceOp::sum: return wrap(t, sum);
    case ReduceOp::avg: return avg_of(t, sum, n);
    case ReduceOp::prod:  // ranks with (i + r) odd contribute a factor 2
      return wrap(t, std::ldexp(1.0, i % 2 == 0 ? n / 2 : (n + 1) / 2));
    case ReduceOp::min:
    case ReduceOp::max: {
      double best = input_value(op, t, 0, i);
      for (int r = 1; r < n; ++r) {
        const double v = input_value(op, t, r, i);
        best = op == ReduceOp::min ? std::min(best, v) : std::max(best, v);
      }
      return best;
    }
  }
  return 0;
}

long count_wrong(ReduceOp op, DataType t, int n, const void* out, size_t count, size_t first) {
  const double tol = tolerance(t, n);
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double want = expected_value(op, t, n, first + i), got = load_element(t, out, i);
    if (tol == 0 ? got != want : std::fabs(got - want) > tol * std::fabs(want)) ++wrong;
  }
  return wrong;
}

double moved_value(int rank, size_t i) { return double((i + 7 * size_t(rank)) % 61); }

long count_wrong_moved(DataType t, int rank, const void* out, size_t count, size_t first) {
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += load_element(t, out, i) != moved_value(rank, first + i);
  return wrong;
}

}  // namespace tandem::bench
