// The small point-to-point interface collective algorithms are written
// against. No UCX type appears here: ring/ and paramserver/ see only this.
//
// A Channel belongs to one running collective. send/recv post and never block;
// the tag must match exactly between one sender and one receiver. wait*/test
// drive progress and throw the communicator's typed errors: PeerFailure naming
// the rank, Timeout at the collective's deadline, Aborted after abort().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/errors.h"
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

// Memory every rank of a communicator maps: present only when all ranks run on
// one host and the algorithms ask for it (Algorithms::shared_bytes(); the ring
// asks unless TANDEM_SHM=0). The communicator creates, maps and
// zero-fills it; the algorithms that use it define its layout.
struct SharedSegments {
  std::vector<std::byte*> segment;  // rank r's segment, as mapped in this process
  size_t bytes = 0;                 // the size of each
};

// Where a buffer lies inside memory from Communicator::allocate_shared, in
// terms a peer on the same host can map. Plain data: algorithms pass it to
// peers through their shared segments.
struct SharedRef {
  uint64_t owner = 0;   // process id of the allocating rank
  uint64_t serial = 0;  // allocation number within that process
  int64_t fd = -1;      // the allocation's memfd in the owner
  uint64_t size = 0;    // bytes of the whole allocation
  uint64_t offset = 0;  // where the buffer starts inside it
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

  // The ranks' shared segments, or nullptr when they cannot share memory.
  virtual const SharedSegments* shared_segments() const { return nullptr; }
  // Which ranks share a host; nullptr when unknown (a single rank, a test channel).
  virtual const Topology* topology() const { return nullptr; }
  // When ranks span hosts: the segments of this host's ranks, indexed by local
  // rank (Topology::local_rank), or nullptr when they cannot share memory.
  virtual const SharedSegments* host_segments() const { return nullptr; }
  // Call on every turn of a loop that spins on shared memory: backs off (and
  // yields when ranks outnumber cores), and every so often checks the deadline,
  // abort and dead ranks, throwing as wait() does. `peer` is whom we wait for.
  virtual void idle(int peer, unsigned spins) = 0;
  // If [p, p + bytes) lies in this rank's Communicator::allocate_shared
  // memory (and shared segments exist), where peers can find it.
  virtual bool find_shared(const void* /*p*/, size_t /*bytes*/, SharedRef& /*out*/) const { return false; }
  // A peer's buffer, mapped into this process (cached across calls).
  virtual std::byte* map_shared(int /*peer*/, const SharedRef& /*ref*/) {
    throw InvalidArgument("this channel cannot map peers' memory");
  }

  // Copies between this rank's memory and a peer's by the peer's own
  // addresses (Linux cross-memory attach), for ranks that share segments and
  // whose kernel allows it; a PeerFailure if the peer is gone.
  virtual bool can_copy_peer() const { return false; }
  virtual void read_peer(int /*peer*/, const void* /*remote*/, void* /*local*/, size_t /*bytes*/) {
    throw InvalidArgument("this channel cannot copy from peers' memory");
  }
  virtual void write_peer(int /*peer*/, void* /*remote*/, const void* /*local*/, size_t /*bytes*/) {
    throw InvalidArgument("this channel cannot copy to peers' memory");
  }

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
