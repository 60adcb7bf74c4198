// Node-local shared memory for collectives: each rank creates one segment
// (an anonymous memfd) and maps every peer's. A peer maps it through
// /proc/<pid>/fd/<fd>, so nothing is ever named in /dev/shm and nothing
// outlives the processes, even after a crash.
//
// Used only when every rank runs on this host; ranks in different network
// namespaces count as different hosts (that is how tests model hosts).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "tandem/transport.h"

namespace tandem {

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

  // How a peer on this host finds the segment ("pid:fd").
  std::string locator() const;
  // Maps rank's segment; returns an empty string on success, else why not.
  std::string map_peer(int rank, const std::string& locator);

  const SharedSegments& view() const { return view_; }

 private:
  int fd_ = -1;
  SharedSegments view_;
};

}  // namespace tandem
