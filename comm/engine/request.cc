// Request: the handle of an asynchronous collective; waits for the engine to finish it.
#include "engine/task.h"

namespace tandem {

bool Request::test() {
  if (!state_) throw InvalidArgument("test() on an empty Request");
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->done && state_->error) std::rethrow_exception(state_->error);
  return state_->done;
}

void Request::wait() {
  if (!state_) throw InvalidArgument("wait() on an empty Request");
  // The engine enforces the collective's deadline; the slack covers handing the result back.
  wait(state_->deadline + std::chrono::seconds(5));
}

void Request::wait(Deadline deadline) {
  if (!state_) throw InvalidArgument("wait() on an empty Request");
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) {
    throw Timeout("Request::wait: the collective did not finish by the given deadline");
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

int Request::source() const {
  if (!state_) return -1;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done && !state_->error ? state_->source : -1;
}

}  // namespace tandem
