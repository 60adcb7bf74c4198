// The engine thread: for each armed step, reduces the buckets in launch order
// as their gradients become ready, then the tail (see gradient_sync_impl.h).
#include <cstring>

#include "gradient_sync_impl.h"
#include "tandem/compression/compression.h"
#include "tandem/reduce.h"

namespace tandem::fusion {

void GradientSync::Impl::engine_main() {
  uint64_t seen = 0;
  for (;;) {
    if (!engine_wait([&] { return armed.load() > seen; })) return;
    seen = armed.load();
    std::exception_ptr error;
    try {
      run_step();
    } catch (...) {
      error = std::current_exception();
    }
    if (stop.load() && !error) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      done = seen;
      if (error && !failure) failure = error;
    }
    cv.notify_all();
  }
}

void GradientSync::Impl::run_step() {
  wire_bytes = 0;
  fallbacks = 0;
  cast_seconds = 0;
  saved_seconds = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const size_t b = size_t(order[i]);
    const bool last = i + 1 == order.size();
    if (!engine_wait([&] {
          return pending[b].load() == 0 && (opt.overlap || closing.load()) && (!last || !tail_rides || gate_open());
        }))
      return;
    run_bucket(b, last && tail_rides);
    {
      std::lock_guard<std::mutex> lock(mu);
      reduced = i + 1;
    }
    cv.notify_all();
  }
  if (!tail_rides) {
    if (!engine_wait([&] { return gate_open(); })) return;
    tail_timing.start = now_ns();
    coll->allreduce(tail, tail_floats, DataType::f32, op(), {});
    tail_timing.end = now_ns();
    wire_bytes += tail_floats * sizeof(float);
  }
}

void GradientSync::Impl::run_bucket(size_t b, bool with_tail) {
  const Bucket& bk = buckets[b];
  Timing& t = timings[b];
  t.ready = 0;
  for (int id : bk.ids) t.ready = std::max(t.ready, ready_at[size_t(id)].load(std::memory_order_relaxed));
  t.start = now_ns();
  for (int id : bk.ids)
    if (external[size_t(id)]) std::memcpy(arena_ptr(id), external[size_t(id)], bytes_of(id));
  std::byte* base = arena[size_t(bk.arena)] + bk.offset;
  const size_t count = bk.bytes / dtype_size(bk.dtype);
  CollectiveOptions o;
  o.chunk_bytes = settings.chunk_bytes;
  if (compressed(bk)) {
    auto& feedback = residual[size_t(bk.arena)];
    const compression::CompressionStats before = opt.compression->stats();
    const int64_t begin = now_ns();
    if (!opt.compression->allreduce(reinterpret_cast<float*>(base), count, op(), o,
                                    feedback.empty() ? nullptr : feedback.data() + bk.offset / sizeof(float)))
      ++fallbacks;
    const compression::CompressionStats& after = opt.compression->stats();
    const uint64_t wire = after.wire_bytes - before.wire_bytes;
    const double cast = after.cast_seconds - before.cast_seconds;
    wire_bytes += wire;
    cast_seconds += cast;
    // The reduction part, had it carried f32: scaled by the bytes saved; the casts are the cost.
    if (wire > 0) saved_seconds += (seconds(now_ns() - begin) - cast) * (double(bk.bytes) / double(wire) - 1) - cast;
  } else {
    coll->allreduce(base, count + (with_tail ? tail_floats : 0), bk.dtype, op(), o);
    wire_bytes += bk.bytes + (with_tail ? tail_floats * sizeof(float) : 0);
  }
  if (post_divisor() > 1) scale_avg(bk.dtype, base, count, post_divisor());
  for (int id : bk.ids)
    if (external[size_t(id)]) std::memcpy(external[size_t(id)], arena_ptr(id), bytes_of(id));
  t.end = now_ns();
}

}  // namespace tandem::fusion
