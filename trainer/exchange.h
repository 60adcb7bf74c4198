// How one slot's gradients reach the other slots (the "exchange" of
// trial.h): fusion::GradientSync, overlapped with backward or after it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/communicator.h"
#include "tandem/compression/compression.h"
#include "tandem/fusion/gradient_sync.h"

namespace tandem::trainer {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// What one batch's exchange tells the loop.
struct Exchanged {
  bool communicated = false;
  double exposed = 0, communication = 0;
  uint64_t payload_bytes = 0, wire_bytes = 0, fallbacks = 0;  // of the gradients
};

// A parameter's gradient: its name and its parts' element counts, in row order.
struct GradientParts {
  std::string name;
  std::vector<size_t> counts;
};

// The gradient sync over the parameters' parts: the parameters' .grad tensors
// are views of its fusion buffers. Overlapped, a bucket is reduced as soon as
// its parts are marked ready; otherwise all of them after backward.
class Exchange {
 public:
  Exchange(Communicator& comm, fusion::GradientSyncOptions o, const std::vector<GradientParts>& params)
      : sync_(comm, std::move(o)) {
    for (const auto& p : params)
      ids_.push_back(p.counts.size() == 1 ? std::vector<int>{sync_.register_gradient(p.name, p.counts[0])}
                                          : sync_.register_gradient_parts(p.name, p.counts));
    sync_.finalize(Clock::now() + std::chrono::seconds(60));
  }
  // The parameter's whole gradient (its parts back to back).
  float* storage(size_t param) { return sync_.data_as<float>(ids_[param][0]); }
  void mark_ready(size_t param, int part) { sync_.mark_ready(ids_[param][size_t(part)]); }
  void report(std::span<const fusion::Metric> m) { sync_.report_metrics(m); }
  Exchanged finish(Deadline deadline) {
    sync_.wait(deadline);
    const auto& s = sync_.last_step();
    return {s.communicated, s.exposed, s.communication, s.bytes_reduced, s.wire_bytes, s.compression_fallbacks};
  }
  // Before finish(): until that part is reduced (deferred updates).
  void wait_for(size_t param, int part, Deadline deadline) { sync_.wait_gradient(ids_[param][size_t(part)], deadline); }
  std::span<const fusion::Metric> metrics() const { return sync_.metrics(); }
  void zero() { sync_.zero_gradients(); }

 private:
  fusion::GradientSync sync_;
  std::vector<std::vector<int>> ids_;  // per parameter, per part
};

}  // namespace tandem::trainer
