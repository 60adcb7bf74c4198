// The engine: the queue of calls, running one (on the engine thread or the
// caller's), health checks during its waits, and the scratch it borrows.
// Point-to-point calls: point_to_point.cc.
#include "engine/engine.h"

#include "engine/engine_channel.h"
#include "src/coarse_clock.h"
#include "src/subsystem_log.h"

namespace tandem {

void Engine::start() {
  thread_ = std::thread([this] { run(); });
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& t : queue_) t.state->finish(std::make_exception_ptr(Aborted("communicator destroyed")));
}

void Engine::abort(const std::string& reason, bool revoked) {
  if (!mark_aborted(reason, revoked)) return;
  cv_.notify_all();
  if (endpoints_.ucx) endpoints_.ucx->wake();  // a wait sleeping on the worker sees the abort now
  ctx_.flight->dump("abort: " + reason);
}

bool Engine::mark_aborted(const std::string& reason, bool revoked) {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return false;
  abort_reason_ = reason;
  revoked_ = revoked;
  aborted_ = true;
  return true;
}

void Engine::throw_aborted() {
  std::lock_guard<std::mutex> lock(mu_);
  if (revoked_) throw Revoked(abort_reason_);
  throw Aborted("communicator aborted: " + abort_reason_);
}

void Engine::check_open_locked() const {
  if (revoked_) throw Revoked(abort_reason_);
  if (aborted_) throw Aborted("communicator aborted: " + abort_reason_);
  if (stopping_) throw Aborted("communicator is shutting down");
}

Task Engine::make_task(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what) const {
  Task task{std::move(body), std::make_shared<Request::State>(), o.timeout.value_or(ctx_.opts.timeout), {}, what};
  task.deadline = coarse_now() + task.timeout;
  task.state->deadline = task.deadline;
  return task;
}

std::shared_ptr<Request::State> Engine::enqueue(Task task) {
  auto state = task.state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
    queue_.push_back(std::move(task));
    queued_.store(queue_.size());
  }
  cv_.notify_one();
  if (sleeping_) endpoints_.wake_sleeper();
  return state;
}

namespace {

// A state only the task holds (a blocking call's on the caller's thread) has
// nobody to wake: no lock, whose locked instruction would wait for this
// call's last stores to reach the peers.
void finish(Task& task, std::exception_ptr e) {
  if (task.state.use_count() == 1) {
    task.state->done = true;
    task.state->error = std::move(e);
    return;
  }
  task.state->finish(std::move(e));
}

const char* failure_kind(const std::exception& e) {
  if (dynamic_cast<const Timeout*>(&e)) return "timeout";
  if (dynamic_cast<const Revoked*>(&e)) return "revoked";
  if (dynamic_cast<const Aborted*>(&e)) return "abort";
  if (dynamic_cast<const PeerFailure*>(&e)) return "peer failure";
  return "failure";
}

}  // namespace

void Engine::execute(Task& task, Clock::time_point started) {
  if (task.what.collective == Collective::send_recv) return post(std::move(task));
  // Exchanges are not collectives: other ranks do not count them, and the
  // flight recorder (compared across ranks) leaves them out.
  const bool collective = !task.what.point_to_point();
  if (collective) {
    ++seq_;
    const Description& d = task.what;
    ctx_.flight->begin(seq_, {d.collective, d.dtype, d.op, d.count, d.root}, endpoints_.shm != nullptr, started);
  }
  if (sticky_) {
    finish(task, sticky_);
    if (collective) ctx_.flight->end(seq_, false, "not run: an earlier call failed");
    return;
  }
  try {
    if (aborted_) throw_aborted();
    check_after_pause(task);
    EngineChannel channel(*this, task);
    task.body(channel);
    channel.finish();
    finish(task, nullptr);
    if (collective) ctx_.flight->end(seq_, true);
  } catch (const CollectiveMismatch& e) {
    // The shared-memory path does not know the call's number.
    std::string text = e.what();
    if (text.find("call #") == std::string::npos) text = "call #" + std::to_string(seq_) + ": " + text;
    subsystem_log(Subsystem::engine).error("tandem rank {}: {}", ctx_.rank(), text);
    calls_.publish_mismatch(text);
    sticky_ = std::make_exception_ptr(CollectiveMismatch(text));
    failed_ = true;
    record_failure(text, "mismatch", collective);
    finish(task, sticky_);
  } catch (const std::exception& e) {
    // Any failure leaves peers in an unknown state (a mismatched collective
    // too): sticky. Only a mismatch is logged here, as nothing else names it.
    if (dynamic_cast<const InvalidArgument*>(&e))
      subsystem_log(Subsystem::engine).error("tandem rank {}: {}", ctx_.rank(), e.what());
    sticky_ = std::current_exception();
    failed_ = true;
    record_failure(e.what(), failure_kind(e), collective);
    finish(task, sticky_);
  }
}

void Engine::record_failure(const std::string& error, const char* reason, bool collective) {
  if (collective) ctx_.flight->end(seq_, false, error);
  ctx_.flight->dump(std::string(reason) + " at call #" + std::to_string(seq_));
}

void Engine::run() {
  for (;;) {
    Task task;
    bool have_task = false;
    {
      // Work first, then busy_: a caller holding it releases it and wakes
      // this thread if work waits (release_busy).
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (!stopping_ && queue_.empty() && !posted_left_) return false;
        bool idle = false;
        return busy_.compare_exchange_strong(idle, true) || take_lease_back();
      });
      // `posted_` is this thread's to read now that it holds busy_.
      if (queue_.empty() && posted_.empty()) {  // stopping
        busy_.store(false);
        return;
      }
      if (!queue_.empty()) {
        task = std::move(queue_.front());
        queue_.pop_front();
        queued_.store(queue_.size());
        have_task = true;
      }
    }
    if (have_task) {
      execute(task, coarse_now());
    } else {
      // Posted sends and receives finish even while the communicator shuts
      // down, within their deadlines; their health checks see an abort.
      progress_posted();
    }
    posted_left_.store(!posted_.empty(), std::memory_order_release);
    busy_.store(false);  // this thread looks for work next: nobody to wake
  }
}

namespace {

// The calling thread's token for the lease.
const void* lease_token() {
  thread_local const char token = 0;
  return &token;
}

}  // namespace

bool Engine::take_busy_if_idle() {
  if (stopping_ || aborted_) {
    std::lock_guard<std::mutex> lock(mu_);
    check_open_locked();
  }
  if (lessee_.load(std::memory_order_relaxed) == lease_token()) {
    // A call from inside this thread's running call queues, as it did
    // before there were leases (and waits until its deadline).
    if (in_call_.load(std::memory_order_relaxed)) return false;
    // The engine thread clears lessee_, fences heavily, then reads in_call_:
    // it sees this call, or this load sees the revoke.
    in_call_.store(true, std::memory_order_relaxed);
    light_fence();
    if (lessee_.load(std::memory_order_acquire) == lease_token() && queued_.load(std::memory_order_relaxed) == 0)
      return true;
    end_lease();  // revoked, or a call of this thread's queued before this one
    return false;
  }
  if (queued_.load() != 0) return false;
  bool idle = false;
  return busy_.compare_exchange_strong(idle, true);
}

void Engine::release_busy(bool wake) {
  const bool left = !posted_.empty();  // ours to read while we hold busy_
  posted_left_.store(left, std::memory_order_release);
  const bool keep = leases_ && !wake && !left;
  if (lessee_.load(std::memory_order_relaxed) == lease_token()) {
    if (keep) {
      in_call_.store(false, std::memory_order_release);
      light_fence();
      if (lessee_.load(std::memory_order_relaxed) == lease_token() && queued_.load(std::memory_order_relaxed) == 0 &&
          !stopping_)
        return;
    }
    return end_lease();
  }
  if (keep) {
    // This thread's first call since it held no lease: take one, under the
    // lock, so that the engine thread, which checks for work under it too,
    // either sees the lease or left its work for this check.
    std::lock_guard<std::mutex> lock(mu_);
    if (queued_.load() == 0 && !stopping_) {
      in_call_.store(false, std::memory_order_relaxed);
      lessee_.store(lease_token(), std::memory_order_relaxed);
      leased_.store(true, std::memory_order_relaxed);
      return;
    }
  }
  // Released by busy_'s store, and by the lock below when it matters: no
  // locked instruction of its own.
  busy_.store(false);
  // Sequentially consistent, both: a call queued after this store finds
  // busy_ clear, or this load finds it queued.
  if (!wake && !left && queued_.load() == 0 && !stopping_) return;
  { std::lock_guard<std::mutex> lock(mu_); }  // the engine thread is asleep in its wait, or sees busy_ clear
  cv_.notify_all();
}

void Engine::end_lease() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_call_.store(false, std::memory_order_release);
    if (lessee_.load(std::memory_order_relaxed) == lease_token()) {  // not revoked: give busy_ back
      lessee_.store(nullptr, std::memory_order_relaxed);
      leased_.store(false, std::memory_order_relaxed);
      busy_.store(false);
    }  // revoked: the engine thread takes busy_ over once in_call_ is clear
  }
  cv_.notify_all();
}

bool Engine::take_lease_back() {
  if (!leased_.load(std::memory_order_relaxed)) return false;  // a call holds busy_ and wakes this thread at its end
  if (lessee_.load(std::memory_order_relaxed) != nullptr) {
    lessee_.store(nullptr, std::memory_order_relaxed);
    heavy_fence();
  }
  if (in_call_.load(std::memory_order_acquire)) return false;  // its call's end sees the revoke and wakes this thread
  leased_.store(false, std::memory_order_relaxed);
  return true;  // busy_ is this thread's now
}

// Blocking calls on an idle communicator run on the caller's thread: no
// hand-off to the engine and back, which is most of a small collective's cost.
// Anything already queued keeps its place: then the call queues behind it.
void Engine::run_blocking(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what) {
  if (!try_run_here(body, o, what)) Request(enqueue(make_task(std::move(body), o, what))).wait();
}

bool Engine::try_run_here(std::function<void(Channel&)>& body, const CollectiveOptions& o, const Description& what) {
  if (!take_busy_if_idle()) return false;
  // The inline calls' request state, reused: nothing else holds it between calls.
  if (!inline_state_ || inline_state_.use_count() > 1) inline_state_ = std::make_shared<Request::State>();
  inline_state_->done = false;
  inline_state_->error = nullptr;
  inline_state_->source = -1;
  Task task{std::move(body), std::move(inline_state_), o.timeout.value_or(ctx_.opts.timeout), {}, what};
  const Clock::time_point now = coarse_now();
  task.deadline = now + task.timeout;
  task.state->deadline = task.deadline;
  execute(task, now);
  const std::exception_ptr error = task.state->error;
  inline_state_ = std::move(task.state);  // moved, not copied: no reference count to change
  // Wake the engine only if work arrived meanwhile: a futex wake per small
  // collective would cost more than the collective.
  release_busy(false);
  if (error) std::rethrow_exception(error);
  return true;
}

Request Engine::submit(bool async, std::function<void(Channel&)> body, const CollectiveOptions& o,
                       const Description& what) {
  if (async) return Request(enqueue(make_task(std::move(body), o, what)));
  run_blocking(std::move(body), o, what);
  return Request();
}

void Engine::check_health(const Task& task, int waiting_on) {
  ctx_.flight->waiting_on(waiting_on);
  if (aborted_.load(std::memory_order_relaxed)) throw_aborted();
  try {
    liveness_.check(task, seq_, waiting_on, endpoints_.ucx->failed_peer());
  } catch (const Revoked& e) {
    mark_aborted(e.what(), /*revoked=*/true);  // another rank revoked: so is this communicator, here too
    throw;
  }
}

// A rank stopped long enough to be recorded as failed may wake after the
// others shrank without it: its next call must fail even if it would only
// send (a gather's leaf, a broadcast's root) and so never wait.
void Engine::check_after_pause(const Task& task) {
  if (!pause_pending()) return;
  pause_pending_ = false;
  liveness_.poll_now();
  check_health(task, -1);
}

bool Engine::pause_pending() {
  if (liveness_.paused()) pause_pending_ = true;
  return pause_pending_;
}

void* Engine::scratch_buffer(size_t bytes, int slot, MemoryType memory) {
  if (slot < 0 || slot > 64) throw InvalidArgument("scratch slot out of range");
  auto& buffers = memory == MemoryType::host ? host_scratch_ : device_scratch_;
  while (buffers.size() <= size_t(slot)) buffers.emplace_back(memory);
  return buffers[slot].get(bytes);
}

}  // namespace tandem
