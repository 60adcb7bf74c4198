// The store ports tandem derives where a launcher gives no address: from a
// job id (one node) and from Slurm's job and step (any nodes).
#include "store_ports.h"

#include <algorithm>
#include <fstream>

#include "tandem/bootstrap.h"

namespace tandem {
namespace {

// FNV-1a: stable across platforms and releases, unlike std::hash.
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The first port of this host's ephemeral range, where outgoing connections
// take theirs (Linux's default: 32768); 60000 if unknown.
uint32_t ephemeral_port_low() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  uint32_t low = 0;
  return range >> low ? low : 60000;
}

}  // namespace

// From 20000 up to this host's ephemeral range (every rank of a one-node job
// reads the same host's): a port in that range can be held by an outgoing
// connection, and 20000-59999 put 68 % of jobs there (a job under mpirun
// found its port taken). A range starting below 21000 leaves 20000-59999.
uint16_t port_from_job_id(std::string_view job_id) {
  const uint32_t low = std::min<uint32_t>(ephemeral_port_low(), 60000);
  const uint32_t span = low > 21000 ? low - 20000 : 40000;
  return static_cast<uint16_t>(20000 + fnv1a(job_id) % span);
}

uint16_t slurm_store_port(uint64_t job_id, uint64_t step_id) {
  return static_cast<uint16_t>(20000 + 4 * (job_id % 10000) + step_id % 4);
}

}  // namespace tandem
