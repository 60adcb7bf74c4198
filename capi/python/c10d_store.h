// C10dStore: tandem's KeyValueStore over the c10d::Store a process group is
// handed, so the communicator bootstraps through it (tandem._c10d).
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem::c10d_backend {

// tandem's KeyValueStore over a c10d::Store (TCPStore, FileStore, HashStore,
// each behind the group's PrefixStore). c10d's get and wait block up to the
// store's own timeout while holding the store's lock (TCPStore 1.13 serialises
// every call on one mutex), so blocking calls here poll check() instead
// (TCPStore's wait with a timeout would leave its reply in the connection),
// 1 ms apart, doubling up to world size / 10 ms (2..50 ms): the whole world
// asks the store at most ~10,000 times a second while it waits, and a small
// world does not oversleep its start-up. tandem's deadline holds, and the
// heartbeat's handle, which shares the store (connect_again), is never held
// up for long.
// TCPStore, FileStore, HashStore and PrefixStore guard each call with a
// mutex, so two threads may call them. set/add/check/deleteKey cannot be
// bounded from outside: they return when the store answers. c10d's errors
// become PeerFailure(-1) (the store is gone or broken), its timeouts Timeout.
class C10dStore final : public tandem::KeyValueStore {
 public:
  C10dStore(c10::intrusive_ptr<c10d::Store> store, int world_size)
      : store_(std::move(store)),
        world_size_(world_size),
        poll_max_(std::clamp(std::chrono::milliseconds(world_size / 10), std::chrono::milliseconds(2),
                             std::chrono::milliseconds(50))) {}

  void set(const std::string& key, const std::string& value, tandem::Deadline) override {
    guarded("set of key '" + key + "'", [&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  std::string get(const std::string& key, tandem::Deadline deadline) override {
    wait({key}, deadline);
    return fetch(key);
  }
  std::optional<std::string> try_get(const std::string& key, tandem::Deadline deadline) override {
    if (!check({key}, deadline)) return std::nullopt;
    return fetch(key);
  }
  int64_t add(const std::string& key, int64_t delta, tandem::Deadline) override {
    int64_t total = 0;
    guarded("add to key '" + key + "'", [&] { total = store_->add(key, delta); });
    return total;
  }
  void wait(const std::vector<std::string>& keys, tandem::Deadline deadline) override {
    const auto start = tandem::Clock::now();
    auto pause = std::chrono::milliseconds(1);
    while (!check(keys, deadline)) {
      const auto now = tandem::Clock::now();
      if (now >= deadline) {
        throw tandem::Timeout(
            "c10d store: wait for " + std::to_string(keys.size()) + " key(s), the first '" + keys.front() +
            "', timed out after " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count()) +
            " ms (a rank never set it: it did not start, failed, or joined another group)");
      }
      std::this_thread::sleep_for(std::min<tandem::Clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, poll_max_);
    }
  }
  bool check(const std::vector<std::string>& keys, tandem::Deadline) override {
    bool all = false;
    guarded("check of key '" + (keys.empty() ? std::string() : keys.front()) + "'", [&] { all = store_->check(keys); });
    return all;
  }
  void erase(const std::string& key, tandem::Deadline) override {
    guarded("delete of key '" + key + "'", [&] { store_->deleteKey(key); });
  }
  std::unique_ptr<tandem::KeyValueStore> connect_again(tandem::Deadline) override {
    return std::make_unique<C10dStore>(store_, world_size_);
  }

 private:
  std::string fetch(const std::string& key) {
    std::vector<uint8_t> value;
    guarded("get of key '" + key + "'", [&] { value = store_->get(key); });
    return std::string(value.begin(), value.end());
  }

  template <class F>
  static void guarded(const std::string& what, F&& call) {
    try {
      call();
    } catch (const std::exception& e) {
      const std::string text = e.what();
      if (text.find("imeout") != std::string::npos || text.find("timed out") != std::string::npos) {
        throw tandem::Timeout("c10d store: " + what + " timed out: " + text);
      }
      throw tandem::PeerFailure(-1, "c10d store: " + what + " failed (the store is gone or refused it): " + text);
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int world_size_;
  std::chrono::milliseconds poll_max_;  // the longest pause between two checks
};

}  // namespace tandem::c10d_backend
