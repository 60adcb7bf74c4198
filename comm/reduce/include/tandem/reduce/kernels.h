// tandem_reduce's kernel level: one table of kernels per instruction set, and
// the dispatcher's choice. compression/ follows its ISA choice; tests and
// benchmarks use kernel_table() to run a specific ISA; everything else goes
// through tandem/reduce.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "tandem/types.h"

namespace tandem::detail {

// Ordered: a higher ISA's kernels need every feature of the lower ones.
enum class Isa : uint8_t { scalar, avx2, avx512 };
inline constexpr Isa kAllIsas[] = {Isa::scalar, Isa::avx2, Isa::avx512};

struct KernelTable {
  void (*reduce)(DataType, ReduceOp, void* dst, const void* a, const void* b, size_t count);
  void (*scale_avg)(DataType, void* data, size_t count, int divisor);  // divisor > 0, checked by the caller
  void (*f32_to_f16)(const float* src, uint16_t* dst, size_t count);
  void (*f16_to_f32)(const uint16_t* src, float* dst, size_t count);
  void (*f32_to_bf16)(const float* src, uint16_t* dst, size_t count);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, size_t count);
  void (*reduce_many)(DataType, ReduceOp, void* dst, const void* const* sources, size_t nsources, size_t count);
};

// Defined in reduce_scalar.cc, reduce_avx2.cc and reduce_avx512.cc.
extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;

std::string_view to_string(Isa isa);
std::optional<Isa> parse_isa(std::string_view s);

// Whether this CPU can run the kernels built for `isa`.
bool cpu_supports(Isa isa);

// The kernels for `isa`; the caller must have checked cpu_supports(isa).
const KernelTable& kernel_table(Isa isa);

// Picked once (first call): the best supported ISA, capped by use_reduce_isa()
// (TANDEM_REDUCE_ISA, read by the settings reader) when it came first.
Isa active_isa();

}  // namespace tandem::detail
