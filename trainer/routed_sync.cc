// RoutedSync (see routed_sync.h).
#include "routed_sync.h"

#include <algorithm>

#include "tandem/errors.h"

namespace tandem::trainer {

RoutedSync::RoutedSync(Communicator& workers, Communicator& world, RoutedSyncOptions options)
    : world_(world), options_(std::move(options)), sync_(workers, options_.sync), workers_(workers.size()) {
  if (ps::worker_count(world.size(), options_.ps) != workers.size()) {
    throw InvalidArgument("routed sync: the workers' communicator has " + std::to_string(workers.size()) +
                          " ranks but the world has " + std::to_string(ps::worker_count(world.size(), options_.ps)) +
                          " workers beside its " + std::to_string(options_.ps.servers) + " server(s)");
  }
}

RoutedSync::~RoutedSync() = default;

int RoutedSync::register_gradient(const std::string& name, size_t rows, size_t cols) {
  if (client_) throw InvalidArgument("routed sync: register '" + name + "' after finalize()");
  Entry e;
  e.name = name;
  e.rows = rows;
  e.cols = cols;
  e.routed = std::find(options_.ps_names.begin(), options_.ps_names.end(), name) != options_.ps_names.end() ||
             (options_.ps_rule && options_.ps_rule(name, rows, cols));
  if (e.routed) {
    e.data.assign(rows * cols, 0.0f);
  } else {
    e.sync_id = sync_.register_gradient(name, rows * cols, DataType::f32);
  }
  entries_.push_back(std::move(e));
  return int(entries_.size() - 1);
}

void RoutedSync::finalize(Deadline deadline) {
  std::vector<ps::KeySpec> keys;
  for (const auto& e : entries_) {
    if (e.routed) keys.push_back({e.name, e.rows, e.cols});
  }
  bool any_bucketed = std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return !e.routed; });
  if (any_bucketed) sync_.finalize(deadline);
  // The client's calls keep options.ps.timeout (the world communicator's by default).
  client_ = std::make_unique<ps::Client>(world_, keys, options_.ps);
}

float* RoutedSync::data(int id) const {
  const Entry& e = entries_.at(size_t(id));
  return e.routed ? const_cast<float*>(e.data.data()) : static_cast<float*>(sync_.data(e.sync_id));
}

void RoutedSync::mark_ready(int id) {
  Entry& e = entries_.at(size_t(id));
  if (!e.routed) return sync_.mark_ready(e.sync_id);
  std::lock_guard<std::mutex> lock(mu_);
  if (e.marked) throw InvalidArgument("routed sync: gradient '" + e.name + "' marked ready twice in one step");
  e.marked = true;
  if (!options_.sparse_rows) {
    e.push = client_->push_async(e.name, e.data.data(), e.data.size(), DataType::f32);
    return;
  }
  e.ids.clear();
  e.rows_buffer.clear();
  for (size_t r = 0; r < e.rows; ++r) {
    const float* row = e.data.data() + r * e.cols;
    if (std::any_of(row, row + e.cols, [](float x) { return x != 0.0f; })) {
      e.ids.push_back(int64_t(r));
      e.rows_buffer.insert(e.rows_buffer.end(), row, row + e.cols);
    }
  }
  e.push = client_->push_rows_async(e.name, e.ids.data(), e.ids.size(), e.rows_buffer.data(), DataType::f32);
}

void RoutedSync::wait(Deadline deadline) {
  if (std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return !e.routed; })) sync_.wait(deadline);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : entries_) {
    if (!e.routed) continue;
    if (!e.marked) {
      if (!options_.sync.allow_unused) {
        throw InvalidArgument("routed sync: gradient '" + e.name +
                              "' was never marked ready this step "
                              "(set allow_unused to push it as zeros)");
      }
      e.push = client_->push_rows_async(e.name, nullptr, 0, nullptr, DataType::f32);  // zeros, still a step
    }
    e.marked = false;
    e.push.wait(deadline);
    const float scale = options_.sync.average ? 1.0f / float(workers_) : 1.0f;
    if (!options_.sparse_rows) {
      client_->pull(e.name, e.data.data(), e.data.size(), DataType::f32);
      for (float& x : e.data) x *= scale;
      continue;
    }
    // Only the rows some worker pushed cross the network; the others hold
    // zeros already, except this worker's own, which the sums replace.
    std::vector<int64_t> ids;
    std::vector<std::byte> rows;
    client_->pull_touched(e.name, ids, rows);
    for (int64_t r : e.ids) std::fill_n(e.data.data() + size_t(r) * e.cols, e.cols, 0.0f);
    const float* sums = reinterpret_cast<const float*>(rows.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      float* row = e.data.data() + size_t(ids[i]) * e.cols;
      for (size_t c = 0; c < e.cols; ++c) row[c] = sums[i * e.cols + c] * scale;
    }
  }
}

void RoutedSync::zero_gradients() {
  if (std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return !e.routed; })) sync_.zero_gradients();
  for (auto& e : entries_) {
    if (e.routed) std::fill(e.data.begin(), e.data.end(), 0.0f);
  }
}

}  // namespace tandem::trainer
