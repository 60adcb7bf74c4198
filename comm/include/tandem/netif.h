// Network interface discovery and selection (docs/design.md, "Interface selection"; docs/network-interfaces.md).
//
// Terms:
// - host: one network stack. Two ranks are on the same host when their boot
//   id, hostname and network-namespace inode all agree, so ranks in different
//   network namespaces of one machine count as different hosts.
// - subnet: an address with its prefix reduced to the network ("10.1.0.0/24").
// - candidate: a subnet in which every rank has an address on some interface.
//   Interfaces are matched by subnet, never by name: hosts may name the same
//   network eth0, ens5 or enp3s0.
// - probe: a short TCP exchange between ranks over a candidate (RTT by
//   ping-pong, bandwidth by a time-bounded stream) that proves it works and
//   measures it. A candidate is common when every probe on it succeeds.
//
// The override (`dtrain_network_interface`, env TANDEM_NETWORK_INTERFACE or
// DTRAIN_NETWORK_INTERFACE) restricts which interfaces a host may use:
//   eth0            exact name if the host has it, else a prefix (NCCL style)
//   eth,ib          any interface starting with eth or ib
//   =eth0           exactly eth0 (never a prefix)
//   ^docker,lo      anything except docker* and lo (^= for exact exclusion)
//   host1:eth0;host2:ens5;*:eth
//                   per host, keyed by hostname; `*` is the default for hosts
//                   not listed; hosts with no entry and no `*` are automatic.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/communicator.h"
#include "tandem/types.h"

namespace tandem {

class KeyValueStore;

struct InterfaceAddress {
  std::string address;  // "10.1.0.2", "fd00::2"
  int prefix = 0;       // prefix length
  int family = 4;       // 4 or 6
};

struct NetInterface {
  std::string name;
  std::vector<InterfaceAddress> addresses;
  bool up = false;         // IFF_UP and not operstate "down"
  bool loopback = false;   // IFF_LOOPBACK
  std::string operstate;   // /sys/class/net/<if>/operstate: up, down, unknown, ...
  int speed_mbps = -1;     // /sys/class/net/<if>/speed; -1 when the driver does not say
  int numa_node = -1;      // hwloc (or sysfs) locality; -1 when unknown (virtual devices)
  std::string pci_bus_id;  // "0000:3b:00.0" when the NIC is a PCI device
};

// Which network stack this process runs in (see "host" above).
struct HostIdentity {
  std::string hostname;
  std::string boot_id;  // /proc/sys/kernel/random/boot_id
  std::string netns;    // inode of /proc/self/ns/net
  bool same_host(const HostIdentity& o) const {
    return hostname == o.hostname && boot_id == o.boot_id && netns == o.netns;
  }
};

// Every interface of this host, in getifaddrs order. with_hwloc adds NUMA/PCI
// locality through hwloc (slower: it loads the I/O topology); otherwise sysfs only.
std::vector<NetInterface> discover_interfaces(bool with_hwloc = true);
HostIdentity local_host_identity();

// "10.1.0.7"/24 -> "10.1.0.0/24"; nullopt for text that is not an address or a bad prefix.
std::optional<std::string> subnet_of(const std::string& address, int prefix);
// True when both addresses lie in the subnet address/prefix (same family).
bool in_subnet(const std::string& address, const std::string& network_address, int prefix);

// ---- override ---------------------------------------------------------------

// One list of NCCL-style patterns.
struct InterfaceFilter {
  struct Pattern {
    std::string text;
    bool exact = false;  // "=eth0": never a prefix
  };
  bool exclude = false;  // "^...": the patterns name what to avoid
  std::vector<Pattern> patterns;

  // Whether `name` passes, given every interface name of its host (an exact
  // name wins over prefix matching: "eth1" does not pick eth10 when eth1 exists).
  bool allows(const std::string& name, const std::vector<std::string>& host_names) const;
  std::string to_string() const;
};

struct InterfaceOverride {
  std::string text;                                               // as the user wrote it; empty = automatic everywhere
  std::optional<InterfaceFilter> all_hosts;                       // plain form, or `*:` of the per-host form
  std::vector<std::pair<std::string, InterfaceFilter>> per_host;  // hostname -> filter

  bool empty() const { return !all_hosts && per_host.empty(); }
  // The filter that applies to `hostname`; nullopt = automatic there.
  std::optional<InterfaceFilter> for_host(const std::string& hostname) const;
};

// Throws InvalidArgument quoting the text and the rule it breaks.
InterfaceOverride parse_interface_override(const std::string& text);

// ---- selection --------------------------------------------------------------

// One probe from rank `from` to rank `to` over a candidate.
struct PairProbe {
  int from = -1, to = -1;
  bool ok = false;
  double rtt_us = -1;          // median round trip of small messages
  double bandwidth_gbps = -1;  // GB/s (1e9 bytes/s) of a time-bounded stream; -1 if not measured
  std::string error;
};

struct NetifCandidate {
  std::string subnet;  // "10.1.0.0/24" (aliases: the same links' other subnets)
  std::vector<std::string> aliases;
  std::vector<std::string> names;      // per rank: its own interface in this subnet
  std::vector<std::string> addresses;  // per rank
  int min_speed_mbps = -1;             // slowest link speed reported by any rank
  std::vector<PairProbe> probes;
  bool common = false;
  std::string excluded_reason;  // why it is not common / not chosen
  double bandwidth_gbps = -1;   // min over bandwidth probes
  double rtt_us = -1;           // max over probes
};

// An interface of some rank that never became a candidate, and why.
struct ExcludedInterface {
  int rank = -1;
  std::string host;
  std::string name;
  std::string reason;
};

struct NetifDecision {
  int rank = -1;
  int size = 0;
  std::vector<std::string> hosts;  // hostname per rank
  int distinct_hosts = 0;
  bool single_host = false;
  std::string override_text;  // empty = automatic
  std::string chosen;         // this rank's interface; empty = leave the choice to UCX
  std::string chosen_subnet;
  std::vector<std::string> chosen_per_rank;
  std::string reason;  // why `chosen`, in one sentence
  std::vector<NetifCandidate> candidates;
  std::vector<ExcludedInterface> excluded;
  double probe_ms = 0;  // time spent probing

  std::string to_json() const;  // one line
  std::string to_text() const;  // the readable block logged at start-up (no braces)
};

// Collective over the store: every rank calls it during connect, after
// hello(). Publishes this rank's interfaces, probes the candidates, decides
// (the same way on every rank) and logs the decision (rank 0: the whole block).
// Throws InvalidArgument for an override that matches nothing on some host
// (naming the host and rank and listing its interfaces) or leaves no interface
// shared by all ranks; Timeout past the deadline.
NetifDecision select_interface(KeyValueStore& store, const CommOptions& options, Deadline deadline);

// Local view for `tandem netif`: one row per interface.
std::string interfaces_to_text(const std::vector<NetInterface>& interfaces);
std::string interfaces_to_json(const std::vector<NetInterface>& interfaces, const HostIdentity& host);

}  // namespace tandem
