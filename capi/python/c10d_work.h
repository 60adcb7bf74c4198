// TandemWork, c10d's handle of one tandem call, and the threads that
// complete works: Completer in issue order (collectives), PollingCompleter in
// whatever order the calls finish (sends and receives, which other ranks may
// match in any order).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "tandem/communicator.h"

namespace tandem::c10d_backend {

class TandemWork : public c10d::Work {
 public:
  TandemWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)),
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

// Waits for tandem requests in issue order and completes their works.
class Completer {
 public:
  Completer() : thread_([this] { run(); }) {}
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

  void run() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        item.request.wait();  // bounded by the collective's deadline
        if (item.after) item.after();
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
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::deque<Item> done_;  // completed, not yet released
  bool stopping_ = false;
  std::thread thread_;
};

// Completes sends and receives as they finish, in any order: a receive
// posted first may finish last, and a send behind it must not wait for it
// (MPI's and Gloo's semantics). Polls with a growing pause while calls are
// outstanding (50 us to 1 ms), and sleeps when none are.
class PollingCompleter {
 public:
  PollingCompleter() : thread_([this] { run(); }) {}
  ~PollingCompleter() {
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
      incoming_.push_back(Item{std::move(request), std::move(after), std::move(work)});
      done.swap(done_);
    }
    cv_.notify_one();
  }  // released here, on a Python thread (see Completer)

 private:
  struct Item {
    tandem::Request request;
    std::function<void()> after;
    c10::intrusive_ptr<TandemWork> work;
  };

  void run() {
    std::deque<Item> pending;  // this thread only
    auto pause = std::chrono::microseconds(50);
    for (;;) {
      bool going = false;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        const auto ready = [&] { return stopping_ || !incoming_.empty(); };
        if (pending.empty()) {
          cv_.wait(lock, ready);
        } else {
          cv_.wait_for(lock, pause, ready);
        }
        going = stopping_;
        if (going && incoming_.empty() && pending.empty()) return;
        for (auto& item : incoming_) pending.push_back(std::move(item));
        incoming_.clear();
      }
      bool finished = false;
      for (auto it = pending.begin(); it != pending.end();) {
        std::exception_ptr error;
        try {
          if (!it->request.test() && !going) {
            ++it;
            continue;
          }
          it->request.wait();  // finished, or the group is going: within the call's deadline
          it->work->set_source(it->request.source());
          if (it->after) it->after();
        } catch (...) {
          error = std::current_exception();
        }
        it->work->complete(error);
        std::lock_guard<std::mutex> lock(mutex_);
        done_.push_back(std::move(*it));
        it = pending.erase(it);
        finished = true;
      }
      pause = finished ? std::chrono::microseconds(50) : std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> incoming_, done_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace tandem::c10d_backend
