// Data-check patterns shared by `tandem bench -c 1` and the tests: per-rank
// inputs whose reduction has a closed form, exact in every dtype (u8
// included) for world sizes up to 4 and within dtype rounding beyond.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/types.h"

namespace tandem::bench {

// Rank r's element i for an all-reduce with `op`.
double input_value(ReduceOp op, DataType t, int rank, size_t i);

// The all-reduce result over n ranks at element i, with ReduceOp::avg's rounding rules.
double expected_value(ReduceOp op, DataType t, int n, size_t i);

// Elements of `out` farther from expected_value than the dtype's tolerance
// for n ranks (zero for integers and for exact cases).
long count_wrong(ReduceOp op, DataType t, int n, const void* out, size_t count);

}  // namespace tandem::bench
