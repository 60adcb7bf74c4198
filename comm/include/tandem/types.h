// Element types, reduction operations and deadlines shared by every layer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tandem/collective.h"

namespace tandem {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

enum class DataType : uint8_t { f32, f64, f16, bf16, i32, i64, u8 };
inline constexpr DataType kAllDataTypes[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16,
                                             DataType::i32, DataType::i64, DataType::u8};

// avg is sum divided by the world size, computed once by the rank that owns
// the fully reduced chunk: in f32 for f16/bf16/f32, in f64 for f64, and for
// integers as integer division truncating toward zero (C++ semantics), so
// every rank still ends bitwise identical.
enum class ReduceOp : uint8_t { sum, avg, min, max, prod };
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min, ReduceOp::max,
                                             ReduceOp::prod};

// Where a buffer lives. Collectives on CUDA buffers need a CUDA-aware UCX (docs/cuda.md).
enum class MemoryType : uint8_t { host, cuda };

size_t dtype_size(DataType t);
std::string_view to_string(DataType t);
std::string_view to_string(ReduceOp op);
// Accepts nccl-tests spellings too (float, half, bfloat16, double, int32, int64, uint8).
std::optional<DataType> parse_dtype(std::string_view s);
std::optional<ReduceOp> parse_reduce_op(std::string_view s);

// Element i of a buffer of type t, as double and back (f16/bf16 round to
// nearest even, integers truncate). For checks and tools, not for hot loops.
double load_element(DataType t, const void* buffer, size_t i);
void store_element(DataType t, void* buffer, size_t i, double value);

}  // namespace tandem
