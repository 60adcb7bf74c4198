// Point-to-point calls: send, recv (from a rank or any source) and groups of
// them. Unlike collectives they are not run to completion one at a time:
// the engine posts each call's messages in issue order and completes them in
// the background (sweep_posted), so two ranks that each send and then
// receive never wait on each other. Over UCX, tags: the send_recv signature,
// sequence number 0, the sender, the caller's tag. Ranks that all share one
// host (with cross-memory attach) use the shared-memory mailbox instead.
#include <spdlog/spdlog.h>

#include <array>
#include <thread>

#include "communicator_impl.h"
#include "engine/wait_policy.h"

namespace tandem {
namespace {

// Blocking point-to-point calls moving fewer bytes skip the engine's wake-up (run_p2p_blocking).
constexpr size_t kQuietWakeMaxBytes = 8 << 10;

// Blocking calls of up to kInlineOps messages on the mailbox poll this many
// times before they become posted calls (run_p2p_inline): tens of microseconds.
constexpr size_t kInlineOps = 8;
constexpr unsigned kInlinePolls = 2048;

// The wait a posted call is in, for error texts: its first unfinished message's peer.
int waiting_on(const PostedCall& call) {
  for (const Pending& m : call.messages) {
    if (!m.done()) return m.peer();
  }
  return -1;
}

}  // namespace

void Engine::post(Task task) {
  if (sticky_) {
    task.state->finish(sticky_);
    return;
  }
  PostedCall call{std::move(task), {}, 0, 0, 0};
  try {
    if (aborted_) throw_aborted();
    check_after_pause(call.task);
    for (size_t i = 0; i < call.task.p2p.size(); ++i) {
      const P2POp& op = call.task.p2p[i];
      if (op.kind == P2POp::recv && op.peer == kAnySource) {
        call.any_source_mask = ~kSenderMask;
        call.any_source_op = i;
      }
      call.messages.push_back(endpoints_.post_message(op));
    }
  } catch (...) {
    for (auto& m : call.messages) endpoints_.cancel_message(m);
    sticky_ = std::current_exception();
    failed_ = true;
    call.task.state->finish(sticky_);
    return;
  }
  posted_.push_back(std::move(call));
}

bool Engine::sweep_posted() {
  if (posted_.empty()) return false;
  bool finished = false;
  try {
    endpoints_.progress_messages();
  } catch (...) {
    fail_posted(std::current_exception());
    return true;
  }
  const auto poll_all = [&](PostedCall& call) {
    bool done = true;
    for (size_t i = 0; i < call.messages.size(); ++i) {
      int source = -1;
      if (call.messages[i].done()) continue;
      if (!endpoints_.poll_message(call.messages[i], &source)) {
        done = false;
      } else if (call.any_source_mask && i == call.any_source_op) {
        call.task.state->source = source;
      }
    }
    return done;
  };
  for (auto it = posted_.begin(); it != posted_.end();) {
    PostedCall& call = *it;
    try {
      bool done = poll_all(call);
      if (!done && ++call.sweeps % 128 == 0) {
        try {
          check_health(call.task, waiting_on(call));
        } catch (...) {
          // A peer that took this call's messages and then left (after its
          // own error) is no failure of this call: look once more.
          if (!poll_all(call)) throw;
          done = true;
        }
      }
      if (!done) {
        ++it;
        continue;
      }
    } catch (...) {
      fail_call(call, std::current_exception());
      return true;
    }
    const P2POp& first = call.task.p2p[0];
    if (call.task.p2p.size() == 1 && first.kind == P2POp::recv && first.peer >= 0) call.task.state->source = first.peer;
    call.task.state->finish(nullptr);
    it = posted_.erase(it);
    finished = true;
  }
  return finished;
}

void Engine::fail_call(const PostedCall& call, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveMismatch&) {
    const CollectiveMismatch named(describe_wait(call.task.what, seq_, ctx_.opts.rank, waiting_on(call)) +
                                   ": a message's size differs from its receive buffer's; the sender's count and "
                                   "dtype must match the receiver's");
    fail_posted(std::make_exception_ptr(named));
  } catch (...) {
    fail_posted(error);
  }
}

void Engine::fail_posted(std::exception_ptr error) {
  // A failure leaves the peers' messages in an unknown state: sticky, as for collectives.
  if (!sticky_) {
    sticky_ = error;
    failed_ = true;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      record_failure(e.what(), "point-to-point failure", false);
    }
  }
  for (auto& call : posted_) {
    for (auto& m : call.messages) endpoints_.cancel_message(m);
    call.task.state->finish(error);
  }
  posted_.clear();
}

void Engine::progress_posted() {
  // Spin for kUcxSpin (small messages land within microseconds), then poll
  // yielding the core while messages stream (through the mailbox, for
  // kMailboxYieldWindow: a sleeping core may wake late), then sleep on the
  // worker's event fd or the doorbell; enqueue() wakes it for new work. Returns when a call finished
  // or work was queued.
  const auto work_queued = [&] { return queued_.load() != 0 || aborted_; };
  Clock::time_point spin_until{};
  for (unsigned spins = 1; !posted_.empty(); ++spins) {
    if (sweep_posted()) return;
    if (spins % 16 == 0) {
      if (work_queued()) return;
      const auto now = Clock::now();
      if (spin_until == Clock::time_point{}) {
        spin_until = now + kUcxSpin;
      } else if (now >= spin_until) {
        break;
      }
    }
    if (endpoints_.oversubscribed && spins > kSpinsBeforeYield) std::this_thread::yield();
  }
  const Clock::time_point yield_until = Clock::now() + kMailboxYieldWindow;
  while (!posted_.empty()) {
    if (sweep_posted() || work_queued()) return;
    if (endpoints_.mailbox_yields(yield_until)) {
      std::this_thread::yield();
      continue;
    }
    if (endpoints_.mailbox) {
      // Sleep until a peer rings this rank's doorbell (it wrote to us or read
      // what we sent): woken at once, the rank runs ahead of whatever shares
      // its core, where yields and timed naps lost it the core for whole
      // time slices (1 MiB exchanges on a loaded host, 2-3x slower).
      const uint32_t bell = endpoints_.mailbox->announce_sleep();
      sleeping_ = true;
      const bool ready = sweep_posted() || work_queued();
      endpoints_.mailbox->sleep(bell, ready
                                          ? std::chrono::microseconds(0)
                                          : std::min(liveness_.until_next_check(posted_.front().task), kUcxSleepSlice));
      sleeping_ = false;
      return;
    }
    if (Clock::now() - endpoints_.ucx->last_progress() < kUcxBusyWindow) {
      std::this_thread::yield();
      continue;
    }
    sleeping_ = true;
    if (!work_queued())
      endpoints_.ucx->sleep(std::min(liveness_.until_next_check(posted_.front().task), kUcxSleepSlice));
    sleeping_ = false;
    return;
  }
}

// ---- The API ----------------------------------------------------------------

namespace {

void check_op(const P2POp& op, int size, const char* what) {
  const bool any = op.kind == P2POp::recv && op.peer == kAnySource;
  if (!any && (op.peer < 0 || op.peer >= size)) {
    throw InvalidArgument(std::string(what) + ": peer " + std::to_string(op.peer) + " is out of range for world size " +
                          std::to_string(size) +
                          (op.kind == P2POp::recv ? " (kAnySource receives from any rank)" : ""));
  }
  if (op.count > 0 && !op.data)
    throw InvalidArgument(std::string(what) + ": null buffer with count " + std::to_string(op.count));
  if (op.tag > uint32_t(INT32_MAX)) {
    throw InvalidArgument(std::string(what) + ": tag " + std::to_string(op.tag) + " is out of range 0..2^31-1");
  }
}

void check_ops(const P2POp* ops, size_t n, int size) {
  size_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    check_op(ops[i], size, n == 1 ? (ops[i].kind == P2POp::send ? "send" : "recv") : "group");
    any += ops[i].kind == P2POp::recv && ops[i].peer == kAnySource;
  }
  if (any > 1) throw InvalidArgument("group: at most one receive from any source per group");
  if (n > 0 && size == 1) throw InvalidArgument("send and recv need a peer: this communicator has one rank");
}

Description describe_ops(const P2POp* ops, size_t n) {
  if (n == 1) return {Collective::send_recv, ops[0].count, ops[0].dtype, std::nullopt, ops[0].peer, ops[0].tag};
  return {Collective::send_recv, n, std::nullopt, std::nullopt};
}

}  // namespace

Task Engine::p2p_task(std::span<const P2POp> ops, const CollectiveOptions& o) {
  check_ops(ops.data(), ops.size(), ctx_.opts.size);
  endpoints_.memory_type(o);
  Task task = make_task({}, o, describe_ops(ops.data(), ops.size()));
  task.p2p.assign(ops.begin(), ops.end());
  if (ops.empty()) task.state->finish(nullptr);
  return task;
}

Request Engine::start_p2p(std::span<const P2POp> ops, const CollectiveOptions& o) {
  Task task = p2p_task(ops, o);
  if (ops.empty()) return Request(task.state);
  return Request(enqueue(std::move(task)));
}

// A blocking call on an idle communicator posts and progresses on the
// caller's thread, as a blocking collective runs (no hand-off to the engine
// and back, most of a small message's latency). Work queued meanwhile by
// another thread takes the engine back: this call then waits like any other.
void Engine::run_p2p_blocking(Task task) {
  auto state = task.state;
  if (task.p2p.empty()) return;
  size_t bytes = 0;
  for (const P2POp& op : task.p2p) bytes += op.count * dtype_size(op.dtype);
  if (take_busy_if_idle()) {
    post(std::move(task));
    progress_here(*state, bytes);
  } else {
    enqueue(std::move(task));
  }
  Request(state).wait();
}

void Engine::progress_here(Request::State& state, size_t bytes) {
  const auto finished = [&] {
    std::lock_guard<std::mutex> lock(state.mu);
    return state.done;
  };
  for (;;) {
    if (finished() || queued_.load() != 0 || stopping_) break;  // done, or hand the engine back
    progress_posted();
  }
  // Small messages wake the engine only if it has work (queued meanwhile, or
  // this call's messages handed back): the futex wake and context switch
  // cost more than the message (2 ranks, 64 B-4 KiB: 3-5x faster without).
  // From kQuietWakeMaxBytes on, skipping it measured 2-3x slower (32-256
  // KiB: the ranks then slept through UCX's rendezvous): wake as before.
  // The mailbox has no rendezvous to sleep through.
  release_busy(!endpoints_.mailbox && bytes >= kQuietWakeMaxBytes);
}

// A blocking call on an idle communicator whose messages go through the
// mailbox: posted and polled here without a Task (shared request state,
// deadline, posted call), most of a small message's cost. One still
// unfinished after kInlinePolls, or failing, becomes a posted call as any other.
bool Engine::run_p2p_inline(const P2POp* ops, size_t n, const CollectiveOptions& o, int* source) {
  if (!take_busy_if_idle()) return false;
  if (!posted_.empty() || sticky_ || aborted_ || pause_pending()) {  // ours to read while we hold busy
    release_busy(false);
    return false;
  }
  std::array<Pending, kInlineOps> messages;
  size_t left = 0, bytes = 0;
  int any_op = -1;
  for (size_t i = 0; i < n; ++i) {
    const P2POp& op = ops[i];
    bytes += op.count * dtype_size(op.dtype);
    messages[i] = endpoints_.post_message(op);
    if (op.kind == P2POp::recv) {
      if (op.peer == kAnySource) any_op = int(i);
      *source = op.peer;
    }
    left += !messages[i].done();
  }
  std::exception_ptr error;
  try {
    for (unsigned polls = 0; left > 0 && polls < kInlinePolls; ++polls) {
      endpoints_.mailbox->progress();
      for (size_t i = 0; i < n; ++i) {
        int from = -1;
        if (messages[i].done() || !endpoints_.mailbox->poll(messages[i], &from)) continue;
        --left;
        if (int(i) == any_op) *source = from;
      }
      if (endpoints_.oversubscribed && polls > kSpinsBeforeYield) std::this_thread::yield();
    }
  } catch (...) {
    error = std::current_exception();
  }
  if (left == 0 && !error) {
    release_busy(false);
    return true;
  }
  Task task = make_task({}, o, describe_ops(ops, n));
  task.p2p.assign(ops, ops + n);
  auto state = task.state;
  PostedCall call{std::move(task), {}, 0, 0, 0};
  for (size_t i = 0; i < n; ++i) call.messages.push_back(std::move(messages[i]));
  if (any_op >= 0) {
    call.any_source_mask = ~kSenderMask;
    call.any_source_op = size_t(any_op);
    if (call.messages[size_t(any_op)].done()) state->source = *source;
  }
  posted_.push_back(std::move(call));
  if (error) fail_call(posted_.back(), error);
  progress_here(*state, bytes);
  Request request(state);
  request.wait();
  *source = request.source();
  return true;
}

int Engine::run_p2p(const P2POp* ops, size_t n, const CollectiveOptions& o) {
  int source = -1;
  if (endpoints_.mailbox && n > 0 && n <= kInlineOps && o.memory == MemoryType::host) {
    check_ops(ops, n, ctx_.opts.size);
    if (run_p2p_inline(ops, n, o, &source)) return source;
  }
  Task task = p2p_task({ops, n}, o);
  Request request(task.state);
  run_p2p_blocking(std::move(task));
  return request.source();
}

}  // namespace tandem
