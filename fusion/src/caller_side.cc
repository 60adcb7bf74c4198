// The caller's side of a step: hooks mark gradients ready, wait_gradient() and
// wait() end the marking and wait for the engine, and the step's end collects
// stats, metrics and errors, writes the timeline and runs the autotuner.
#include <cmath>
#include <cstring>
#include <numeric>

#include "gradient_sync_impl.h"

namespace tandem::fusion {

void GradientSync::Impl::mark_ready(int id) noexcept {
  if (!finalized || id < 0 || size_t(id) >= tensors.size()) {
    int64_t none = INT64_MIN;
    unknown_id.compare_exchange_strong(none, id);
    return;
  }
  ready_at[size_t(id)].store(now_ns(), std::memory_order_relaxed);
  const uint8_t before = state[size_t(id)].exchange(kReady, std::memory_order_acq_rel);
  if (before != kPending) {
    int none = -1;
    (before == kReady ? marked_twice : marked_late).compare_exchange_strong(none, id);
    if (before == kUnused) state[size_t(id)].store(kUnused, std::memory_order_relaxed);
    return;
  }
  if (pending[size_t(bucket_of[size_t(id)])].fetch_sub(1, std::memory_order_acq_rel) == 1) poke();
}

void GradientSync::Impl::report_metrics(std::span<const Metric> m) {
  if (m.size() != size_t(opt.metric_slots))
    throw InvalidArgument("gradient sync: report_metrics got " + std::to_string(m.size()) +
                          " metrics; the sync was created with metric_slots = " + std::to_string(opt.metric_slots));
  if (metrics_in.load())
    throw InvalidArgument("gradient sync: report_metrics called twice in one step; report every metric in one call");
  for (size_t i = 0; i < m.size(); ++i) {
    tail[2 * i] += float(m[i].sum);
    tail[2 * i + 1] += float(m[i].count);
  }
  if (communicates(step + 1)) {
    metrics_in.store(true);
    poke();
  }
}

// Gradients nobody marked ready this step: claimed here, so a late hook
// cannot race what follows. A gradient is *unused* when no step of the
// aggregation window marked it: on the communicating step its storage is
// reduced as zeros (what earlier micro-steps accumulated is kept) and,
// without allow_unused, flagged in the tail for every rank to report.
void GradientSync::Impl::claim_unused(bool comm_step) {
  std::vector<int> claimed;
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint8_t expected = kPending;
    if (state[i].compare_exchange_strong(expected, kUnused, std::memory_order_acq_rel))
      claimed.push_back(int(i));
    else
      used_in_window[i] = true;
  }
  if (comm_step) {
    for (int id : claimed) {
      if (used_in_window[size_t(id)]) continue;
      std::memset(storage(id), 0, bytes_of(id));
      if (!opt.allow_unused && first_unused < 0) first_unused = id;
    }
    if (first_unused >= 0) tail[flag_base() + size_t(rank)] = float(first_unused + 1);
    std::fill(used_in_window.begin(), used_in_window.end(), false);
  }
  for (int id : claimed) pending[size_t(bucket_of[size_t(id)])].fetch_sub(1, std::memory_order_acq_rel);
}

// Ends the step's marking once, at the caller's first wait.
void GradientSync::Impl::close_marking(bool comm_step) {
  if (closed) return;
  claim_unused(comm_step);
  closing.store(true);
  poke();
  closed = true;
}

// Until `until` holds (under mu), the deadline passes or the engine fails.
template <class Until>
void GradientSync::Impl::await_engine(Deadline deadline, uint64_t step_no, const std::string& what, Until until) {
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_until(lock, deadline, [&] { return until() || done >= armed.load() || failure; })) {
    failure = std::make_exception_ptr(
        Timeout("gradient sync: " + what + " of step " + std::to_string(step_no) + " not reduced by the deadline (" +
                pending_report() +
                "); the engine stays inside its all-reduce until the communicator's timeout: a peer may be slow, "
                "stopped, or not calling wait()"));
    std::rethrow_exception(failure);
  }
  if (failure) std::rethrow_exception(failure);
}

void GradientSync::Impl::rethrow_failure() {
  std::lock_guard<std::mutex> lock(mu);
  if (failure) std::rethrow_exception(failure);
}

void GradientSync::Impl::wait_gradient(int id, Deadline deadline) {
  if (!finalized) throw InvalidArgument("gradient sync: wait_gradient() before finalize()");
  if (id < 0 || size_t(id) >= tensors.size())
    throw InvalidArgument("gradient sync: wait_gradient(" + std::to_string(id) + "): no such gradient (" +
                          std::to_string(tensors.size()) + " registered)");
  rethrow_failure();
  const uint64_t step_no = step + 1;
  const bool comm_step = communicates(step_no);
  close_marking(comm_step);
  if (!comm_step) return;
  const size_t b = size_t(bucket_of[size_t(id)]);
  const int64_t entered = now_ns();
  await_engine(deadline, step_no, "bucket " + std::to_string(b), [&] { return reduced > position[b]; });
  const int64_t left = now_ns();
  early_exposed += left - entered;
  if (timeline && timeline->on() && left - entered > 1000)
    timeline->span(0, "wait " + tensors[size_t(id)].name, "exposed", us(entered), us(left));
}

void GradientSync::Impl::wait(Deadline deadline) {
  if (!finalized) throw InvalidArgument("gradient sync: wait() before finalize()");
  rethrow_failure();
  const int64_t entered = now_ns();
  const uint64_t step_no = step + 1;
  const bool comm_step = communicates(step_no);
  close_marking(comm_step);
  if (comm_step) await_engine(deadline, step_no, "the last bucket", [] { return false; });
  const int64_t left = now_ns();
  finish_step(step_no, comm_step, entered, left);
}

std::string GradientSync::Impl::pending_report() const {
  for (size_t b = 0; b < buckets.size(); ++b) {
    if (pending[b].load() != 0) return "bucket " + std::to_string(b) + " still has unready gradients on this rank";
  }
  return "every bucket ready here; waiting for the peers";
}

void GradientSync::Impl::finish_step(uint64_t step_no, bool comm_step, int64_t entered, int64_t left) {
  step = step_no;
  StepStats s;
  s.step = step_no;
  s.communicated = comm_step;
  s.compute = seconds(entered - step_begin - early_exposed);
  s.exposed = seconds(left - entered + early_exposed);
  s.buckets = comm_step ? int(buckets.size()) : 0;
  s.settings = settings;
  std::string unused_error;
  if (comm_step) {
    for (const Timing& t : timings) s.communication += seconds(t.end - t.start);
    if (!tail_rides) s.communication += seconds(tail_timing.end - tail_timing.start);
    for (const Bucket& b : buckets) s.bytes_reduced += b.bytes;
    s.wire_bytes = wire_bytes;
    s.compression_fallbacks = fallbacks;
    s.compression_casts = cast_seconds;
    s.compression_saved = saved_seconds;
    s.hidden_fraction = s.communication > 0 ? std::clamp(1 - s.exposed / s.communication, 0.0, 1.0) : 1.0;
    unused_error = decode_tail(step_no);
    ++communicated;
  }
  write_timeline(s, entered, left);
  last = s;

  // Reset for the next step, then tune (between steps: no bucket in flight).
  reset_pending();
  closed = false;
  early_exposed = 0;
  if (comm_step) {
    std::fill(tail, tail + tail_floats, 0.0f);
    first_unused = -1;
    autotune(s);
  }
  const std::string hook_error = take_hook_error(step_no);
  step_begin = now_ns();
  if (communicates(step + 1)) {
    arm();
  } else {
    closing.store(false);
    metrics_in.store(false);  // aggregation's local steps report too
  }
  if (!unused_error.empty()) throw InvalidArgument(unused_error);
  if (!hook_error.empty()) throw InvalidArgument(hook_error);
}

std::string GradientSync::Impl::decode_tail(uint64_t step_no) {
  const float scale = op() == ReduceOp::avg ? float(size) : 1.0f;
  for (size_t i = 0; i < metrics.size(); ++i)
    metrics[i] = Metric{double(tail[2 * i]) * scale, double(tail[2 * i + 1]) * scale};
  std::string ranks;
  int id = -1;
  for (int r = 0; r < size; ++r) {
    const long flag = std::lround(double(tail[flag_base() + size_t(r)]) * scale);
    if (flag <= 0) continue;
    if (id < 0 || flag - 1 < id) id = int(flag - 1);
    ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (id < 0) return "";
  return "gradient sync: gradient " + describe(tensors[size_t(id)]) + " (id " + std::to_string(id) +
         ") was not marked ready by wait() in step " + std::to_string(step_no) + " on rank(s) " + ranks +
         ": a parameter that took no part in the loss. Make every registered parameter contribute, or create "
         "the sync with allow_unused to reduce unused gradients as zeros (DDP: find_unused_parameters)";
}

std::string GradientSync::Impl::take_hook_error(uint64_t step_no) {
  const int64_t bad = unknown_id.exchange(INT64_MIN);
  const int twice = marked_twice.exchange(-1), late = marked_late.exchange(-1);
  const std::string at = " in step " + std::to_string(step_no) + " on rank " + std::to_string(rank);
  if (bad != INT64_MIN)
    return finalized && bad >= 0 ? "gradient sync: mark_ready(" + std::to_string(bad) + ")" + at +
                                       ": no such gradient (" + std::to_string(tensors.size()) + " registered)"
                                 : "gradient sync: mark_ready(" + std::to_string(bad) + ")" + at +
                                       ": unknown id or called before finalize()";
  if (twice >= 0)
    return "gradient sync: gradient " + describe(tensors[size_t(twice)]) + " marked ready twice" + at +
           "; a hook must fire once per backward pass";
  if (late >= 0)
    return "gradient sync: gradient " + describe(tensors[size_t(late)]) + " marked ready after wait() began" + at +
           "; call wait() only once backward has returned";
  return "";
}

void GradientSync::Impl::write_timeline(const StepStats& s, int64_t entered, int64_t left) {
  if (!timeline || !timeline->on()) return;
  const std::string step = "step " + std::to_string(s.step);
  timeline->span(0, "compute " + step, "compute", us(step_begin), us(entered));
  timeline->span(0, "wait " + step, "exposed", us(entered), us(left),
                 {{"exposed_ms", s.exposed * 1e3}, {"communicated", s.communicated}});
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t at = ready_at[i].load(std::memory_order_relaxed);
    if (at >= step_begin) timeline->instant(2, "ready " + tensors[i].name, "ready", us(at));
  }
  if (!s.communicated) return;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const Timing& t = timings[b];
    const std::string name = "bucket " + std::to_string(b);
    if (t.ready > 0 && t.ready < t.start) timeline->span(1, name + " queued", "queued", us(t.ready), us(t.start));
    timeline->span(1, name, "allreduce", us(t.start), us(t.end),
                   {{"bytes", buckets[b].bytes},
                    {"gradients", buckets[b].ids.size()},
                    {"dtype", std::string(to_string(buckets[b].dtype))},
                    {"step", s.step}});
  }
  if (!tail_rides) timeline->span(1, "metrics", "allreduce", us(tail_timing.start), us(tail_timing.end));
  timeline->flush();
}

void GradientSync::Impl::autotune(const StepStats& s) {
  if (!opt.autotune.enabled) return;
  const auto& a = opt.autotune;
  const int64_t c = int64_t(communicated);
  if (c <= a.warmup_steps) return;
  sample.push_back(s.exposed);
  sample_steps.push_back(s.compute + s.exposed);
  if ((c - a.warmup_steps) % a.steps_per_sample != 0) return;
  uint64_t next[3] = {settings.fusion_threshold_bytes, settings.first_bucket_bytes, settings.chunk_bytes};
  if (tuner) {
    const auto mean = [](const std::vector<double>& v) {
      return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
    };
    const FusionSettings n = tuner->next(mean(sample), mean(sample_steps));
    next[0] = n.fusion_threshold_bytes, next[1] = n.first_bucket_bytes, next[2] = n.chunk_bytes;
  }
  sample.clear();
  sample_steps.clear();
  coll->broadcast(next, 3, DataType::i64, 0, {});  // rank 0 decides
  const FusionSettings chosen{next[0], next[1], next[2]};
  if (chosen == settings) return;
  settings = chosen;
  cut();
}

}  // namespace tandem::fusion
