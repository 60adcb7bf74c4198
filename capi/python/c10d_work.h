// TandemWork, c10d's handle of one tandem call, and the Completer threads
// that complete works: in issue order (collectives) or in whatever order the
// calls finish (sends and receives).
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

class TandemWork : public c10d::Work {
 public:
  TandemWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
             const c10::optional<std::vector<at::Tensor>>& inputs = c10::nullopt)
      : c10d::Work(rank, type, profiling_title(type), inputs),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive from any source: the rank it came from (recvAnysource).
  int sourceRank() const override { return source_; }
  void set_source(int rank) { source_ = rank; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Completes the work: the error, or the outputs.
  void complete(std::exception_ptr error) {
    if (error) {
      future_->setError(error);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
    finish(error);
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_ = -1;
};

// A thread that waits for tandem requests and completes their works. In
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

  void submit(tandem::Request request, std::function<void()> after, c10::intrusive_ptr<TandemWork> work) {
    std::deque<Item> done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(Item{std::move(request), std::move(after), std::move(work)});
      done.swap(done_);
    }
    cv_.notify_one();
  }  // `done` goes here, on a Python thread

 private:
  struct Item {
    tandem::Request request;
    std::function<void()> after;
    c10::intrusive_ptr<TandemWork> work;
  };

  // Waits for the item's request (finished, or within its deadline) and completes its work.
  void finish(Item item) {
    std::exception_ptr error;
    try {
      item.request.wait();
      item.work->set_source(item.request.source());
      if (item.after) item.after();
    } catch (const tandem::Timeout& e) {
      // The words torch's callers match on a timeout (as in Gloo's "Timed out waiting ...").
      error = std::make_exception_ptr(std::runtime_error(std::string("tandem: Timed out (") + e.what() + ")"));
    } catch (...) {
      error = std::current_exception();
    }
    item.work->complete(error);
    // Its tensors may own Python objects, whose release takes the GIL. Not
    // here: at interpreter exit the thread destroying the process group
    // holds the GIL while it joins this one. The next submit, or this
    // object's destructor, releases them.
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
      finish(std::move(item));
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
        bool ready = going;  // the group is going: wait for each within its deadline
        try {
          ready = ready || it->request.test();
        } catch (...) {
          ready = true;  // failed: finish() rethrows into the work
        }
        if (!ready) {
          ++it;
          continue;
        }
        finish(std::move(*it));
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
