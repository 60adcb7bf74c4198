// CallHandle, what a work waits on: a collective's Request, started at issue,
// or a point-to-point call (a send, a receive, or a batch_isend_irecv as one
// group) that starts when it is first needed. Started at issue, it went to
// the communicator's engine thread and back, most of a small message's cost
// through torch; and torch's send, recv and waited isend/irecv wait at once.
// So the first wait() runs the call on its own thread (Communicator::run, the
// inline path), while the group's next call, a future, isCompleted() or the
// completer (for a work nobody waits on) start it in the background.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <vector>

#include "tandem/communicator.h"

namespace tandem::c10d_backend {

class CallHandle {
 public:
  explicit CallHandle(tandem::Request started) : request_(std::move(started)), state_(State::started) {}
  CallHandle(tandem::Communicator& comm, std::vector<tandem::P2POp> ops) : comm_(&comm), ops_(std::move(ops)) {}

  // Starts the call in the background unless it has started. Under the lock,
  // so that a later call of the group, started after this returns, follows it.
  void start() {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::unstarted) return;
    try {
      request_ = comm_->start(call());
      state_ = State::started;
    } catch (...) {
      error_ = std::current_exception();
      state_ = State::ran_here;
    }
  }

  // Joins a batch's op to the call; false once the call has started (the op needs a call of its own).
  bool add(const tandem::P2POp& op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::unstarted) return false;
    ops_.push_back(op);
    return true;
  }

  bool started() const {
    std::lock_guard<std::mutex> lock(mu_);
    return state_ != State::unstarted;
  }

  // Waits for the call within its own deadline, running it on this thread if
  // nobody has started it (no slower than the engine from 8 B to 16 MiB:
  // docs/performance.md); rethrows its error.
  void wait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (state_ == State::unstarted) {
      state_ = State::running_here;
      lock.unlock();
      run_here();
      lock.lock();
    }
    ran_.wait(lock, [&] { return state_ != State::running_here; });
    if (state_ == State::ran_here) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    lock.unlock();
    request_.wait();
  }

  // Starts the call if nobody has and waits until `deadline` at the latest
  // (Timeout; the call keeps running); rethrows its error.
  void wait(tandem::Deadline deadline) {
    start();
    std::unique_lock<std::mutex> lock(mu_);
    if (!ran_.wait_until(lock, deadline, [&] { return state_ != State::running_here; }))
      throw tandem::Timeout("tandem backend: the call did not finish by the wait's deadline");
    if (state_ == State::ran_here) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    lock.unlock();
    request_.wait(deadline);
  }

  // True once finished (false while unstarted); rethrows its error.
  bool test() {
    std::unique_lock<std::mutex> lock(mu_);
    if (state_ == State::unstarted || state_ == State::running_here) return false;
    if (state_ == State::ran_here) {
      if (error_) std::rethrow_exception(error_);
      return true;
    }
    lock.unlock();
    return request_.test();
  }

  // A finished receive: the rank it came from, else -1.
  int source() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::ran_here) return error_ ? -1 : source_;
    return state_ == State::started ? request_.source() : -1;
  }

 private:
  enum class State { unstarted, running_here, ran_here, started };

  tandem::Call call() const { return {.op = tandem::Op::group, .group = {ops_.data(), ops_.size()}, .options = {}}; }

  void run_here() {
    int source = -1;
    std::exception_ptr error;
    try {
      source = comm_->run(call());
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      source_ = source, error_ = error;
      state_ = State::ran_here;
    }
    ran_.notify_all();
  }

  tandem::Communicator* comm_ = nullptr;
  std::vector<tandem::P2POp> ops_;
  mutable std::mutex mu_;
  std::condition_variable ran_;  // running_here -> ran_here
  tandem::Request request_;
  State state_ = State::unstarted;
  std::exception_ptr error_;  // a call that ran here, or failed to start
  int source_ = -1;
};

}  // namespace tandem::c10d_backend
