// TandemWork, c10d's handle of one tandem call, and the Completer threads
// that finish works nobody waits on: in issue order (collectives) or in
// whatever order the calls finish (sends and receives).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>

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
// in between) or the Completer, which finishes works nobody waits on (their
// futures, isCompleted()).
class TandemWork : public c10d::Work {
 public:
  // `after` runs once the request has finished (copies a result back); an empty request: finished by complete().
  TandemWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
             const c10::optional<std::vector<at::Tensor>>& inputs = c10::nullopt, tandem::Request request = {},
             std::function<void()> after = {})
      : c10d::Work(rank, type, profiling_title(type), inputs),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
        request_(std::move(request)),
        after_(std::move(after)) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive from any source: the rank it came from (recvAnysource).
  int sourceRank() const override { return source_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override {
    if (timeout == ::kNoTimeout) {
      settle();
    } else {
      try {
        request_.wait(tandem::Clock::now() + timeout);
      } catch (...) {  // not finished in time, or failed: c10d's wait below says which
      }
      settle_if_finished();
    }
    return c10d::Work::wait(timeout);
  }

  // Waits for the request (within its own deadline) and finishes the work.
  void settle() {
    try {
      request_.wait();  // outside the lock: every waiter wakes from the call itself
    } catch (...) {     // finish() rethrows it into the work
    }
    finish();
  }
  // Finishes the work if its request has finished; true if the work is finished.
  bool settle_if_finished() {
    bool finished = true;
    try {
      finished = request_.test();
    } catch (...) {  // failed: finish() rethrows it into the work
    }
    if (finished) finish();
    return finished;
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
      request_.wait();
      source_ = request_.source();
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
  tandem::Request request_;
  std::function<void()> after_;
  std::mutex settle_mutex_;
  bool settled_ = false;
  int source_ = -1;
};

// A thread that finishes the works nobody waits on (a caller's wait()
// finishes its own), so that their futures complete. In
// order (collectives, which finish in issue order anyway): it waits for the
// oldest. Polling (sends and receives, which other ranks may match in any
// order: a receive posted first may finish last, and a send behind it must
// not wait for it, as in MPI and Gloo): it tests every outstanding request
// with a growing pause (50 us to 1 ms) and sleeps when none is outstanding.
class Completer {
 public:
  enum class Order { issue, completion };
  explicit Completer(Order order = Order::issue)
      : thread_([this, order] { order == Order::issue ? run_in_order() : run_polling(); }) {}
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
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
      done.swap(done_);
    }
    cv_.notify_one();
  }  // `done` goes here, on a Python thread

 private:
  using Item = c10::intrusive_ptr<TandemWork>;

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
        const auto ready = [&] { return stopping_ || !queue_.empty(); };
        if (pending.empty()) {
          cv_.wait(lock, ready);
        } else {
          cv_.wait_for(lock, pause, ready);
        }
        going = stopping_;
        if (going && queue_.empty() && pending.empty()) return;
        for (auto& item : queue_) pending.push_back(std::move(item));
        queue_.clear();
      }
      bool finished = false;
      for (auto it = pending.begin(); it != pending.end();) {
        if (going) {
          (*it)->settle();  // the group is going: wait for each within its deadline
        } else if (!(*it)->settle_if_finished()) {
          ++it;
          continue;
        }
        release_later(std::move(*it));
        it = pending.erase(it);
        finished = true;
      }
      pause = finished ? std::chrono::microseconds(50) : std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::deque<Item> done_;  // completed, not yet released
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::c10d_backend
