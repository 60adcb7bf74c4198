// Interface selection: records, plan, probes, decision (terms in netif.h).
//
// The collective, in store rounds under `<prefix>/netif/`:
//   1. record/<r>   each rank's host identity and interfaces (override applied locally)
//   2. ports/<r>    the ports of its probe servers, one per candidate
//   3. per candidate a barrier, then every rank probes: RTT to the ranks on
//      other hosts, and a short stream to its probe target
//   4. probes/<r>   its results; every rank then decides from the same data,
//      so all ranks agree on the subnet, each using its own interface name.
#include "netif_select.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "netif_probe.h"
#include "netif_report.h"
#include "src/subsystem_log.h"
#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem {
namespace netif {
namespace {

using nlohmann::json;

// Probing budget: streams share ~600 ms across candidates; RTT is a few ping-pongs.
constexpr int kStreamBudgetMs = 600;
constexpr int kMinStreamMs = 40, kMaxStreamMs = 200;
constexpr int kRttRounds = 8;
constexpr int kMaxAllPairsRanks = 16;  // beyond this, only ring-neighbour pairs are probed
constexpr double kTie = 1.10;          // bandwidths within 10% count as equal

bool link_local(const InterfaceAddress& a) {
  if (a.family == 6) return in_subnet(a.address, "fe80::", 10);
  return in_subnet(a.address, "169.254.0.0", 16);
}

std::string who(const std::vector<std::string>& hosts, int rank) {
  return "rank " + std::to_string(rank) + " (" + hosts[size_t(rank)] + ")";
}

std::string describe_interface(const NetInterface& i) {
  std::string s = i.name + " [";
  for (const auto& a : i.addresses) s += a.address + "/" + std::to_string(a.prefix) + ", ";
  s += i.up ? "up" : "down";
  if (i.speed_mbps > 0) s += ", " + std::to_string(i.speed_mbps) + " Mb/s";
  return s + "]";
}

}  // namespace

RankRecord make_record(int rank, const HostIdentity& host, std::vector<NetInterface> interfaces,
                       const InterfaceOverride& override_spec) {
  RankRecord r;
  r.rank = rank;
  r.host = host;
  r.interfaces = std::move(interfaces);
  std::vector<std::string> names;
  for (const auto& i : r.interfaces) names.push_back(i.name);
  const auto filter = override_spec.for_host(host.hostname);
  bool any_usable = false;
  for (const auto& i : r.interfaces) {
    std::string why;
    bool has_routable = std::any_of(i.addresses.begin(), i.addresses.end(), [](auto& a) { return !link_local(a); });
    if (filter && !filter->allows(i.name, names))
      why = "excluded by the override '" + filter->to_string() + "'";
    else if (!i.up)
      why = "down (operstate " + (i.operstate.empty() ? std::string("?") : i.operstate) + ")";
    else if (i.addresses.empty())
      why = "no IPv4/IPv6 address";
    else if (!has_routable)
      why = "only link-local addresses";
    any_usable = any_usable || why.empty();
    r.unusable.push_back(why);
  }
  if (filter && !any_usable) {
    std::string has;
    for (const auto& i : r.interfaces) has += (has.empty() ? "" : ", ") + describe_interface(i);
    r.error = "matches no usable interface on host " + host.hostname + " (rank " + std::to_string(rank) +
              "; filter there '" + filter->to_string() + "'), which has: " + (has.empty() ? "nothing" : has);
  }
  return r;
}

void check_records(const std::vector<RankRecord>& records, const std::string& override_text) {
  std::string problems;
  for (const auto& r : records)
    if (!r.error.empty()) problems += (problems.empty() ? "" : "; ") + r.error;
  if (problems.empty()) return;
  throw InvalidArgument("tandem: dtrain_network_interface (TANDEM_NETWORK_INTERFACE) '" + override_text + "' " +
                        problems +
                        ". Fix the override (per host: host1:eth0;host2:ens5) or unset it for automatic selection");
}

int probe_target(const std::vector<RankRecord>& records, int rank) {
  const int n = int(records.size());
  for (int k = 1; k < n; ++k) {
    int p = (rank + k) % n;
    if (!records[size_t(p)].host.same_host(records[size_t(rank)].host)) return p;
  }
  return -1;
}

namespace {

// Every interface is reported once per host: by the host's first rank.
bool first_of_host(const std::vector<RankRecord>& records, size_t r) {
  for (size_t q = 0; q < r; ++q)
    if (records[q].host.same_host(records[r].host)) return false;
  return true;
}

void note_unusable(const std::vector<RankRecord>& records, NetifDecision& d) {
  for (size_t r = 0; r < records.size(); ++r) {
    if (!first_of_host(records, r)) continue;
    for (size_t i = 0; i < records[r].interfaces.size(); ++i) {
      const auto& itf = records[r].interfaces[i];
      if (!records[r].unusable[i].empty()) {
        d.excluded.push_back({int(r), d.hosts[r], itf.name, records[r].unusable[i]});
      } else if (itf.loopback && !d.single_host) {
        d.excluded.push_back(
            {int(r), d.hosts[r], itf.name, "loopback: the ranks span " + std::to_string(d.distinct_hosts) + " hosts"});
      }
    }
  }
}

// One network stack: loopback, unless the override rules it out.
void plan_one_host(const std::vector<RankRecord>& records, int rank, NetifDecision& d) {
  const auto& me = records[size_t(rank)];
  std::string pick;
  for (size_t i = 0; i < me.interfaces.size() && pick.empty(); ++i)
    if (me.unusable[i].empty() && me.interfaces[i].loopback) pick = me.interfaces[i].name;
  for (size_t i = 0; i < me.interfaces.size() && pick.empty(); ++i)
    if (me.unusable[i].empty()) pick = me.interfaces[i].name;
  d.chosen = pick;
  d.chosen_per_rank.assign(records.size(), pick);
  d.reason = "all " + std::to_string(d.size) + " ranks are on one host (" + d.hosts[0] + ")" +
             (pick.empty() ? "; no usable interface" : "");
}

// A rank's interface (index) and address in one subnet.
struct Slot {
  int itf = -1;
  std::string address;
};
// Subnet -> per rank. std::map keeps a stable, identical order on every rank;
// IPv4 sorts before IPv6 by the family prefix in the key.
using SubnetSlots = std::map<std::string, std::vector<Slot>>;

std::string subnet_key(const InterfaceAddress& a, const std::string& subnet) {
  return std::to_string(a.family) + " " + subnet;
}

SubnetSlots slots_by_subnet(const std::vector<RankRecord>& records) {
  SubnetSlots by_subnet;
  for (size_t r = 0; r < records.size(); ++r) {
    for (size_t i = 0; i < records[r].interfaces.size(); ++i) {
      const auto& itf = records[r].interfaces[i];
      if (!records[r].unusable[i].empty() || itf.loopback) continue;
      for (const auto& a : itf.addresses) {
        if (link_local(a)) continue;
        auto subnet = subnet_of(a.address, a.prefix);
        if (!subnet) continue;
        auto& slots = by_subnet[subnet_key(a, *subnet)];
        slots.resize(records.size());
        if (slots[r].itf < 0) slots[r] = {int(i), a.address};  // first interface in the subnet wins
      }
    }
  }
  return by_subnet;
}

// A candidate per subnet every rank has an address in; returns the (rank, interface) pairs they use.
std::set<std::pair<int, int>> add_candidates(const std::vector<RankRecord>& records, const SubnetSlots& by_subnet,
                                             NetifDecision& d) {
  std::set<std::pair<int, int>> in_candidate;
  for (const auto& [key, slots] : by_subnet) {
    if (!std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.itf >= 0; })) continue;
    NetifCandidate c;
    c.subnet = key.substr(2);
    for (size_t r = 0; r < slots.size(); ++r) {
      const auto& itf = records[r].interfaces[size_t(slots[r].itf)];
      c.names.push_back(itf.name);
      c.addresses.push_back(slots[r].address);
      if (itf.speed_mbps > 0 && (c.min_speed_mbps < 0 || itf.speed_mbps < c.min_speed_mbps))
        c.min_speed_mbps = itf.speed_mbps;
      in_candidate.insert({int(r), slots[r].itf});
    }
    // The same interfaces through another subnet (e.g. IPv6 next to IPv4) are one candidate.
    auto same = std::find_if(d.candidates.begin(), d.candidates.end(), [&](auto& o) { return o.names == c.names; });
    if (same != d.candidates.end()) {
      same->aliases.push_back(c.subnet);
    } else {
      d.candidates.push_back(std::move(c));
    }
  }
  return in_candidate;
}

// Usable interfaces in no candidate: says which ranks lack their subnets.
void note_unshared(const std::vector<RankRecord>& records, SubnetSlots& by_subnet,
                   const std::set<std::pair<int, int>>& in_candidate, NetifDecision& d) {
  for (size_t r = 0; r < records.size(); ++r) {
    if (!first_of_host(records, r)) continue;
    for (size_t i = 0; i < records[r].interfaces.size(); ++i) {
      const auto& itf = records[r].interfaces[i];
      if (!records[r].unusable[i].empty() || itf.loopback || in_candidate.count({int(r), int(i)})) continue;
      std::string why;
      for (const auto& a : itf.addresses) {
        if (link_local(a)) continue;
        auto subnet = subnet_of(a.address, a.prefix).value_or(a.address);
        const auto& slots = by_subnet[subnet_key(a, subnet)];
        std::string missing;
        for (size_t q = 0; q < slots.size(); ++q)
          if (slots[q].itf < 0) missing += (missing.empty() ? "" : ", ") + who(d.hosts, int(q));
        why += (why.empty() ? "" : "; ") + subnet + " is not shared (no address in it on " + missing + ")";
      }
      d.excluded.push_back({int(r), d.hosts[r], itf.name, why});
    }
  }
}

}  // namespace

NetifDecision plan(const std::vector<RankRecord>& records, int rank, const std::string& override_text) {
  NetifDecision d;
  d.rank = rank;
  d.size = int(records.size());
  d.override_text = override_text;
  std::vector<HostIdentity> distinct;
  for (const auto& r : records) {
    d.hosts.push_back(r.host.hostname);
    if (std::none_of(distinct.begin(), distinct.end(), [&](auto& h) { return h.same_host(r.host); }))
      distinct.push_back(r.host);
  }
  d.distinct_hosts = int(distinct.size());
  d.single_host = d.distinct_hosts <= 1;
  note_unusable(records, d);
  if (d.single_host) {
    plan_one_host(records, rank, d);
    return d;
  }
  SubnetSlots by_subnet = slots_by_subnet(records);
  const std::set<std::pair<int, int>> in_candidate = add_candidates(records, by_subnet, d);
  note_unshared(records, by_subnet, in_candidate, d);
  return d;
}

void decide(NetifDecision& d) {
  if (d.single_host) return;
  NetifCandidate* best = nullptr;
  for (auto& c : d.candidates) {
    c.common = true;
    for (const auto& p : c.probes) {
      if (!p.ok) {
        c.common = false;
        c.excluded_reason = "probe " + who(d.hosts, p.from) + " -> " + who(d.hosts, p.to) + " failed: " + p.error;
        break;
      }
      if (p.rtt_us >= 0) c.rtt_us = std::max(c.rtt_us, p.rtt_us);
      if (p.bandwidth_gbps > 0)
        c.bandwidth_gbps = c.bandwidth_gbps < 0 ? p.bandwidth_gbps : std::min(c.bandwidth_gbps, p.bandwidth_gbps);
    }
    if (!c.common) continue;
    if (!best || c.bandwidth_gbps > best->bandwidth_gbps * kTie) {
      best = &c;
    } else if (c.bandwidth_gbps * kTie >= best->bandwidth_gbps &&
               (c.min_speed_mbps > best->min_speed_mbps ||
                (c.min_speed_mbps == best->min_speed_mbps && c.rtt_us < best->rtt_us))) {
      best = &c;  // a tie on measured bandwidth: faster link, then lower latency
    }
  }
  if (!best) {
    std::string why =
        d.candidates.empty() ? "no subnet has an address on every rank" : "no candidate passed its probes";
    if (!d.override_text.empty()) {
      std::string detail;
      for (const auto& c : d.candidates) detail += "; " + c.subnet + ": " + c.excluded_reason;
      for (const auto& e : d.excluded) detail += "; " + who(d.hosts, e.rank) + " " + e.name + ": " + e.reason;
      throw InvalidArgument("tandem: dtrain_network_interface (TANDEM_NETWORK_INTERFACE) '" + d.override_text +
                            "' leaves no interface shared by all " + std::to_string(d.size) + " ranks: " + why +
                            detail + ". Pick interfaces in one subnet on every host");
    }
    d.reason = why + "; UCX chooses its own devices (set TANDEM_NETWORK_INTERFACE to pin one)";
    return;
  }
  for (auto& c : d.candidates) {
    if (!c.common || &c == best) continue;
    c.excluded_reason = "slower: " + fmt_gbps(c.bandwidth_gbps) + " GB/s vs " + fmt_gbps(best->bandwidth_gbps) +
                        " GB/s on " + best->subnet;
    if (c.bandwidth_gbps * kTie >= best->bandwidth_gbps)
      c.excluded_reason = "tie on bandwidth, lost on link speed/latency to " + best->subnet;
  }
  d.chosen = best->names[size_t(d.rank)];
  d.chosen_subnet = best->subnet;
  d.chosen_per_rank = best->names;
  int common = int(std::count_if(d.candidates.begin(), d.candidates.end(), [](auto& c) { return c.common; }));
  d.reason = std::string(common == 1 ? "the only common interface"
                                     : "the fastest of " + std::to_string(common) + " common interfaces") +
             ": " + fmt_gbps(best->bandwidth_gbps) + " GB/s, " + fmt_us(best->rtt_us) + " us RTT" +
             (d.override_text.empty() ? "" : " (within the override '" + d.override_text + "')");
}

}  // namespace netif

// ---- the collective --------------------------------------------------------

namespace {

void store_barrier(KeyValueStore& store, const std::string& k, int size, Deadline deadline) {
  if (store.add(k, 1, deadline) == size) store.set(k + "/done", "1", deadline);
  store.wait({k + "/done"}, deadline);
}

// Every rank reaches the same verdict from the same records. Before throwing
// it, the rank hosting the store waits (briefly) for the others to reach it
// too, so they report the real error rather than "lost the store".
template <typename F>
void agree_or_throw(KeyValueStore& store, const CommOptions& o, const std::string& key, Deadline deadline, F&& check) {
  try {
    check();
  } catch (const InvalidArgument&) {
    if (o.size > 1) {
      const Deadline until = std::min(deadline, Clock::now() + std::chrono::seconds(5));
      try {
        store.add(key, 1, until);
        while (o.host_store && store.add(key, 0, until) < o.size && Clock::now() < until)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } catch (const Error&) {
        // The verdict matters more than the courtesy.
      }
    }
    throw;
  }
}

// The peers' probe ports (one per candidate), as each published them.
std::vector<uint16_t> peer_ports(KeyValueStore& store, const std::string& base, int peer, size_t candidates,
                                 Deadline deadline) {
  std::vector<uint16_t> v;
  const std::string text = store.get(base + "ports/" + std::to_string(peer), deadline);
  for (size_t pos = 0; pos <= text.size();) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    v.push_back(uint16_t(std::atoi(text.substr(pos, end - pos).c_str())));
    pos = end + 1;
  }
  if (v.size() != candidates) throw InvalidArgument("tandem: malformed probe ports from rank " + std::to_string(peer));
  return v;
}

// Every rank's probes of every candidate, into d.candidates[c].probes on every rank.
void share_probes(KeyValueStore& store, const std::string& base, int n, int me,
                  const std::vector<std::vector<PairProbe>>& results, NetifDecision& d, Deadline deadline) {
  using nlohmann::json;
  json all = json::array();
  for (const auto& per_candidate : results) {
    json a = json::array();
    for (const auto& p : per_candidate) a.push_back(netif::to_j(p));
    all.push_back(a);
  }
  store.set(base + "probes/" + std::to_string(me), all.dump(), deadline);
  for (int r = 0; r < n; ++r) {
    json j = json::parse(store.get(base + "probes/" + std::to_string(r), deadline));
    if (j.size() != d.candidates.size())
      throw InvalidArgument("tandem: malformed probe results from rank " + std::to_string(r));
    for (size_t c = 0; c < d.candidates.size(); ++c)
      for (const auto& p : j[c]) d.candidates[c].probes.push_back(netif::probe_from(p));
  }
}

// Each candidate in turn on every rank: RTT to the peers on other hosts (all
// of them up to kMaxAllPairsRanks ranks, else the next host's), then a stream
// to that one, after every rank has measured RTT (not under load).
void probe_candidates(KeyValueStore& store, const std::string& base, const std::vector<netif::RankRecord>& records,
                      int me, NetifDecision& d, Deadline deadline) {
  using namespace netif;
  const int n = int(records.size());
  std::vector<std::string> my_addresses;
  for (const auto& c : d.candidates) my_addresses.push_back(c.addresses[size_t(me)]);
  ProbeServer server(my_addresses);
  std::string ports;
  for (size_t c = 0; c < d.candidates.size(); ++c) ports += (c ? "," : "") + std::to_string(server.port(c));
  store.set(base + "ports/" + std::to_string(me), ports, deadline);

  const int target = probe_target(records, me);
  std::vector<int> rtt_peers;
  std::map<int, std::vector<uint16_t>> ports_of;
  for (int p = 0; p < n; ++p) {
    const bool other_host = !records[size_t(p)].host.same_host(records[size_t(me)].host);
    if (!other_host || (n > kMaxAllPairsRanks && p != target)) continue;
    rtt_peers.push_back(p);
    ports_of[p] = peer_ports(store, base, p, d.candidates.size(), deadline);
  }
  const auto stream =
      std::chrono::milliseconds(std::clamp(kStreamBudgetMs / int(d.candidates.size()), kMinStreamMs, kMaxStreamMs));
  std::vector<std::vector<PairProbe>> results(d.candidates.size());
  for (size_t c = 0; c < d.candidates.size(); ++c) {
    // One candidate at a time on every rank, so streams do not share links or CPUs.
    store_barrier(store, base + "probe/" + std::to_string(c), n, deadline);
    const auto& cand = d.candidates[c];
    const std::string& ifname = cand.names[size_t(me)];
    const std::string& local = cand.addresses[size_t(me)];
    // A single probe is bounded well inside the overall deadline so a black hole costs ~1 s, not the deadline.
    const Deadline probe_deadline = std::min(deadline, Clock::now() + std::chrono::milliseconds(1000) + stream);
    for (int p : rtt_peers) {
      PairProbe pr;
      pr.from = me;
      pr.to = p;
      const std::string& peer = cand.addresses[size_t(p)];
      std::string src = route_source(peer);
      if (src != local) {
        pr.error = "the route to " + peer + " leaves from " + (src.empty() ? "nowhere" : src) + ", not " + ifname +
                   " (" + local + ")";
      } else {
        probe_rtt(pr, ifname, local, peer, ports_of[p][c], kRttRounds, probe_deadline);
      }
      results[c].push_back(pr);
    }
    store_barrier(store, base + "stream/" + std::to_string(c), n, deadline);
    for (auto& pr : results[c]) {
      if (pr.ok && pr.to == target)
        probe_bandwidth(pr, ifname, local, cand.addresses[size_t(target)], ports_of[target][c], stream,
                        std::min(deadline, Clock::now() + std::chrono::milliseconds(1000) + stream));
    }
  }
  store_barrier(store, base + "probed", n, deadline);  // every stream is done; servers may close
  share_probes(store, base, n, me, results, d, deadline);
}

}  // namespace

NetifDecision select_interface(KeyValueStore& store, const CommOptions& options, Deadline deadline) {
  using namespace netif;
  const InterfaceOverride ovr = parse_interface_override(options.network_interface);
  const std::string base = options.prefix + "/netif/";
  const int n = options.size, me = options.rank;

  RankRecord mine = make_record(me, local_host_identity(), discover_interfaces(/*with_hwloc=*/false), ovr);
  std::vector<RankRecord> records;
  if (n == 1) {
    records.push_back(mine);
  } else {
    store.set(base + "record/" + std::to_string(me), record_to_json(mine), deadline);
    for (int r = 0; r < n; ++r) {
      records.push_back(r == me ? mine : record_from_json(store.get(base + "record/" + std::to_string(r), deadline)));
    }
  }
  agree_or_throw(store, options, base + "refused", deadline, [&] { check_records(records, ovr.text); });
  NetifDecision d = plan(records, me, ovr.text);

  if (!d.single_host && !d.candidates.empty()) {
    const auto t0 = Clock::now();
    probe_candidates(store, base, records, me, d, deadline);
    d.probe_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }
  agree_or_throw(store, options, base + "undecided", deadline, [&] { decide(d); });
  if (me == 0) {
    subsystem_log(Subsystem::netif).info("{}", d.to_text());
  } else {
    subsystem_log(Subsystem::netif)
        .debug("tandem rank {}: network interface {} ({})", me, d.chosen.empty() ? "(UCX's choice)" : d.chosen,
               d.reason);
  }
  return d;
}

}  // namespace tandem
