// Runs a test body as N real rank processes (fork) around a store hosted by
// the test process, with a hard wall-clock guard: a hang kills every rank and
// fails the test instead of stalling CI.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tandem/communicator.h"
#include "tandem/store.h"

namespace tandem::testing {

inline std::string unique_prefix() {
  static std::atomic<int> counter{0};
  return "test" + std::to_string(getpid()) + "_" + std::to_string(counter++);
}

// Exit code of a rank whose gtest expectations failed inside the body.
inline constexpr int kExpectationFailed = 3;
inline constexpr int kUncaughtException = 4;

class RankGroup {
 public:
  // body(options) runs in each child and returns its exit code.
  RankGroup(int size, const std::function<int(const CommOptions&)>& body, CommOptions base = {})
      : server_(std::make_unique<StoreServer>()) {
    for (int r = 0; r < size; ++r) {
      CommOptions o = base;
      o.rank = r;
      o.size = size;
      o.local_rank = r;
      o.local_size = size;
      o.store_address = server_->address();
      o.prefix = prefix_;
      fflush(stdout);
      fflush(stderr);
      pid_t pid = fork();
      if (pid == 0) {
        int code = 0;
        try {
          code = body(o);
          if (code == 0 && ::testing::Test::HasFailure()) code = kExpectationFailed;
        } catch (const std::exception& e) {
          fprintf(stderr, "[rank %d] uncaught exception: %s\n", r, e.what());
          code = kUncaughtException;
        }
        fflush(stdout);
        fflush(stderr);
        _exit(code);
      }
      pids_.push_back(pid);
    }
  }
  ~RankGroup() {
    for (pid_t p : pids_) {
      if (p > 0) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
      }
    }
  }

  pid_t pid(int rank) const { return pids_[rank]; }
  StoreServer& store() { return *server_; }

  // Exit code per rank (128 + signal for a signal), or -1 for ranks the guard had to kill.
  std::vector<int> wait(std::chrono::seconds guard) {
    const auto deadline = std::chrono::steady_clock::now() + guard;
    std::vector<int> codes(pids_.size(), -1);
    size_t left = pids_.size();
    while (left > 0 && std::chrono::steady_clock::now() < deadline) {
      for (size_t r = 0; r < pids_.size(); ++r) {
        if (pids_[r] <= 0) continue;
        int status = 0;
        if (waitpid(pids_[r], &status, WNOHANG) == pids_[r]) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          pids_[r] = 0;
          --left;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (pids_[r] > 0) {
        ADD_FAILURE() << "wall-clock guard (" << guard.count() << " s) killed rank " << r;
        kill(pids_[r], SIGKILL);
        waitpid(pids_[r], nullptr, 0);
        pids_[r] = 0;
      }
    }
    return codes;
  }

  // Waits and expects every rank to exit 0.
  void expect_success(std::chrono::seconds guard) {
    auto codes = wait(guard);
    for (size_t r = 0; r < codes.size(); ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  }

 private:
  std::unique_ptr<StoreServer> server_;
  std::string prefix_ = unique_prefix();
  std::vector<pid_t> pids_;
};

}  // namespace tandem::testing
