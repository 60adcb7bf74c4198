// The small point-to-point interface collective algorithms are written
// against. No UCX type appears here: ring/ and paramserver/ see only this.
//
// A Channel belongs to one running collective. send/recv post and never block;
// the tag must match exactly between one sender and one receiver. wait*/test
// drive progress and throw the communicator's typed errors: PeerFailure naming
// the rank, Timeout at the collective's deadline, Aborted after abort().
// Ranks on one host may also reach each other's memory: shared_memory().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/errors.h"
#include "tandem/shared_memory.h"
#include "tandem/types.h"

namespace tandem {

using Tag = uint64_t;

// One posted send or receive. Move-only; an unfinished Pending is cancelled by
// the Channel when the collective ends, never leaked.
class Pending {
 public:
  Pending() = default;
  Pending(void* handle, int peer, size_t bytes, bool is_recv)
      : handle_(handle), peer_(peer), bytes_(bytes), is_recv_(is_recv), done_(false) {}
  Pending(Pending&& o) noexcept { *this = std::move(o); }
  Pending& operator=(Pending&& o) noexcept {
    handle_ = o.handle_;
    peer_ = o.peer_;
    bytes_ = o.bytes_;
    is_recv_ = o.is_recv_;
    done_ = o.done_;
    o.handle_ = nullptr;
    o.done_ = true;
    return *this;
  }
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;

  bool done() const { return done_; }
  int peer() const { return peer_; }
  size_t bytes() const { return bytes_; }
  bool is_recv() const { return is_recv_; }
  void* handle() const { return handle_; }
  void mark_done() {
    done_ = true;
    handle_ = nullptr;
  }

 private:
  void* handle_ = nullptr;
  int peer_ = -1;
  size_t bytes_ = 0;
  bool is_recv_ = false;
  bool done_ = true;
};

// Which ranks share a host. Host identity comes from every rank through the
// store (boot id, hostname and the network, PID and IPC namespaces, or
// CommOptions::host_id); hosts are numbered in the order of their lowest rank,
// and the ranks of a host in rank order, whatever order a launcher gave them.
struct Topology {
  std::vector<int> host_of;             // by rank: its host's number
  std::vector<int> local_rank_of;       // by rank: its place among its host's ranks
  std::vector<std::vector<int>> ranks;  // by host: its ranks, ascending
  int rank = 0;

  int hosts() const { return int(ranks.size()); }
  int host() const { return host_of[size_t(rank)]; }
  int local_rank() const { return local_rank_of[size_t(rank)]; }
  int local_size() const { return int(ranks[size_t(host())].size()); }
  // Every host runs the same number of ranks.
  bool uniform() const;
  // The ranks of host h that hold local rank `local`, one per host, by host
  // number (for uniform topologies).
  std::vector<int> peers_with_local_rank(int local) const;
  // "2 hosts x 2 ranks", or "3 hosts (2, 1, 1 ranks)".
  std::string str() const;
};

// The topology of `host_ids` (one string per rank) as seen by `rank`.
Topology make_topology(const std::vector<std::string>& host_ids, int rank);

class Channel {
 public:
  virtual ~Channel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual Pending send(int peer, Tag tag, const void* data, size_t bytes) = 0;
  virtual Pending recv(int peer, Tag tag, void* data, size_t bytes) = 0;

  // True once p has completed; drives progress once. Throws on failure.
  virtual bool test(Pending& p) = 0;
  // Blocks until p completes (bounded by the collective's deadline).
  virtual void wait(Pending& p) = 0;
  void wait_all(std::vector<Pending>& ps) {
    for (auto& p : ps) wait(p);
  }

  // Call on every turn of a loop that spins on shared memory or polls test():
  // backs off (and yields when ranks outnumber cores), and every so often
  // checks the deadline, abort and dead ranks, throwing as wait() does. `peer`
  // is whom we wait for. Not on SharedMemory: the parameter server polls with it.
  virtual void idle(int peer, unsigned spins) = 0;

  // Which ranks share a host; nullptr when unknown (a single rank, a test channel).
  // Here, not on SharedMemory: the hierarchical all-reduce groups ranks by host
  // even when they map no memory (its host phases then run over send/recv).
  virtual const Topology* topology() const { return nullptr; }

  // What this rank can do with the memory of ranks on its host; nullptr when
  // it shares memory with none. Only the shared-memory algorithms ask.
  virtual SharedMemory* shared_memory() { return nullptr; }

  // Scratch memory owned by the communicator, reused across collectives; valid
  // until the collective returns. slot separates independent buffers.
  virtual void* scratch(size_t bytes, int slot = 0) = 0;
  // The same in GPU memory, for collectives on MemoryType::cuda buffers.
  virtual void* device_scratch(size_t /*bytes*/, int /*slot*/ = 0) {
    throw InvalidArgument("this channel has no device memory");
  }
  void* scratch_in(MemoryType memory, size_t bytes, int slot) {
    return memory == MemoryType::host ? scratch(bytes, slot) : device_scratch(bytes, slot);
  }
};

}  // namespace tandem
