// The gradient-sync engine: set-up, the gradients' layout in buckets, and the
// public API. Its state and terms: gradient_sync_impl.h; the engine thread:
// engine_thread.cc; marking, waiting and ending a step: caller_side.cc.
#include "tandem/fusion/gradient_sync.h"

#include <algorithm>
#include <cstring>

#include "gradient_sync_impl.h"
#include "tandem/compression/compression.h"

namespace tandem::fusion {
namespace {

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

}  // namespace

GradientSync::Impl::Impl(std::shared_ptr<Collectives> c, GradientSyncOptions o)
    : coll(std::move(c)), opt(std::move(o)) {
  rank = coll->rank();
  size = coll->size();
  settings = opt.fusion;
  if (opt.aggregation_frequency < 1)
    throw InvalidArgument("gradient sync: aggregation_frequency must be >= 1 (got " +
                          std::to_string(opt.aggregation_frequency) + ")");
  if (opt.metric_slots < 0) throw InvalidArgument("gradient sync: metric_slots must be >= 0");
  check_settings(settings);
  if (opt.autotune.enabled &&
      (opt.autotune.steps_per_sample < 1 || opt.autotune.max_samples < 1 || opt.autotune.warmup_steps < 0))
    throw InvalidArgument(
        "gradient sync: autotune needs steps_per_sample >= 1, max_samples >= 1 and warmup_steps >= 0");
}

void GradientSync::Impl::check_settings(const FusionSettings& s) {
  if (s.fusion_threshold_bytes < 4096 || s.first_bucket_bytes < 4096)
    throw InvalidArgument("gradient sync: fusion threshold and first bucket must be >= 4 KiB (got " +
                          std::to_string(s.fusion_threshold_bytes) + " and " + std::to_string(s.first_bucket_bytes) +
                          " bytes)");
  if (s.chunk_bytes != 0 && s.chunk_bytes < 4096)
    throw InvalidArgument("gradient sync: chunk_bytes must be 0 (the communicator's) or >= 4096");
}

GradientSync::Impl::~Impl() {
  stop.store(true);
  poke();
  if (engine.joinable()) engine.join();
  for (std::byte* a : arena)
    if (a) coll->free_shared(a);
  if (tail_owned && tail) coll->free_shared(tail);
}

// ---- layout ----

void GradientSync::Impl::cut() {
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

void GradientSync::Impl::reset_pending() {
  {
    std::lock_guard<std::mutex> lock(mu);
    reduced = 0;
  }
  for (size_t b = 0; b < buckets.size(); ++b) pending[b].store(int(buckets[b].ids.size()), std::memory_order_relaxed);
  for (size_t i = 0; i < tensors.size(); ++i) state[i].store(kPending, std::memory_order_relaxed);
}

void GradientSync::Impl::check_registrations(Deadline deadline) {
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

void GradientSync::Impl::finalize(Deadline deadline) {
  if (finalized) throw InvalidArgument("gradient sync: finalize() called twice");
  check_registrations(deadline);
  layout = lay_out(tensors);
  // The tail goes after the f32 arena when gradient 0 (the last bucket's end) is f32.
  tail_floats = (flag_base() + size_t(size) + 15) / 16 * 16;
  arena.assign(layout.dtypes.size(), nullptr);
  for (size_t a = 0; a < arena.size(); ++a) {
    const bool with_tail = !tensors.empty() && layout.dtypes[a] == DataType::f32 && tensors[0].dtype == DataType::f32;
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

void GradientSync::Impl::arm() {
  closing.store(false);
  metrics_in.store(false);
  armed.fetch_add(1);
  poke();
}

void GradientSync::Impl::zero_gradients() {
  for (size_t a = 0; a < arena.size(); ++a) std::memset(arena[a], 0, layout.bytes[a]);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (external[i]) std::memset(external[i], 0, bytes_of(int(i)));
}

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
