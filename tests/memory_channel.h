// An in-memory Channel for testing algorithms without a transport: one
// Mailbox shared by all ranks (one thread each), one MemoryChannel per rank.
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "tandem/errors.h"
#include "tandem/transport.h"
#include "tandem/types.h"

namespace tandem::testing {

// Eager in-memory messages: a send completes at once; a receive completes
// when a message with its (source, destination, tag) is there.
class Mailbox {
 public:
  void put(int src, int dst, Tag tag, const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = messages_[{src, dst, tag}];
    if (!slot.empty()) throw std::logic_error("duplicate tag in flight");
    slot.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    slot.push_back(1);  // marks a message even when it has no bytes
  }
  bool take(int src, int dst, Tag tag, void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = messages_.find({src, dst, tag});
    if (it == messages_.end()) return false;
    if (it->second.size() != bytes + 1) throw InvalidArgument("message size mismatch");
    std::copy(it->second.begin(), it->second.end() - 1, static_cast<char*>(data));
    messages_.erase(it);
    return true;
  }

 private:
  std::mutex mu_;
  std::map<std::tuple<int, int, Tag>, std::vector<char>> messages_;
};

// With segments, also their SharedMemory: threads reach each other's memory directly.
class MemoryChannel final : public Channel, public SharedMemory {
 public:
  // `registered`: buffers that count as Communicator::allocate_shared memory
  // (start, bytes), for the algorithms that read peers' buffers directly.
  MemoryChannel(Mailbox& box, int rank, int size, const SharedSegments* shared = nullptr,
                std::vector<std::pair<const void*, size_t>> registered = {})
      : box_(box), rank_(rank), size_(size), shared_(shared), registered_(std::move(registered)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Pending send(int peer, Tag tag, const void* data, size_t bytes) override {
    check_tag(tag);
    box_.put(rank_, peer, tag, data, bytes);
    return Pending();  // done
  }
  Pending recv(int peer, Tag tag, void* data, size_t bytes) override {
    check_tag(tag);
    recvs_.push_back({peer, tag, data, bytes});
    return Pending(reinterpret_cast<void*>(recvs_.size()), peer, bytes, true);
  }
  bool test(Pending& p) override {
    if (p.done()) return true;
    auto& r = recvs_[reinterpret_cast<size_t>(p.handle()) - 1];
    if (!box_.take(r.peer, rank_, r.tag, r.data, r.bytes)) return false;
    p.mark_done();
    return true;
  }
  void wait(Pending& p) override {
    auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!test(p)) {
      if (Clock::now() > deadline) throw Timeout("in-memory ring hung");
      std::this_thread::yield();
    }
  }
  SharedMemory* shared_memory() override { return shared_ ? this : nullptr; }
  const SharedSegments* segments() const override { return shared_; }
  void idle(int peer, unsigned spins) override {
    if (spins == 1) idle_since_ = Clock::now();
    if (spins % 1024 == 0 && Clock::now() - idle_since_ > std::chrono::seconds(20)) {
      throw Timeout("in-memory shared segments hung waiting for rank " + std::to_string(peer));
    }
    std::this_thread::yield();
  }
  // One address space: a reference is the address itself.
  // Every buffer counts as allocate_shared memory.
  void register_everything() { everything_ = true; }
  bool find_shared(const void* p, size_t bytes, SharedRef& out) const override {
    if (everything_ && shared_) {
      out = SharedRef{1, 1, 0, bytes, reinterpret_cast<uint64_t>(p)};
      return true;
    }
    for (auto [start, size] : registered_) {
      auto* b = static_cast<const char*>(start);
      auto* q = static_cast<const char*>(p);
      if (shared_ && q >= b && q + bytes <= b + size) {
        out = SharedRef{1, 1, 0, size, reinterpret_cast<uint64_t>(p)};
        return true;
      }
    }
    return false;
  }
  std::byte* map_shared(int, const SharedRef& ref) override { return reinterpret_cast<std::byte*>(ref.offset); }
  // Cross-memory attach within one address space is a memcpy.
  void allow_copy_peer() { copy_peer_ = true; }
  bool can_copy_peer() const override { return copy_peer_ && shared_; }
  void read_peer(int, const void* remote, void* local, size_t bytes) override { std::memcpy(local, remote, bytes); }
  void write_peer(int, void* remote, const void* local, size_t bytes) override { std::memcpy(remote, local, bytes); }
  void count_traffic(uint64_t bytes) override { traffic_ += bytes; }
  // What the shared-memory algorithms counted on this channel so far.
  uint64_t shared_memory_traffic() const { return traffic_; }
  void* scratch(size_t bytes, int slot) override {
    if (scratch_.size() <= size_t(slot)) scratch_.resize(slot + 1);
    if (scratch_[slot].size() < bytes) scratch_[slot].resize(bytes);
    return scratch_[slot].data();
  }

 private:
  // The real channel leaves the upper 32 bits to the collective sequence number.
  static void check_tag(Tag tag) {
    if (tag >> 32) throw InvalidArgument("algorithm tag exceeds 32 bits");
  }
  struct Recv {
    int peer;
    Tag tag;
    void* data;
    size_t bytes;
  };
  Mailbox& box_;
  int rank_, size_;
  const SharedSegments* shared_;
  std::vector<std::pair<const void*, size_t>> registered_;
  bool copy_peer_ = false;
  bool everything_ = false;
  Clock::time_point idle_since_{};
  uint64_t traffic_ = 0;
  std::vector<Recv> recvs_;
  std::vector<std::vector<char>> scratch_;
};

// Zeroed, 64-byte aligned heap memory standing in for the ranks' shared
// segments: the threads of one process share it as processes share memfds.
class HeapSegments {
 public:
  HeapSegments(int ranks, size_t bytes) {
    view_.bytes = bytes;
    for (int r = 0; r < ranks; ++r) {
      auto* p = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
      std::memset(p, 0, bytes);
      view_.segment.push_back(p);
    }
  }
  ~HeapSegments() {
    for (auto* p : view_.segment) std::free(p);
  }
  const SharedSegments* view() const { return &view_; }

 private:
  SharedSegments view_;
};

}  // namespace tandem::testing
