// EngineChannel: the Channel a running collective sees. Tags scoped to the
// collective, waits bounded by its deadline, fingerprints compared with the
// messages (through the mailbox when every rank shares the host, else UCX).
#pragma once

#include <boost/container/small_vector.hpp>
#include <chrono>

#include "engine/engine.h"

namespace tandem {

// The Channel a running collective sees: tags scoped to the collective,
// waits bounded by its deadline and aware of abort and dead peers. Its
// SharedMemory is the communicator's segments, allocations and traffic count.
class EngineChannel final : public Channel, public SharedMemory {
 public:
  EngineChannel(Engine& engine, const Task& task);
  ~EngineChannel() override;

  int rank() const override { return ctx_.opts.rank; }
  int size() const override { return ctx_.opts.size; }

  Pending send(int peer, Tag tag, const void* data, size_t bytes) override;
  Pending recv(int peer, Tag tag, void* data, size_t bytes) override;

  bool test(Pending& p) override;
  void wait(Pending& p) override;

  SharedMemory* shared_memory() override { return ep_.shm || ep_.host_shm ? this : nullptr; }
  const SharedSegments* segments() const override { return ep_.shm ? &ep_.shm->view() : nullptr; }
  const Topology* topology() const override { return &ep_.topology; }
  const SharedSegments* host_segments() const override { return ep_.host_shm ? &ep_.host_view : nullptr; }
  bool find_shared(const void* p, size_t bytes, SharedRef& out) const override {
    return ep_.shm && ep_.allocations->find(p, bytes, out);
  }
  std::byte* map_shared(int /*peer*/, const SharedRef& ref) override { return ep_.allocations->map(ref); }
  bool can_copy_peer() const override { return ep_.cma; }
  void read_peer(int peer, const void* remote, void* local, size_t bytes) override;
  void write_peer(int peer, void* remote, const void* local, size_t bytes) override;
  // Summed here and added to the communicator's count once per call: a
  // locked add after each staging copy would wait for the copy's stores to
  // reach the peer before the stamp behind them could start.
  void count_traffic(uint64_t bytes) override { traffic_ += bytes; }

  void idle(int peer, unsigned spins) override;

  void* scratch(size_t bytes, int slot) override { return engine_.scratch_buffer(bytes, slot, MemoryType::host); }
  void* device_scratch(size_t bytes, int slot) override {
    return engine_.scratch_buffer(bytes, slot, MemoryType::cuda);
  }

  // After the algorithm: the call succeeds only once the predecessor's
  // fingerprint matched and this rank's has left.
  void finish();

 private:
  // Runs f; a PeerFailure it throws names the rank the store saw die first.
  template <class F>
  auto blaming_first_failure(F f) -> decltype(f());

  // Runs a cross-memory copy from or to `peer`. One that fails for another
  // reason than a vanished process (EFAULT: the peer's memory went away
  // mid-call, as when it is killed) waits for the liveness checks to name
  // the peer, within their bound; if none does, the copy's error stands.
  template <class F>
  void copying_peer(int peer, F copy);

  // Busy-poll like MPI; yield when ranks outnumber cores, or now and then anyway.
  void back_off(int peer, unsigned spins);

  // Messages go through the mailbox when it is open (every rank on one host),
  // else UCX: every message of a call takes the same one, as Endpoints' do.
  Pending post_send(int peer, Tag tag, const void* data, size_t bytes);
  Pending post_recv(int peer, Tag tag, void* data, size_t bytes);
  bool poll(Pending& p);  // progresses the transport; throws as test() documents

  Tag full_tag(int sender, Tag local, uint32_t signature) const;
  Tag full_tag(int sender, Tag local) const { return full_tag(sender, local, signature_); }

  // Fingerprints (collective calls over messages). Each rank sends its call's
  // fingerprint to its ring successor with its first message and compares the
  // predecessor's when a wait stalls, and in any case before the call may
  // succeed (finish()): in a matching call it has long arrived by then, so
  // the check costs no round trip. Ranks in a mismatched call fail inside it:
  // those that see the mismatch at once, the others when the store tells them
  // (check_health). The fingerprint signature matches whatever the
  // predecessor called, unlike the data tags.
  void post_fingerprint();
  void poll_fingerprint();
  void compare_fingerprint();
  // On the shared-segment path, now and then during a long wait: a peer that
  // sent a fingerprint for this call runs it over messages, so it called something else.
  void watch_for_fingerprints();
  // Whether a fingerprint from `sender` (under `mask`: from any) has arrived.
  bool fingerprint_arrived(int sender, Tag mask);
  void compare(int peer, const Fingerprint& theirs);
  Pending track(Pending p);
  void untrack(void* handle);

  Engine& engine_;
  CommContext& ctx_;
  Endpoints& ep_;
  const Task& task_;
  uint32_t signature_;
  bool point_to_point_;
  std::chrono::steady_clock::time_point yielding_since_;  // when the current shared-memory wait stopped pausing
  // What it posted and has not seen finish: held inline, so that a call posting
  // a fingerprint, a barrier's rounds or a small ring's messages allocates nothing.
  boost::container::small_vector<Pending, 16> live_;
  bool fingerprint_posted_ = false, fingerprint_compared_ = false;
  int prev_ = 0;
  uint64_t traffic_ = 0;  // shared-memory bytes this call read and wrote
  Pending fp_in_, fp_out_;
  Fingerprint mine_, theirs_;  // sent and received in place: they outlive the messages
};

}  // namespace tandem
