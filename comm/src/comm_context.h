// CommContext: what every part of a communicator reads (its options, the
// store and the flight recorder) and the store conventions they share: keys
// under the communicator's prefix, store barriers, how long the store may
// take, and how a lost store is reported.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include "flight_recorder.h"
#include "tandem/communicator.h"
#include "tandem/store.h"

namespace tandem {

struct CommContext {
  explicit CommContext(CommOptions options) : opts(std::move(options)) {}

  CommOptions opts;
  std::shared_ptr<KeyValueStore> store;    // tandem's (StoreClient) or the one handed in
  std::unique_ptr<FlightRecorder> flight;  // the last collectives, for `tandem doctor`
  int store_host_rank = -1;                // the rank hosting the store, if a rank does

  int rank() const { return opts.rank; }
  int size() const { return opts.size; }
  std::string key(const std::string& k) const { return opts.prefix + "/" + k; }

  // Counts this rank in at a store barrier; returns the key set once all have arrived.
  std::string arrive(const std::string& barrier, Deadline deadline);
  void store_barrier(const std::string& name, Deadline deadline);

  // How long a store request may take before the store counts as silent.
  std::chrono::milliseconds store_patience() const {
    return opts.heartbeat.count() > 0 ? std::min<std::chrono::milliseconds>(opts.heartbeat, std::chrono::seconds(2))
                                      : std::chrono::seconds(2);
  }

  // The store stopped answering: names the rank that hosted it, if one did.
  [[noreturn]] void throw_store_lost(const std::exception& e) const;
};

}  // namespace tandem
