// Data-check patterns shared by `tandem bench -c 1` and the tests: per-rank
// inputs whose reduction (all-reduce, reduce-scatter) has a closed form, exact in every dtype (u8
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
// for n ranks (zero for integers and for exact cases). out[j] is element
// first + j of the all-reduce (reduce-scatter: rank r's block starts at r * count).
long count_wrong(ReduceOp op, DataType t, int n, const void* out, size_t count, size_t first = 0);

// Rank r's element i for collectives that only move data (allgather,
// broadcast): small integers, exact in every dtype, different for every rank.
double moved_value(int rank, size_t i);

// Elements of `out` that differ from moved_value(rank, first + j).
long count_wrong_moved(DataType t, int rank, const void* out, size_t count, size_t first = 0);

}  // namespace tandem::bench
