// Node-local shared memory for collectives: each rank creates one segment
// (an anonymous memfd) and maps every peer's. A peer maps it through
// /proc/<pid>/fd/<fd>, so nothing is ever named in /dev/shm and nothing
// outlives the processes, even after a crash.
//
// All ranks on this host: the segments serve every collective. Ranks on
// several hosts: each host's ranks map each other's, for the hierarchical
// all-reduce. Ranks in different network namespaces count as different hosts
// (that is how tests model hosts).
#pragma once

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/transport.h"

namespace tandem {

// Where a rank's segment is, as its locator() says: "pid:fd:address".
struct SegmentLocator {
  long pid = 0;
  int fd = -1;
  uint64_t address = 0;
};
// Strict: three decimal fields, pid and fd positive; nullopt otherwise.
std::optional<SegmentLocator> parse_locator(std::string_view text);

// What makes two ranks "the same host" for shared memory: boot, hostname,
// and the network, PID and IPC namespaces.
std::string host_identity();

class SharedSegmentSet {
 public:
  // This rank's zero-filled segment of `bytes`; throws Error if the kernel refuses.
  SharedSegmentSet(int rank, int size, size_t bytes);
  ~SharedSegmentSet();
  SharedSegmentSet(const SharedSegmentSet&) = delete;
  SharedSegmentSet& operator=(const SharedSegmentSet&) = delete;

  // How a peer on this host finds the segment ("pid:fd:address").
  std::string locator() const;
  // Maps rank's segment; returns an empty string on success, else why not.
  std::string map_peer(int rank, const std::string& locator);

  const SharedSegments& view() const { return view_; }

  // Cross-memory attach (process_vm_readv/writev) to a mapped peer: whether
  // the kernel allows it (ptrace rules), and copies by the peer's addresses.
  // A copy throws PeerFailure when the peer is gone, Error otherwise.
  bool cma_works(int rank) const;
  void read_peer(int rank, const void* remote, void* local, size_t bytes) const;
  void write_peer(int rank, void* remote, const void* local, size_t bytes) const;

 private:
  int rank_;
  int fd_ = -1;
  SharedSegments view_;
  std::vector<long> pids_;                // by rank
  std::vector<uint64_t> remote_address_;  // each peer's segment in its own process
};

// Communicator::allocate_shared memory: one memfd per allocation, which peers
// map on first use and keep mapped (least recently used first out).
class SharedAllocations {
 public:
  explicit SharedAllocations(bool shareable) : shareable_(shareable) {}
  ~SharedAllocations();
  SharedAllocations(const SharedAllocations&) = delete;
  SharedAllocations& operator=(const SharedAllocations&) = delete;

  // Page-aligned, zero-filled; shareable only when the ranks share memory
  // (otherwise ordinary anonymous memory). Throws Error if the kernel refuses.
  void* allocate(size_t bytes);
  // Throws InvalidArgument for a pointer allocate() did not return.
  void deallocate(void* p);
  bool find(const void* p, size_t bytes, SharedRef& out) const;
  // Maps (or finds mapped) a peer's allocation; returns where ref's buffer starts.
  std::byte* map(const SharedRef& ref);

 private:
  struct Allocation {
    size_t bytes;
    int fd;  // -1 when not shareable
    uint64_t serial;
  };
  struct Mapping {
    uint64_t owner, serial;
    std::byte* base;
    size_t bytes;
  };
  bool shareable_;
  mutable std::mutex mu_;
  std::map<const std::byte*, Allocation> mine_;  // by start address
  uint64_t next_serial_ = 1;
  std::list<Mapping> peers_;  // most recently used first
};

}  // namespace tandem
