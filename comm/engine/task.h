// A call as the engine runs it (Task), the state its Request waits on, and a
// point-to-point call posted to complete in the background (PostedCall).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "call_description.h"
#include "tandem/communicator.h"

namespace tandem {

struct Request::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Deadline deadline;  // the collective's own deadline
  int source = -1;    // a receive from any source: the sender

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
};

struct Task {
  std::function<void(Channel&)> body;
  std::shared_ptr<Request::State> state;
  std::chrono::milliseconds timeout;  // this call's, for messages
  Deadline deadline;
  Description what;
  std::vector<P2POp> p2p{};  // send/recv: the messages to post
};

// A point-to-point call, posted and completing in the background: each sweep
// polls its messages; the last to finish completes its Request.
struct PostedCall {
  Task task;
  std::vector<Pending> messages;  // by op
  Tag any_source_mask = 0;        // nonzero: op any_source_op receives from any rank
  size_t any_source_op = 0;
  unsigned sweeps = 0;
};

}  // namespace tandem
