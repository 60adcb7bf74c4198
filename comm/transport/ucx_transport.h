// UCP point-to-point transport: one context and one worker per communicator,
// one endpoint per peer. Used from one thread at a time (the communicator's
// engine) at a time, so the worker runs in serialized mode.
//
// With peer error handling on, endpoint errors are recorded (first failing
// peer wins) and every request to that peer completes with an error, which
// poll() turns into PeerFailure. Without it, the communicator learns of dead
// peers from the store.
//
// The context has UCP_FEATURE_WAKEUP: a waiter that has spun long enough arms
// the worker and sleeps on its event fd (sleep()) instead of burning a core;
// wake() interrupts that sleep from any thread.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/transport.h"

namespace tandem {

class UcxTransport {
 public:
  // With peer error handling, UCX also sends keepalives on idle endpoints;
  // `keepalive` > 0 sets their interval (UCX_KEEPALIVE_INTERVAL, when the
  // user has not set it; UCX's own default is 20 s).
  UcxTransport(int rank, int size, bool peer_error_handling, const std::string& net_devices,
               std::chrono::milliseconds keepalive = std::chrono::milliseconds(0));
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This worker's address, to publish through the store.
  std::string worker_address() const { return address_; }
  void connect(int peer, const std::string& address);

  // Post a tagged send / receive; never blocks. The returned Pending holds the
  // UCX request (or nothing, if it completed at once).
  Pending send(int peer, Tag tag, const void* data, size_t bytes);
  Pending recv(int peer, Tag tag, void* data, size_t bytes) { return recv(peer, tag, ~Tag(0), data, bytes); }
  // A receive matching any tag equal to `tag` under `mask` (a receive from
  // any source masks the sender); peer is whom error texts name (-1: anyone).
  Pending recv(int peer, Tag tag, Tag mask, void* data, size_t bytes);

  // One pass of the worker's progress engine; true if it made progress.
  bool progress() {
    if (ucp_worker_progress(worker_) == 0) return false;
    last_progress_ = Clock::now();
    return true;
  }
  // When progress() last made progress: a wait keeps polling while traffic flows.
  Clock::time_point last_progress() const { return last_progress_; }
  // Sleeps until the worker has an event (a message arrived, a send
  // completed), wake() is called, or `timeout` passes. Arms the worker first;
  // returns at once, without sleeping, when events are already pending (the
  // caller progresses and tests again either way).
  void sleep(std::chrono::microseconds timeout);
  // Interrupts sleep() on another thread (abort). Thread-safe.
  void wake();
  // True once p has completed; throws PeerFailure on a transport error and
  // InvalidArgument when a received message has an unexpected size (a
  // collective mismatched across ranks).
  bool poll(Pending& p) { return poll(p, nullptr); }
  // The same; a completed receive stores the tag it matched in *sender_tag.
  bool poll(Pending& p, Tag* sender_tag);
  // Whether a message whose tag matches `tag` under `mask` has arrived and
  // waits for a receive (left in place).
  bool probe(Tag tag, Tag mask);
  // Cancels an unfinished request and releases it (after an error or timeout).
  void cancel(Pending& p);

  // Peer whose endpoint reported an error, or -1.
  int failed_peer() const { return failed_peer_.load(std::memory_order_relaxed); }

  // Flushes and closes every endpoint, bounded by deadline (peers may be dead);
  // `force` closes without a flush (after a failure, peers may never answer).
  void close_endpoints(Deadline deadline, bool force = false);

  // Whether UCX can move CUDA device memory in this build and machine.
  bool supports_cuda_memory() const;

  // Transports chosen for each endpoint, e.g. "1: sysv/memory cma/memory".
  std::string describe() const;

 private:
  struct ErrorContext {
    UcxTransport* self;
    int peer;
  };
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  Clock::time_point last_progress_{};

  int rank_;
  int size_;
  bool peer_error_handling_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;  // the worker's wake-up fd (ucp_worker_get_efd)
  std::string address_;
  std::vector<ucp_ep_h> endpoints_;
  std::vector<ErrorContext> error_contexts_;
  std::atomic<int> failed_peer_{-1};
  ucs_status_t failed_status_ = UCS_OK;
};

}  // namespace tandem
