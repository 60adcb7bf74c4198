// Communicator::Impl: the parts of a communicator joined. The context
// (options, store, flight recorder), the endpoints (how ranks reach each
// other), the call check and liveness (what ranks learn about each other
// through the store), and the engine that runs calls. Impl wires them up in
// create() and takes them down in the destructor (finalize).
#pragma once

#include <cstdint>
#include <memory>

#include "comm_context.h"
#include "engine/engine.h"
#include "liveness/call_check.h"
#include "liveness/liveness.h"
#include "tandem/communicator.h"
#include "tandem/store.h"
#include "transport/endpoints.h"

namespace tandem {

struct Communicator::Impl {
  explicit Impl(const CommOptions& options);

  // Store, start-up check, heartbeat, endpoints (create(), world size > 1).
  void connect();
  // Tells the other ranks this one is leaving; waits for them at a last
  // barrier when every call succeeded, so endpoints close with nothing in flight.
  void finalize();

  CommContext ctx;
  std::shared_ptr<Algorithms> algorithms;
  // When this rank hosts the store: shared with the communicators made from
  // this one (split, shrink, grow), which go on using it after this one ends.
  std::shared_ptr<StoreServer> server;
  Endpoints endpoints{ctx};
  CallCheck calls{ctx};
  Liveness liveness{ctx, calls};
  Engine engine{ctx, endpoints, liveness, calls};
  uint64_t splits = 0;   // split() calls so far, for the new communicators' keys
  uint64_t shrinks = 0;  // shrink() calls so far, likewise
  uint64_t grows = 0;    // grow() calls so far, likewise
  bool joined = false;   // made by join()
  // joiners_waiting()'s own connection to the job's store, kept between calls.
  std::unique_ptr<KeyValueStore> join_probe;

 private:
  bool finalize_barrier(Deadline deadline);
};

}  // namespace tandem
