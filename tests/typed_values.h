// Element access and check patterns for tests that state expected values in
// closed form (the same patterns `tandem bench -c 1` checks).
#pragma once

#include <cstdint>

#include "tandem/bench/check.h"
#include "tandem/types.h"

namespace tandem::testing {

using bench::expected_value;
using bench::input_value;

inline void put(DataType t, void* buf, size_t i, double v) { store_element(t, buf, i, v); }
inline double get(DataType t, const void* buf, size_t i) { return load_element(t, buf, i); }

// FNV-1a over raw bytes: equal hashes across ranks show bitwise-identical results.
inline int64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return int64_t(h >> 1);
}

}  // namespace tandem::testing
