// Runs a test body as N real rank processes (fork) around a store hosted by
// the test process, with a hard wall-clock guard: a hang kills every rank and
// fails the test instead of stalling CI.
//
// The ranks are forked before the store's I/O thread starts: a child forked
// while another thread holds a lock (malloc's, or UCX's memory hooks') would
// inherit it locked and hang in ucp_init. The ranks retry connecting until
// the store is up.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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

// A port that was free a moment ago on 127.0.0.1 (the store binds it right after the fork).
inline uint16_t free_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Exit code of a rank whose gtest expectations failed inside the body.
inline constexpr int kExpectationFailed = 3;
inline constexpr int kUncaughtException = 4;

class RankGroup {
 public:
  // body(options) runs in each child and returns its exit code.
  // `store_options` sets the store's timeouts and caps; its port and secret are chosen here.
  RankGroup(int size, const std::function<int(const CommOptions&)>& body, CommOptions base = {},
            StoreServerOptions store_options = {}) {
    store_options.port = free_loopback_port();
    store_options.secret = base.secret;  // a job with a secret gets a store that demands it
    const std::string address = store_options.host + ":" + std::to_string(store_options.port);
    for (int r = 0; r < size; ++r) {
      CommOptions o = base;
      o.rank = r;
      o.size = size;
      o.local_rank = r;
      o.local_size = size;
      o.store_address = address;
      o.prefix = prefix_;
      if (const char* dir = std::getenv("TANDEM_FLIGHT_DIR"); dir && o.flight_dir.empty()) o.flight_dir = dir;
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
    server_ = std::make_unique<StoreServer>(store_options);
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
    size_t left = std::count_if(pids_.begin(), pids_.end(), [](pid_t p) { return p > 0; });
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

  // Waits for every rank but `left_running` (e.g. one stopped with SIGSTOP),
  // then kills and reaps that one. Codes as wait().
  std::vector<int> wait_for_all_but(int left_running, std::chrono::seconds guard) {
    const pid_t spared = pids_[left_running];
    pids_[left_running] = 0;
    auto codes = wait(guard);
    kill(spared, SIGKILL);
    int status = 0;
    waitpid(spared, &status, 0);
    codes[left_running] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
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
