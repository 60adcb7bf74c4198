// Liveness: whether the other ranks are still there, and who failed first.
// A thread beats on its own store handle every heartbeat / 2; the store
// records a rank silent for kSilentHeartbeats intervals as failed, or, when
// it does not track liveness, the ranks watch each other (peer_watch.h).
// While calls wait, the same thread polls the store every failure_poll for
// news (a failed rank, a revocation, a mismatch), so that a call's own wait
// makes no round trip to the store and allocates nothing unless there is
// news or it has waited failure_poll. During a wait, check() turns what the
// store and the transport report into the error that names the rank that failed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm_context.h"
#include "engine/task.h"
#include "liveness/call_check.h"
#include "liveness/peer_watch.h"

namespace tandem {

class Liveness {
 public:
  Liveness(CommContext& ctx, CallCheck& calls) : ctx_(ctx), calls_(calls) {}
  ~Liveness() { stop(); }  // a create() that fails after start() still joins the thread
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Registers this rank (or beats once) before any collective, then beats in the background.
  void start(Deadline deadline);
  // Stops beating and says goodbye, unless the heartbeat had failed.
  void stop();

  // Throws when a call waiting on `waiting_on` should stop: this rank's
  // heartbeat failed, `failed_peer` (a rank whose endpoint failed, or -1)
  // or a rank the store lists as failed (polled every failure_poll) is gone,
  // other ranks found the call mismatched, or the call's deadline passed.
  void check(const Task& task, uint32_t seq, int waiting_on, int failed_peer);
  // Where revoke() leaves its reason, under the communicator's prefix.
  static constexpr const char* kRevokedKey = "revoked";
  // True once after this process was paused (stopped, or starved of the CPU)
  // for a heartbeat or more, so long that the others may have recorded it as
  // failed and shrunk without it: a call that only sends would complete
  // without ever waiting, and so without a check(). Two loads and a coarse clock read.
  bool paused();
  // Makes the next check() poll the store whatever the time.
  void poll_now() {
    poll_requested_ = true;
    next_failure_poll_ = {};
  }
  // How long a sleeping wait may last before the next check() is due.
  std::chrono::microseconds until_next_check(const Task& task) const;

  // "rank 1 (host vm, pid 42) failed: <why the store recorded it><detail>".
  PeerFailure rank_died(int rank, const std::string& detail);
  // A transport error names the peer of one message, which may only have died
  // because another rank did: throws naming the rank the store saw die first.
  [[noreturn]] void blame_first_failure(const PeerFailure& seen, const Task& task, uint32_t seq);

 private:
  void throw_if_revoked(const Description& what, uint32_t seq, int waiting_on, Deadline deadline);
  bool store_has_news(Deadline until);  // on the watch thread

  CommContext& ctx_;
  CallCheck& calls_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<KeyValueStore> store_;   // the heartbeat's own handle
  std::unique_ptr<PeerWatch> peer_watch_;  // when the store does not track liveness
  bool stopping_ = false;                  // guarded by mu_
  std::string error_;                      // guarded by mu_
  std::atomic<bool> failed_{false};
  // The caller's own store poll: when it is next allowed, and whether poll_now() asked for one.
  Clock::time_point next_failure_poll_{};
  bool poll_requested_ = false;
  // The watch thread's finding, and when a call last checked health (Clock
  // ticks): the thread polls the store only while calls wait.
  std::atomic<bool> news_{false};
  std::atomic<Clock::rep> last_check_{0};
  // When the heartbeat thread last woke (ns on CLOCK_MONOTONIC_COARSE; 0: not beating), and
  // whether it found a heartbeat or more since the wake before.
  std::atomic<int64_t> last_beat_ns_{0};
  std::atomic<bool> pause_seen_{false};
};

}  // namespace tandem
