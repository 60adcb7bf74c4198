// The gradient-sync engine. Terms as in gradient_sync.h; here also:
//  - tail: a few floats after the f32 arena (or alone) carrying the step's
//    metrics (sum, count per slot) and one "unused gradient" flag per rank.
//    It rides on the step's last bucket when that bucket is f32 and
//    uncompressed (contiguous with it), so metrics and the unused check cost
//    no extra collective; otherwise it is reduced on its own after the buckets.
//  - pending[b]: gradients of bucket b not yet ready this step. The hook that
//    takes it to zero pokes the engine; the engine launches buckets in order.
//  - armed: the caller arms the engine for each communicating step; the engine
//    reports each bucket reduced and the step done (or its error) through a
//    mutex and condition variable, which only the caller's waits touch.
//  - closed: the caller's first wait of the step (wait_gradient or wait) ends
//    the marking: gradients not marked by then are claimed as unused.
#include "tandem/fusion/gradient_sync.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "autotune.h"
#include "tandem/compression/compression.h"
#include "layout.h"
#include "tandem/reduce.h"
#include "timeline.h"

namespace tandem::fusion {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
double us(int64_t ns) { return double(ns) / 1e3; }
double seconds(int64_t ns) { return double(ns) / 1e9; }

// A futex on a 32-bit atomic: sleep while it still holds `expected`, at most `timeout`.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{time_t(timeout.count() / 1000000000), long(timeout.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

class CommunicatorCollectives final : public Collectives {
 public:
  explicit CommunicatorCollectives(Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const CollectiveOptions& opts) override {
    c_.allreduce(data, count, dtype, op, opts);
  }
  void allgather(const void* in, void* out, size_t count, DataType dtype, const CollectiveOptions& opts) override {
    c_.allgather(in, out, count, dtype, opts);
  }
  void broadcast(void* data, size_t count, DataType dtype, int root, const CollectiveOptions& opts) override {
    c_.broadcast(data, count, dtype, root, opts);
  }
  void* allocate_shared(size_t bytes) override { return c_.allocate_shared(bytes); }
  void free_shared(void* p) override { c_.free_shared(p); }

 private:
  Communicator& c_;
};

enum GradState : uint8_t { kPending = 0, kReady = 1, kUnused = 2 };

uint64_t fingerprint(const TensorSpec& t) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](const void* p, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 1099511628211ull;
  };
  mix(t.name.data(), t.name.size());
  mix(&t.count, sizeof t.count);
  mix(&t.dtype, sizeof t.dtype);
  return h;
}

std::string describe(const TensorSpec& t) {
  return "'" + t.name + "' (" + std::string(to_string(t.dtype)) + " x " + std::to_string(t.count) + ")";
}

}  // namespace

struct GradientSync::Impl {
  std::shared_ptr<Collectives> coll;
  GradientSyncOptions opt;
  int rank = 0, size = 1;

  std::vector<TensorSpec> tensors;
  std::vector<void*> external;  // per id; null for gradients in the arena
  bool finalized = false;

  ArenaLayout layout;
  std::vector<std::byte*> arena;
  float* tail = nullptr;
  size_t tail_floats = 0;
  bool tail_rides = false;  // the tail extends the last bucket's range (launched last)
  bool tail_owned = false;  // allocated on its own
  std::vector<std::vector<float>> residual;  // per arena: error feedback of compressed f32 buckets

  FusionSettings settings;
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;
  std::vector<int> order;     // buckets in launch order
  std::vector<size_t> position;  // per bucket: its place in `order`
  std::unique_ptr<std::atomic<int>[]> pending;      // per bucket (at most one per gradient)
  std::unique_ptr<std::atomic<uint8_t>[]> state;    // per gradient
  std::unique_ptr<std::atomic<int64_t>[]> ready_at; // per gradient, ns

  // Hook-side errors, raised by wait().
  std::atomic<int64_t> unknown_id{INT64_MIN};
  std::atomic<int> marked_twice{-1};
  std::atomic<int> marked_late{-1};

  // Engine wake-ups.
  std::atomic<uint32_t> wake{0};
  std::atomic<bool> sleeping{false};
  std::atomic<bool> closing{false};     // wait() entered this step
  std::atomic<bool> metrics_in{false};  // report_metrics() called this step
  std::atomic<uint64_t> armed{0};       // communicating steps armed so far
  std::atomic<bool> stop{false};

  std::mutex mu;
  std::condition_variable cv;
  uint64_t done = 0;  // communicating steps the engine finished
  size_t reduced = 0; // buckets of the armed step reduced so far, in launch order
  std::exception_ptr failure;  // sticky
  std::thread engine;

  struct Timing {
    int64_t ready = 0, start = 0, end = 0;
  };
  std::vector<Timing> timings;  // per bucket of the current step, written by the engine
  Timing tail_timing;
  uint64_t wire_bytes = 0;
  uint64_t fallbacks = 0;  // compressed buckets re-sent in f32 this step
  double cast_seconds = 0;  // this step's compression casts
  double saved_seconds = 0; // estimated: see StepStats::compression_saved

  uint64_t step = 0, communicated = 0;
  int64_t step_begin = 0;
  bool closed = false;        // this step's marking ended (caller side)
  int64_t early_exposed = 0;  // ns blocked in wait_gradient this step
  int first_unused = -1;             // this rank's first unused gradient of the step
  std::vector<bool> used_in_window;  // marked ready in some step since the last communicating one
  StepStats last;
  std::vector<Metric> metrics;

  std::unique_ptr<Timeline> timeline;
  std::unique_ptr<Autotuner> tuner;  // rank 0 only
  std::vector<double> sample;        // exposed seconds of the trial's steps
  std::vector<double> sample_steps;  // their step times (wait() return to wait() return)

  Impl(std::shared_ptr<Collectives> c, GradientSyncOptions o) : coll(std::move(c)), opt(std::move(o)) {
    rank = coll->rank();
    size = coll->size();
    settings = opt.fusion;
    if (opt.aggregation_frequency < 1)
      throw InvalidArgument("gradient sync: aggregation_frequency must be >= 1 (got " +
                            std::to_string(opt.aggregation_frequency) + ")");
    if (opt.metric_slots < 0) throw InvalidArgument("gradient sync: metric_slots must be >= 0");
    check_settings(settings);
    if (opt.autotune.enabled && (opt.autotune.steps_per_sample < 1 || opt.autotune.max_samples < 1 ||
                                 opt.autotune.warmup_steps < 0))
      throw InvalidArgument(
          "gradient sync: autotune needs steps_per_sample >= 1, max_samples >= 1 and warmup_steps >= 0");
  }

  static void check_settings(const FusionSettings& s) {
    if (s.fusion_threshold_bytes < 4096 || s.first_bucket_bytes < 4096)
      throw InvalidArgument("gradient sync: fusion threshold and first bucket must be >= 4 KiB (got " +
                            std::to_string(s.fusion_threshold_bytes) + " and " +
                            std::to_string(s.first_bucket_bytes) + " bytes)");
    if (s.chunk_bytes != 0 && s.chunk_bytes < 4096)
      throw InvalidArgument("gradient sync: chunk_bytes must be 0 (the communicator's) or >= 4096");
  }

  ~Impl() {
    stop.store(true);
    poke();
    if (engine.joinable()) engine.join();
    for (std::byte* a : arena)
      if (a) coll->free_shared(a);
    if (tail_owned && tail) coll->free_shared(tail);
  }

  int post_divisor() const {
    const int k = opt.average_aggregated_gradients ? opt.aggregation_frequency : 1;
    return opt.average && k == 1 ? 1 : (opt.average ? size : 1) * k;
  }
  ReduceOp op() const { return post_divisor() == 1 && opt.average ? ReduceOp::avg : ReduceOp::sum; }
  size_t flag_base() const { return size_t(opt.metric_slots) * 2; }
  bool communicates(uint64_t step_no) const { return step_no % uint64_t(opt.aggregation_frequency) == 0; }

  size_t bytes_of(int id) const { return tensors[size_t(id)].count * dtype_size(tensors[size_t(id)].dtype); }
  std::byte* arena_ptr(int id) const {
    const Placement& p = layout.placement[size_t(id)];
    return arena[size_t(p.arena)] + p.offset;
  }
  void* storage(int id) const { return external[size_t(id)] ? external[size_t(id)] : arena_ptr(id); }

  void poke() {
    wake.fetch_add(1);
    if (sleeping.load()) futex_wake(wake);
  }

  // The engine sleeps until ready() (or stop), waking at least every cycle_time.
  template <class Ready>
  bool engine_wait(Ready ready) {
    const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::max(opt.cycle_time, std::chrono::milliseconds(1)));
    for (;;) {
      const uint32_t seen = wake.load();
      if (stop.load()) return false;
      if (ready()) return true;
      sleeping.store(true);
      if (!ready() && !stop.load()) futex_wait(wake, seen, period);
      sleeping.store(false);
    }
  }

  // ---- layout ----

  void cut() {
    buckets = cut_buckets(tensors, layout, settings, opt.input_layers_ahead_bytes > 0 ? opt.input_bucket_bytes : 0);
    bucket_of.assign(tensors.size(), 0);
    for (size_t b = 0; b < buckets.size(); ++b)
      for (int id : buckets[b].ids) bucket_of[size_t(id)] = int(b);
    order = launch_order(buckets, opt.input_layers_ahead_bytes);
    position.assign(buckets.size(), 0);
    for (size_t i = 0; i < order.size(); ++i) position[size_t(order[i])] = i;
    tail_rides = !tensors.empty() && tensors[0].dtype == DataType::f32 && !compressed(buckets.back()) &&
                 order.back() == int(buckets.size()) - 1;
    timings.assign(buckets.size(), Timing{});
    reset_pending();
  }

  bool compressed(const Bucket& b) const { return opt.compression && b.dtype == DataType::f32; }

  void reset_pending() {
    {
      std::lock_guard<std::mutex> lock(mu);
      reduced = 0;
    }
    for (size_t b = 0; b < buckets.size(); ++b) pending[b].store(int(buckets[b].ids.size()), std::memory_order_relaxed);
    for (size_t i = 0; i < tensors.size(); ++i) state[i].store(kPending, std::memory_order_relaxed);
  }

  void check_registrations(Deadline deadline) {
    CollectiveOptions o;
    o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (o.timeout->count() <= 0) throw Timeout("gradient sync: finalize() deadline passed before the registration check");
    const uint64_t mine = tensors.size();
    std::vector<uint64_t> counts(static_cast<size_t>(size));
    coll->allgather(&mine, counts.data(), 1, DataType::i64, o);
    const uint64_t most = *std::max_element(counts.begin(), counts.end());
    std::vector<uint64_t> prints(most, 0), all(most * size_t(size));
    for (size_t i = 0; i < tensors.size(); ++i) prints[i] = fingerprint(tensors[i]);
    if (most > 0) coll->allgather(prints.data(), all.data(), most, DataType::i64, o);
    size_t first = most;
    for (size_t i = 0; i < most && first == most; ++i)
      for (int r = 1; r < size; ++r)
        if (all[size_t(r) * most + i] != all[i]) first = i;
    if (first == most) return;  // every rank registered the same tensors

    // Name what each rank has at the first difference.
    struct Record {
      char name[112];
      uint64_t count;
      uint64_t dtype;  // 255: no tensor at this index
    };
    Record rec{};
    rec.dtype = 255;
    if (first < tensors.size()) {
      std::strncpy(rec.name, tensors[first].name.c_str(), sizeof rec.name - 1);
      rec.count = tensors[first].count;
      rec.dtype = uint64_t(tensors[first].dtype);
    }
    std::vector<Record> recs(static_cast<size_t>(size));
    coll->allgather(&rec, recs.data(), sizeof(Record), DataType::u8, o);
    std::string what = "gradient sync: registrations differ across ranks at gradient #" + std::to_string(first) + ":";
    for (int r = 0; r < size; ++r) {
      const Record& x = recs[size_t(r)];
      what += " rank " + std::to_string(r) + " has ";
      what += x.dtype == 255 ? std::string("none (") + std::to_string(counts[size_t(r)]) + " registered)"
                             : describe(TensorSpec{x.name, x.count, DataType(x.dtype)});
      what += r + 1 < size ? ";" : "";
    }
    throw InvalidArgument(what + ". Every rank must register the same gradients (name, count, dtype) in the same order");
  }

  void finalize(Deadline deadline) {
    if (finalized) throw InvalidArgument("gradient sync: finalize() called twice");
    check_registrations(deadline);
    layout = lay_out(tensors);
    // The tail goes after the f32 arena when gradient 0 (the last bucket's end) is f32.
    tail_floats = (flag_base() + size_t(size) + 15) / 16 * 16;
    arena.assign(layout.dtypes.size(), nullptr);
    for (size_t a = 0; a < arena.size(); ++a) {
      const bool with_tail = !tensors.empty() && layout.dtypes[a] == DataType::f32 &&
                             tensors[0].dtype == DataType::f32;
      const size_t bytes = layout.bytes[a] + (with_tail ? tail_floats * sizeof(float) : 0);
      arena[a] = static_cast<std::byte*>(coll->allocate_shared(std::max<size_t>(bytes, 64)));
      std::memset(arena[a], 0, bytes);
      if (with_tail) tail = reinterpret_cast<float*>(arena[a] + layout.bytes[a]);
    }
    if (!tail) {
      tail = static_cast<float*>(coll->allocate_shared(tail_floats * sizeof(float)));
      std::memset(tail, 0, tail_floats * sizeof(float));
      tail_owned = true;
    }
    residual.resize(arena.size());
    for (size_t a = 0; a < arena.size(); ++a)
      if (opt.compression && opt.compression->options().error_feedback && layout.dtypes[a] == DataType::f32)
        residual[a].assign(layout.bytes[a] / sizeof(float), 0.0f);
    pending = std::make_unique<std::atomic<int>[]>(std::max<size_t>(tensors.size(), 1));
    state = std::make_unique<std::atomic<uint8_t>[]>(std::max<size_t>(tensors.size(), 1));
    ready_at = std::make_unique<std::atomic<int64_t>[]>(std::max<size_t>(tensors.size(), 1));
    metrics.assign(size_t(opt.metric_slots), Metric{});
    used_in_window.assign(tensors.size(), false);
    cut();
    timeline = std::make_unique<Timeline>(opt.timeline_path, rank);
    if (opt.autotune.enabled && rank == 0) tuner = std::make_unique<Autotuner>(opt.autotune, settings);
    finalized = true;
    step_begin = now_ns();
    engine = std::thread([this] { engine_main(); });
    if (communicates(1)) arm();
  }

  void arm() {
    closing.store(false);
    metrics_in.store(false);
    armed.fetch_add(1);
    poke();
  }

  // ---- engine thread ----

  void engine_main() {
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

  bool gate_open() const { return opt.metric_slots == 0 || metrics_in.load() || closing.load(); }

  void run_step() {
    wire_bytes = 0;
    fallbacks = 0;
    cast_seconds = 0;
    saved_seconds = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      const size_t b = size_t(order[i]);
      const bool last = i + 1 == order.size();
      if (!engine_wait([&] { return pending[b].load() == 0 && (!last || !tail_rides || gate_open()); })) return;
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

  void run_bucket(size_t b, bool with_tail) {
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

  // ---- caller side ----

  void mark_ready(int id) noexcept {
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

  void report_metrics(std::span<const Metric> m) {
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
  void claim_unused(bool comm_step) {
    std::vector<int> claimed;
    for (size_t i = 0; i < tensors.size(); ++i) {
      uint8_t expected = kPending;
      if (state[i].compare_exchange_strong(expected, kUnused, std::memory_order_acq_rel)) claimed.push_back(int(i));
      else used_in_window[i] = true;
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
  void close_marking(bool comm_step) {
    if (closed) return;
    claim_unused(comm_step);
    closing.store(true);
    poke();
    closed = true;
  }

  // Until `until` holds (under mu), the deadline passes or the engine fails.
  template <class Until>
  void await_engine(Deadline deadline, uint64_t step_no, const std::string& what, Until until) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_until(lock, deadline, [&] { return until() || done >= armed.load() || failure; })) {
      failure = std::make_exception_ptr(Timeout(
          "gradient sync: " + what + " of step " + std::to_string(step_no) + " not reduced by the deadline (" +
          pending_report() +
          "); the engine stays inside its all-reduce until the communicator's timeout: a peer may be slow, "
          "stopped, or not calling wait()"));
      std::rethrow_exception(failure);
    }
    if (failure) std::rethrow_exception(failure);
  }

  void rethrow_failure() {
    std::lock_guard<std::mutex> lock(mu);
    if (failure) std::rethrow_exception(failure);
  }

  void wait_gradient(int id, Deadline deadline) {
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

  void wait(Deadline deadline) {
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

  std::string pending_report() const {
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (pending[b].load() != 0) return "bucket " + std::to_string(b) + " still has unready gradients on this rank";
    }
    return "every bucket ready here; waiting for the peers";
  }

  void finish_step(uint64_t step_no, bool comm_step, int64_t entered, int64_t left) {
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

  std::string decode_tail(uint64_t step_no) {
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

  std::string take_hook_error(uint64_t step_no) {
    const int64_t bad = unknown_id.exchange(INT64_MIN);
    const int twice = marked_twice.exchange(-1), late = marked_late.exchange(-1);
    const std::string at = " in step " + std::to_string(step_no) + " on rank " + std::to_string(rank);
    if (bad != INT64_MIN)
      return finalized && bad >= 0
                 ? "gradient sync: mark_ready(" + std::to_string(bad) + ")" + at + ": no such gradient (" +
                       std::to_string(tensors.size()) + " registered)"
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

  void write_timeline(const StepStats& s, int64_t entered, int64_t left) {
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

  void autotune(const StepStats& s) {
    if (!opt.autotune.enabled) return;
    const auto& a = opt.autotune;
    const int64_t c = int64_t(communicated);
    if (c <= a.warmup_steps) return;
    sample.push_back(s.exposed);
    sample_steps.push_back(s.compute + s.exposed);
    if ((c - a.warmup_steps) % a.steps_per_sample != 0) return;
    uint64_t next[3] = {settings.fusion_threshold_bytes, settings.first_bucket_bytes, settings.chunk_bytes};
    if (tuner) {
      const auto mean = [](const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()); };
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

  void zero_gradients() {
    for (size_t a = 0; a < arena.size(); ++a) std::memset(arena[a], 0, layout.bytes[a]);
    for (size_t i = 0; i < tensors.size(); ++i)
      if (external[i]) std::memset(external[i], 0, bytes_of(int(i)));
  }
};

GradientSync::GradientSync(Communicator& comm, GradientSyncOptions options)
    : GradientSync(std::make_shared<CommunicatorCollectives>(comm), std::move(options)) {}

GradientSync::GradientSync(std::shared_ptr<Collectives> collectives, GradientSyncOptions options)
    : impl_(std::make_unique<Impl>(std::move(collectives), std::move(options))) {}

GradientSync::~GradientSync() = default;

int GradientSync::register_gradient(const std::string& name, size_t count, DataType dtype) {
  return register_external(name, nullptr, count, dtype);
}

int GradientSync::register_external(const std::string& name, void* data, size_t count, DataType dtype) {
  if (impl_->finalized) throw InvalidArgument("gradient sync: register '" + name + "' after finalize()");
  if (count == 0) throw InvalidArgument("gradient sync: gradient '" + name + "' has no elements");
  impl_->tensors.push_back(TensorSpec{name, count, dtype});
  impl_->external.push_back(data);
  return int(impl_->tensors.size() - 1);
}

std::vector<int> GradientSync::register_gradient_parts(const std::string& name, std::span<const size_t> part_counts,
                                                      DataType dtype) {
  if (part_counts.empty()) throw InvalidArgument("gradient sync: gradient '" + name + "' has no parts");
  for (size_t k = 0; k + 1 < part_counts.size(); ++k)
    if (part_counts[k] * dtype_size(dtype) % kAlignBytes != 0)
      throw InvalidArgument("gradient sync: part " + std::to_string(k) + " of '" + name + "' holds " +
                            std::to_string(part_counts[k] * dtype_size(dtype)) + " bytes; every part but the last " +
                            "must hold a multiple of " + std::to_string(kAlignBytes) + " bytes to stay contiguous");
  // The arena holds gradients in reverse registration order: registering the
  // last part first puts part 0 at the lowest address.
  std::vector<int> ids(part_counts.size());
  for (size_t k = part_counts.size(); k-- > 0;)
    ids[k] = register_gradient(name + "[" + std::to_string(k) + "]", part_counts[k], dtype);
  return ids;
}

void GradientSync::finalize(Deadline deadline) { impl_->finalize(deadline); }
size_t GradientSync::gradient_count() const { return impl_->tensors.size(); }
const std::string& GradientSync::name(int id) const { return impl_->tensors.at(size_t(id)).name; }

void* GradientSync::data(int id) const {
  if (!impl_->finalized) throw InvalidArgument("gradient sync: data() before finalize()");
  if (id < 0 || size_t(id) >= impl_->tensors.size())
    throw InvalidArgument("gradient sync: no gradient with id " + std::to_string(id));
  return impl_->storage(id);
}

void GradientSync::mark_ready(int id) noexcept { impl_->mark_ready(id); }
void GradientSync::report_metrics(std::span<const Metric> metrics) { impl_->report_metrics(metrics); }
std::span<const Metric> GradientSync::metrics() const { return impl_->metrics; }
void GradientSync::wait(Deadline deadline) { impl_->wait(deadline); }
void GradientSync::wait_gradient(int id, Deadline deadline) { impl_->wait_gradient(id, deadline); }
void GradientSync::zero_gradients() { impl_->zero_gradients(); }
const StepStats& GradientSync::last_step() const { return impl_->last; }
const FusionSettings& GradientSync::settings() const { return impl_->settings; }

std::vector<std::vector<int>> GradientSync::buckets() const {
  std::vector<std::vector<int>> out;
  for (int b : impl_->order) out.push_back(impl_->buckets[size_t(b)].ids);
  return out;
}

}  // namespace tandem::fusion
