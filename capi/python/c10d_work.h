// TandemWork, c10d's handle of one tandem call, and the Completer threads
// that finish works nobody waits on: in issue order (collectives) or in
// whatever order the calls finish (sends and receives, which the completer
// also starts when nobody has waited on them for kUnwaitedStart).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "c10d_call.h"
#include "tandem/communicator.h"

namespace tandem::c10d_backend {

// The profiler's name of a call ("tandem:all_reduce", as Gloo's "gloo:all_reduce").
inline const char* profiling_title(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST: return "tandem:broadcast";
    case c10d::OpType::ALLREDUCE: return "tandem:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED: return "tandem:all_reduce";  // Gloo's names for the coalesced calls
    case c10d::OpType::REDUCE: return "tandem:reduce";
    case c10d::OpType::ALLGATHER: return "tandem:all_gather";
    case c10d::OpType::_ALLGATHER_BASE: return "tandem:_allgather_base";
    case c10d::OpType::ALLGATHER_COALESCED: return "tandem:all_gather";
    case c10d::OpType::GATHER: return "tandem:gather";
    case c10d::OpType::SCATTER: return "tandem:scatter";
    case c10d::OpType::REDUCE_SCATTER: return "tandem:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE: return "tandem:_reduce_scatter_base";
    case c10d::OpType::ALLTOALL_BASE: return "tandem:all_to_all";
    case c10d::OpType::ALLTOALL: return "tandem:all_to_all";
    case c10d::OpType::SEND: return "tandem:send";
    case c10d::OpType::RECV: return "tandem:recv";
    case c10d::OpType::RECVANYSOURCE: return "tandem:recvAnySource";
    case c10d::OpType::BARRIER: return "tandem:barrier";
    default: return "tandem:unknown";
  }
}

// One tandem call as c10d's Work. It finishes once, on whichever thread gets
// there first: the caller's wait() (woken by the call itself, with no thread
// in between, or running it: CallHandle) or the Completer, which finishes
// works nobody waits on (their futures, isCompleted()).
class TandemWork : public c10d::Work {
 public:
  // `after` runs once the call has finished (copies a result back); no call: finished by complete().
  TandemWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
             const c10::optional<std::vector<at::Tensor>>& inputs = c10::nullopt,
             std::shared_ptr<CallHandle> call = nullptr, std::function<void()> after = {})
      : c10d::Work(rank, type, profiling_title(type), inputs),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
        call_(call ? std::move(call) : std::make_shared<CallHandle>(tandem::Request{})),
        after_(std::move(after)),
        issued_(std::chrono::steady_clock::now()) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive from any source: the rank it came from (recvAnysource).
  int sourceRank() const override { return source_; }
  // Whoever asks for the future or polls means to wait elsewhere: the call starts now.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    call_->start();
    return future_;
  }
  bool isCompleted() override {
    call_->start();
    return c10d::Work::isCompleted();
  }

  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override {
    if (timeout == ::kNoTimeout) {
      settle();
    } else {
      try {
        call_->wait(tandem::Clock::now() + timeout);
      } catch (...) {  // not finished in time, or failed: c10d's wait below says which
      }
      settle_if_finished();
    }
    return c10d::Work::wait(timeout);
  }

  // Waits for the call (within its own deadline) and finishes the work.
  void settle() {
    try {
      call_->wait();  // outside the lock: every waiter wakes from the call itself
    } catch (...) {   // finish() rethrows it into the work
    }
    finish();
  }
  // Finishes the work if its call has finished; true if the work is finished.
  bool settle_if_finished() {
    bool finished = true;
    try {
      finished = call_->test();
    } catch (...) {  // failed: finish() rethrows it into the work
    }
    if (finished) finish();
    return finished;
  }

  // Starts the call if it is still unstarted `after` its issue; false if it is unstarted yet.
  bool start_if_unwaited(std::chrono::steady_clock::time_point now, std::chrono::microseconds after) {
    if (call_->started()) return true;
    if (now - issued_ < after) return false;
    call_->start();
    return true;
  }
  std::chrono::steady_clock::time_point issued() const { return issued_; }
  bool started() const { return call_->started(); }
  bool settled() {
    std::lock_guard<std::mutex> lock(settle_mutex_);
    return settled_;
  }

  // Completes a work that has no request: the error, or the outputs.
  void complete(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(settle_mutex_);
    complete_once(error);
  }

 private:
  void finish() {
    std::lock_guard<std::mutex> lock(settle_mutex_);
    if (settled_) return;
    std::exception_ptr error;
    try {
      call_->wait();
      source_ = call_->source();
      if (after_) after_();
    } catch (const tandem::Timeout& e) {
      // The words torch's callers match on a timeout (as in Gloo's "Timed out waiting ...").
      error = std::make_exception_ptr(std::runtime_error(std::string("tandem: Timed out (") + e.what() + ")"));
    } catch (...) {
      error = std::current_exception();
    }
    complete_once(error);
  }

  void complete_once(std::exception_ptr error) {
    if (settled_) return;
    settled_ = true;
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    c10d::Work::finish(error);
  }

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<CallHandle> call_;
  std::function<void()> after_;
  std::chrono::steady_clock::time_point issued_;
  std::mutex settle_mutex_;
  bool settled_ = false;
  int source_ = -1;
};

// A point-to-point call nobody has waited on for this long is started by
// the completer (a waited one runs on the waiting thread). It bounds how long
// an isend left to run while the caller computes waits to start; the
// completer wakes about this often while sends and receives are issued.
constexpr auto kUnwaitedStart = std::chrono::microseconds(100);

// A thread that finishes the works nobody waits on (a caller's wait()
// finishes its own), so that their futures complete. In order (collectives,
// which finish in issue order anyway): it waits for the oldest. Polling
// (sends and receives, which other ranks may match in any order: a receive
// posted first may finish last, and a send behind it must not wait for it,
// as in MPI and Gloo): it starts the calls nobody has waited on for
// kUnwaitedStart, tests every started one with a growing pause (50 us to
// 1 ms) and sleeps when none is outstanding. A submit wakes it only from
// that sleep: a work waited on at once costs no wake-up.
class Completer {
 public:
  enum class Order { issue, completion };
  explicit Completer(Order order = Order::issue)
      : order_(order), thread_([this] { order_ == Order::issue ? run_in_order() : run_polling(); }) {}
  ~Completer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void submit(c10::intrusive_ptr<TandemWork> work) {
    std::deque<c10::intrusive_ptr<TandemWork>> done;
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
      done.swap(done_);
      wake = order_ == Order::issue || idle_;
    }
    if (wake) cv_.notify_one();
  }  // `done` goes here, on a Python thread

 private:
  using Item = c10::intrusive_ptr<TandemWork>;
  using SteadyClock = std::chrono::steady_clock;

  // Its tensors may own Python objects, whose release takes the GIL. Not
  // here: at interpreter exit the thread destroying the process group
  // holds the GIL while it joins this one. The next submit, or this
  // object's destructor, releases them.
  void release_later(Item item) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_.push_back(std::move(item));
  }

  void run_in_order() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      item->settle();
      release_later(std::move(item));
    }
  }

  void run_polling() {
    std::deque<Item> pending;  // this thread only
    auto pause = std::chrono::microseconds(50);
    for (;;) {
      bool going = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        take_queue(pending);
        if (pending.empty() && !stopping_) {
          idle_ = true;
          cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
          idle_ = false;
        } else if (!stopping_) {
          cv_.wait_for(lock, next_look(pending, pause), [&] { return stopping_; });
        }
        going = stopping_;
        take_queue(pending);
        if (going && pending.empty()) return;
      }
      const bool finished = going ? settle_all(pending) : look(pending);
      pause = finished ? std::chrono::microseconds(50) : std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  void take_queue(std::deque<Item>& pending) {  // caller holds mutex_
    for (auto& item : queue_) pending.push_back(std::move(item));
    queue_.clear();
  }

  // How long to sleep: the pause while calls run, less if an unstarted one comes due sooner.
  std::chrono::microseconds next_look(const std::deque<Item>& pending, std::chrono::microseconds pause) const {
    const auto now = SteadyClock::now();
    auto wait = pause;
    for (const auto& item : pending) {
      if (item->started()) continue;
      const auto due = std::chrono::duration_cast<std::chrono::microseconds>(item->issued() + kUnwaitedStart - now);
      wait = std::min(wait, std::max(due, std::chrono::microseconds(0)));
    }
    return wait;
  }

  // Starts what came due, finishes what has finished; true if this thread finished a work.
  bool look(std::deque<Item>& pending) {
    bool finished = false;
    const auto now = SteadyClock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      const bool settled_elsewhere = (*it)->settled();  // waited on: no reason to look sooner
      if (!settled_elsewhere && (!(*it)->start_if_unwaited(now, kUnwaitedStart) || !(*it)->settle_if_finished())) {
        ++it;
        continue;
      }
      finished = finished || !settled_elsewhere;
      release_later(std::move(*it));
      it = pending.erase(it);
    }
    return finished;
  }

  // The group is going: each call is started and waited for within its deadline.
  bool settle_all(std::deque<Item>& pending) {
    for (auto& item : pending) {
      item->settle();
      release_later(std::move(item));
    }
    pending.clear();
    return true;
  }

  const Order order_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::deque<Item> done_;  // completed, not yet released
  bool stopping_ = false;
  bool idle_ = false;  // the polling thread sleeps until a submit
  std::thread thread_;
};

}  // namespace tandem::c10d_backend
