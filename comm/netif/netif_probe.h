// The interface probe: plain TCP between two ranks over one candidate.
//
// Wire: the client sends one op byte on a fresh connection.
//   'P' ping:      then repeatedly 8 bytes out, the same 8 bytes echoed back, until the client closes.
//   'B' bandwidth: the client streams bytes for a fixed duration and half-closes; the server
//                  answers u64 bytes received and u64 nanoseconds from first byte to EOF
//                  (so bytes still queued in the link when the client stopped are counted).
// Every socket call is bounded by the caller's deadline; the server bounds each
// connection by its own receive timeout so a vanished client cannot pin a thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "tandem/netif.h"
#include "tandem/types.h"

namespace tandem::netif {

class ProbeServer {
 public:
  // Listens on each address (port chosen by the kernel). An address that
  // cannot be bound gets port 0; clients then report the probe as failed.
  explicit ProbeServer(const std::vector<std::string>& addresses);
  ~ProbeServer();
  ProbeServer(const ProbeServer&) = delete;
  ProbeServer& operator=(const ProbeServer&) = delete;

  uint16_t port(size_t i) const { return ports_[i]; }

 private:
  void serve();
  std::vector<int> listeners_;
  std::vector<uint16_t> ports_;
  int wake_[2] = {-1, -1};
  std::vector<std::thread> workers_;  // serve() thread only
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// RTT by `rounds` ping-pongs (median) from local_address (bound, and tied to
// local_interface when the kernel allows) to peer. Fills ok/rtt_us/error.
void probe_rtt(PairProbe& out, const std::string& local_interface, const std::string& local_address,
               const std::string& peer_address, uint16_t port, int rounds, Deadline deadline);

// Streams for `duration` and fills bandwidth_gbps (GB/s) or error.
void probe_bandwidth(PairProbe& out, const std::string& local_interface, const std::string& local_address,
                     const std::string& peer_address, uint16_t port, std::chrono::milliseconds duration,
                     Deadline deadline);

// The route check: the source address the kernel picks to reach `peer`
// (UDP connect, no packet sent); empty on failure.
std::string route_source(const std::string& peer_address);

}  // namespace tandem::netif
