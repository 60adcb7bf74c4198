// Engine: runs a communicator's calls in issue order. Collectives one at a
// time, on the engine thread or, when the communicator is idle, on the
// caller's thread (the inline path); point-to-point calls are posted and
// complete in the background (point_to_point.cc). A failure is sticky: every
// later call fails with it. Health checks during waits join what liveness,
// the endpoints and abort() say.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm_context.h"
#include "engine/asymmetric_fence.h"
#include "engine/task.h"
#include "liveness/call_check.h"
#include "liveness/liveness.h"
#include "tandem/reduce.h"
#include "transport/endpoints.h"

namespace tandem {

// One reusable scratch buffer, grown on demand.
class ScratchBuffer {
 public:
  explicit ScratchBuffer(MemoryType memory = MemoryType::host) : memory_(memory) {}
  ScratchBuffer(ScratchBuffer&& o) noexcept : memory_(o.memory_), data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ~ScratchBuffer() {
    if (data_) deallocate(memory_, data_);
  }
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      void* fresh = allocate(memory_, bytes);
      if (data_) deallocate(memory_, data_);
      data_ = fresh;
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  MemoryType memory_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class Engine {
 public:
  Engine(CommContext& ctx, Endpoints& endpoints, Liveness& liveness, CallCheck& calls)
      : ctx_(ctx), endpoints_(endpoints), liveness_(liveness), calls_(calls) {}
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void start();
  // Lets posted calls finish, joins the thread and fails what is still queued.
  void stop();
  // `revoked`: calls fail with Revoked (reason names who revoked), else Aborted.
  void abort(const std::string& reason, bool revoked = false);
  bool aborted() const { return aborted_; }
  bool revoked() const { return revoked_; }
  bool healthy() const { return !failed_ && !aborted_; }  // no call failed, no abort()
  uint32_t seq() const { return seq_; }                   // the running (or last) collective's number

  // Collectives and exchanges: queued (async) or run now; a blocking call returns an empty Request.
  Request submit(bool async, std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what);
  std::shared_ptr<Request::State> enqueue(Task task);
  void run_blocking(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what);
  // run_blocking's inline half: false, `body` untouched, when the call must queue.
  bool try_run_here(std::function<void(Channel&)>& body, const CollectiveOptions& o, const Description& what);
  Task make_task(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what) const;

  // Point-to-point (point_to_point.cc): a send/recv call checked, with its
  // messages; a blocking one, returning the source of a receive (else -1).
  Task p2p_task(std::span<const P2POp> ops, const CollectiveOptions& o);
  Request start_p2p(std::span<const P2POp> ops, const CollectiveOptions& o);
  int run_p2p(const P2POp* ops, size_t n, const CollectiveOptions& o);

  // For the running call's channel (engine_channel.h).
  CommContext& context() { return ctx_; }
  Endpoints& endpoints() { return endpoints_; }
  Liveness& liveness() { return liveness_; }
  CallCheck& calls() { return calls_; }
  void check_health(const Task& task, int waiting_on);
  // After a pause of this process (Liveness::paused()), a failure poll
  // before the call sends anything or writes into a peer's memory.
  void check_after_pause(const Task& task);
  void* scratch_buffer(size_t bytes, int slot, MemoryType memory);

 private:
  void run();
  // `started`: when the task began, for the flight recorder.
  void execute(Task& task, Clock::time_point started);
  // Marks the running collective failed (exchanges are not recorded) and dumps.
  void record_failure(const std::string& error, const char* reason, bool collective);
  // Records the abort; false if the engine was aborted already.
  bool mark_aborted(const std::string& reason, bool revoked);
  [[noreturn]] void throw_aborted();
  void check_open_locked() const;  // caller holds mu_
  bool pause_pending();            // a pause seen and its poll not yet made

  // Point-to-point (point_to_point.cc).
  void post(Task task);
  bool sweep_posted();  // one pass over the posted calls; true if one finished
  void fail_posted(std::exception_ptr error);
  void fail_call(const PostedCall& call, std::exception_ptr error);  // names a size mismatch for `call`
  void progress_posted();  // nothing queued but calls posted: progress and sleep briefly
  void run_p2p_blocking(Task task);
  bool run_p2p_inline(const P2POp* ops, size_t n, const CollectiveOptions& o, int* source);
  // This thread holds busy_ and its call is posted: progresses until the call
  // finishes or queued work takes the engine back, then releases busy_.
  void progress_here(Request::State& state, size_t bytes);
  // Takes busy_ when nothing is queued, without a lock while the
  // communicator is open (by plain stores when this thread holds the
  // lease); throws what closed it otherwise.
  bool take_busy_if_idle();
  // Releases busy_ (its holder), waking the engine thread if `wake` or if
  // work waits for it: queued calls, posted ones left behind, a stop.
  // Otherwise keeps it as this thread's lease.
  void release_busy(bool wake);
  // The lease's hand-backs: the lessee ends it (or finds it revoked) and
  // wakes the engine thread; the engine thread revokes it (under mu_).
  void end_lease();
  bool take_lease_back();

  CommContext& ctx_;
  Endpoints& endpoints_;
  Liveness& liveness_;
  CallCheck& calls_;

  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;             // guarded by mu_
  std::atomic<size_t> queued_{0};      // queue_.size(), written under mu_, read without it
  std::atomic<bool> stopping_{false};  // written under mu_
  // A call is executing (engine or inline). Taken by compare-and-swap: a
  // blocking call on an idle communicator takes no lock (the lock pairs were
  // a third of a 1-rank barrier's time). The engine thread takes it before
  // it pops a call, so a call run inline never overtakes one queued before.
  std::atomic<bool> busy_{false};
  // The lease: a thread whose call ran inline keeps busy_ between its calls
  // (leased_), so that its next call takes and gives it back by plain
  // stores, without a locked instruction, which would wait for the call's
  // stores to reach the peers. The engine thread revokes it when it has
  // work (lessee_ cleared, then a heavy fence; docs/algorithms.md, 'engine:
  // the caller's lease'). lessee_ and leased_ change under mu_ only.
  const bool leases_ = heavy_fences_available();
  std::atomic<const void*> lessee_{nullptr};  // the lessee's token (lease_token()), or null: none or revoked
  std::atomic<bool> leased_{false};           // busy_ is held by a lease
  std::atomic<bool> in_call_{false};          // the lessee is in a call (it alone writes it)
  // Posted calls were left unfinished by the last holder of busy_ (who
  // alone touches posted_): the engine thread's cue to progress them.
  std::atomic<bool> posted_left_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<bool> revoked_{false};
  std::string abort_reason_;   // guarded by mu_
  std::exception_ptr sticky_;  // touched only by the thread that holds busy_
  std::atomic<bool> failed_{false};
  // Point-to-point calls posted and not yet complete; touched only by the
  // thread that holds busy_ (the engine, or a blocking call run inline).
  std::deque<PostedCall> posted_;
  // The engine sleeps on UCX or the mailbox's doorbell: enqueue() must wake it.
  std::atomic<bool> sleeping_{false};
  uint32_t seq_ = 0;                                          // touched only by the thread that holds busy_
  bool pause_pending_ = false;                                // touched only by the thread that holds busy_
  std::vector<ScratchBuffer> host_scratch_, device_scratch_;  // by slot
  std::shared_ptr<Request::State> inline_state_;              // try_run_here's, reused while nothing else holds it
};

}  // namespace tandem
