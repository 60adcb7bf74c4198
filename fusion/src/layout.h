// Where gradients live and how they are cut into buckets; pure functions, the
// same on every rank for the same registrations and settings.
//
// Arena: one per dtype, holding that dtype's gradients in reverse
// registration order, each padded to kAlignBytes. Bucket: a run of gradients
// consecutive in reverse registration order, of one dtype, so a contiguous
// range of one arena. The first bucket is cut at first_bucket_bytes, the
// others at fusion_threshold_bytes; a gradient larger than the cap gets a
// bucket of its own. With last_bucket_bytes, the last bucket holds the
// input-side gradients up to that size (at least one).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tandem/fusion/gradient_sync.h"

namespace tandem::fusion {

inline constexpr size_t kAlignBytes = 64;

struct TensorSpec {
  std::string name;
  size_t count = 0;
  DataType dtype = DataType::f32;
};

struct Placement {
  int arena = 0;      // index into ArenaLayout::dtypes
  size_t offset = 0;  // bytes from the arena's start
  size_t padded = 0;  // bytes it occupies (count * esize rounded up to kAlignBytes)
};

struct ArenaLayout {
  std::vector<DataType> dtypes;      // one arena per dtype, in order of first appearance backwards
  std::vector<size_t> bytes;         // each arena's size
  std::vector<Placement> placement;  // per gradient id
};

ArenaLayout lay_out(const std::vector<TensorSpec>& tensors);

struct Bucket {
  std::vector<int> ids;  // in launch order (reverse registration)
  int arena = 0;
  size_t offset = 0;  // bytes
  size_t bytes = 0;   // padded bytes of the range
  DataType dtype = DataType::f32;
};

std::vector<Bucket> cut_buckets(const std::vector<TensorSpec>& tensors, const ArenaLayout& layout,
                                const FusionSettings& settings, size_t last_bucket_bytes = 0);

// The order buckets are reduced in: bucket order, except that the last bucket
// (the input-side layers: the last gradients backward produces, the first
// parameters the next forward needs) goes ahead of the buckets before it that
// together hold at most `ahead_bytes`, and those follow it reversed: the
// backlog left when backward ends is reduced in the order the next forward
// uses it.
std::vector<int> launch_order(const std::vector<Bucket>& buckets, size_t ahead_bytes);

}  // namespace tandem::fusion
