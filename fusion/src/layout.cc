#include "layout.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace tandem::fusion {
namespace {
size_t padded_bytes(const TensorSpec& t) {
  const size_t raw = t.count * dtype_size(t.dtype);
  return (raw + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}
}  // namespace

ArenaLayout lay_out(const std::vector<TensorSpec>& tensors) {
  ArenaLayout out;
  out.placement.resize(tensors.size());
  std::map<DataType, int> arena_of;
  for (size_t i = tensors.size(); i-- > 0;) {
    const TensorSpec& t = tensors[i];
    auto [it, added] = arena_of.emplace(t.dtype, int(out.dtypes.size()));
    if (added) {
      out.dtypes.push_back(t.dtype);
      out.bytes.push_back(0);
    }
    Placement& p = out.placement[i];
    p.arena = it->second;
    p.offset = out.bytes[size_t(p.arena)];
    p.padded = padded_bytes(t);
    out.bytes[size_t(p.arena)] += p.padded;
  }
  return out;
}

std::vector<Bucket> cut_buckets(const std::vector<TensorSpec>& tensors, const ArenaLayout& layout,
                                const FusionSettings& settings, size_t last_bucket_bytes) {
  // Gradients [0, input) form the last bucket: at least one, in gradient 0's arena.
  size_t input = 0;
  if (last_bucket_bytes > 0 && !tensors.empty()) {
    size_t total = 0;
    while (input < tensors.size() && layout.placement[input].arena == layout.placement[0].arena &&
           total + layout.placement[input].padded <= last_bucket_bytes)
      total += layout.placement[input++].padded;
    input = std::max<size_t>(input, 1);
  }
  std::vector<Bucket> buckets;
  for (size_t i = tensors.size(); i-- > 0;) {
    const Placement& p = layout.placement[i];
    Bucket* open = buckets.empty() ? nullptr : &buckets.back();
    // The open bucket is the first one while there is only one.
    size_t limit = buckets.size() == 1 ? settings.first_bucket_bytes : settings.fusion_threshold_bytes;
    if (i + 1 < input) limit = std::max(limit, last_bucket_bytes);
    const bool fits = open && i + 1 != input && open->arena == p.arena && open->offset + open->bytes == p.offset &&
                      open->bytes + p.padded <= limit;
    if (!fits) {
      buckets.push_back(Bucket{{}, p.arena, p.offset, 0, tensors[i].dtype});
      open = &buckets.back();
    }
    open->ids.push_back(int(i));
    open->bytes += p.padded;
  }
  return buckets;
}

std::vector<int> launch_order(const std::vector<Bucket>& buckets, size_t ahead_bytes) {
  std::vector<int> order(buckets.size());
  std::iota(order.begin(), order.end(), 0);
  if (buckets.size() < 2) return order;
  size_t at = buckets.size() - 1, passed = 0;
  while (at > 0 && passed + buckets[at - 1].bytes <= ahead_bytes) passed += buckets[--at].bytes;
  std::reverse(order.begin() + long(at), order.end());
  return order;
}

}  // namespace tandem::fusion
