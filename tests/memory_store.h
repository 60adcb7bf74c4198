// A KeyValueStore in this process's memory, shared by every handle made from
// it (connect_again), thread-safe: a foreign store for tests, which, like
// c10d's, does not track liveness.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem::testing {

class MemoryStore final : public KeyValueStore {
 public:
  MemoryStore() : state_(std::make_shared<State>()) {}

  void set(const std::string& key, const std::string& value, Deadline) override {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->kv[key] = value;
    }
    state_->cv.notify_all();
  }
  std::string get(const std::string& key, Deadline deadline) override {
    wait({key}, deadline);
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->kv.at(key);
  }
  std::optional<std::string> try_get(const std::string& key, Deadline) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->kv.find(key);
    if (it == state_->kv.end()) return std::nullopt;
    return it->second;
  }
  int64_t add(const std::string& key, int64_t delta, Deadline) override {
    int64_t total = 0;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      std::string& v = state_->kv[key];
      total = (v.empty() ? 0 : std::stoll(v)) + delta;
      v = std::to_string(total);
    }
    state_->cv.notify_all();
    return total;
  }
  void wait(const std::vector<std::string>& keys, Deadline deadline) override {
    std::unique_lock<std::mutex> lock(state_->mu);
    if (!state_->cv.wait_until(lock, deadline, [&] { return all_present(keys); })) {
      throw Timeout("memory store: wait for '" + keys.front() + "' timed out");
    }
  }
  bool check(const std::vector<std::string>& keys, Deadline) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return all_present(keys);
  }
  void erase(const std::string& key, Deadline) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->kv.erase(key);
  }
  std::unique_ptr<KeyValueStore> connect_again(Deadline) override {
    return std::unique_ptr<KeyValueStore>(new MemoryStore(state_));
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::string, std::string> kv;
  };
  explicit MemoryStore(std::shared_ptr<State> s) : state_(std::move(s)) {}
  bool all_present(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!state_->kv.count(k)) return false;
    return true;
  }
  std::shared_ptr<State> state_;
};

}  // namespace tandem::testing
