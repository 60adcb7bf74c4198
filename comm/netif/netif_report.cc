// Reports of interface selection: the decision as text (`tandem netif`, logs)
// and JSON, the interface list, and the JSON forms the ranks exchange
// (interfaces, probes, each rank's record).
#include "netif_report.h"

#include <cstdio>

#include "netif_select.h"

namespace tandem {
namespace netif {

using nlohmann::json;

std::string fmt_gbps(double g) {
  char b[32];
  std::snprintf(b, sizeof b, g >= 1 ? "%.2f" : "%.3f", g);
  return b;
}

std::string fmt_us(double us) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", us);
  return b;
}

json to_j(const NetInterface& i) {
  json addrs = json::array();
  for (const auto& a : i.addresses)
    addrs.push_back({{"address", a.address}, {"prefix", a.prefix}, {"family", a.family}});
  return {{"name", i.name},           {"addresses", addrs},        {"up", i.up},
          {"loopback", i.loopback},   {"operstate", i.operstate},  {"speed_mbps", i.speed_mbps},
          {"numa_node", i.numa_node}, {"pci_bus_id", i.pci_bus_id}};
}

NetInterface interface_from(const json& j) {
  NetInterface i;
  i.name = j.at("name").get<std::string>();
  for (const auto& a : j.at("addresses"))
    i.addresses.push_back({a.at("address").get<std::string>(), a.at("prefix").get<int>(), a.at("family").get<int>()});
  i.up = j.at("up").get<bool>();
  i.loopback = j.at("loopback").get<bool>();
  i.operstate = j.value("operstate", "");
  i.speed_mbps = j.value("speed_mbps", -1);
  i.numa_node = j.value("numa_node", -1);
  i.pci_bus_id = j.value("pci_bus_id", "");
  return i;
}

json to_j(const PairProbe& p) {
  return {{"from", p.from},  {"to", p.to}, {"ok", p.ok}, {"rtt_us", p.rtt_us}, {"bandwidth_gbps", p.bandwidth_gbps},
          {"error", p.error}};
}

PairProbe probe_from(const json& j) {
  PairProbe p;
  p.from = j.at("from").get<int>();
  p.to = j.at("to").get<int>();
  p.ok = j.at("ok").get<bool>();
  p.rtt_us = j.at("rtt_us").get<double>();
  p.bandwidth_gbps = j.at("bandwidth_gbps").get<double>();
  p.error = j.at("error").get<std::string>();
  return p;
}

std::string record_to_json(const RankRecord& r) {
  json ifs = json::array();
  for (const auto& i : r.interfaces) ifs.push_back(to_j(i));
  return json{{"rank", r.rank},
              {"host", {{"hostname", r.host.hostname}, {"boot_id", r.host.boot_id}, {"netns", r.host.netns}}},
              {"interfaces", ifs},
              {"unusable", r.unusable},
              {"error", r.error}}
      .dump();
}

RankRecord record_from_json(const std::string& text) {
  try {
    json j = json::parse(text);
    RankRecord r;
    r.rank = j.at("rank").get<int>();
    r.host.hostname = j.at("host").at("hostname").get<std::string>();
    r.host.boot_id = j.at("host").at("boot_id").get<std::string>();
    r.host.netns = j.at("host").at("netns").get<std::string>();
    for (const auto& i : j.at("interfaces")) r.interfaces.push_back(interface_from(i));
    r.unusable = j.at("unusable").get<std::vector<std::string>>();
    r.error = j.at("error").get<std::string>();
    if (r.unusable.size() != r.interfaces.size()) throw InvalidArgument("unusable/interfaces length mismatch");
    return r;
  } catch (const json::exception& e) {
    throw InvalidArgument(std::string("tandem: malformed interface record in the store: ") + e.what());
  }
}

}  // namespace netif

std::string NetifDecision::to_json() const {
  using nlohmann::json;
  json cands = json::array();
  for (const auto& c : candidates) {
    json probes = json::array();
    for (const auto& p : c.probes) probes.push_back(netif::to_j(p));
    cands.push_back({{"subnet", c.subnet},
                     {"aliases", c.aliases},
                     {"names", c.names},
                     {"addresses", c.addresses},
                     {"min_speed_mbps", c.min_speed_mbps},
                     {"common", c.common},
                     {"excluded_reason", c.excluded_reason},
                     {"bandwidth_gbps", c.bandwidth_gbps},
                     {"rtt_us", c.rtt_us},
                     {"probes", probes}});
  }
  json excl = json::array();
  for (const auto& e : excluded)
    excl.push_back({{"rank", e.rank}, {"host", e.host}, {"name", e.name}, {"reason", e.reason}});
  return json{{"rank", rank},
              {"size", size},
              {"hosts", hosts},
              {"distinct_hosts", distinct_hosts},
              {"single_host", single_host},
              {"override", override_text},
              {"chosen", chosen},
              {"chosen_subnet", chosen_subnet},
              {"chosen_per_rank", chosen_per_rank},
              {"reason", reason},
              {"candidates", cands},
              {"excluded", excl},
              {"probe_ms", probe_ms}}
      .dump();
}

std::string NetifDecision::to_text() const {
  using netif::fmt_gbps;
  using netif::fmt_us;
  std::string s = "tandem network interface selection: " + std::to_string(size) + " ranks on " +
                  std::to_string(distinct_hosts) + (distinct_hosts == 1 ? " host" : " hosts") + ", override " +
                  (override_text.empty() ? "none" : "'" + override_text + "'");
  // One host: nothing was probed or matched; one line says it all.
  if (single_host) return s + ": " + (chosen.empty() ? "UCX chooses" : chosen) + " (" + reason + ")";
  s += "\n";
  if (!candidates.empty()) {
    char line[512];
    s += "  candidates (subnet, interface per rank, slowest link, measured):\n";
    for (const auto& c : candidates) {
      std::string names;
      for (const auto& n : c.names) names += (names.empty() ? "" : "|") + n;
      std::string measured =
          c.bandwidth_gbps > 0 ? fmt_gbps(c.bandwidth_gbps) + " GB/s " + fmt_us(c.rtt_us) + " us" : std::string("-");
      std::string verdict = (!chosen_subnet.empty() && c.subnet == chosen_subnet) ? "CHOSEN" : c.excluded_reason;
      std::snprintf(line, sizeof line, "    %-22s %-28s %6s Mb/s  %-22s %s\n", c.subnet.c_str(), names.c_str(),
                    c.min_speed_mbps > 0 ? std::to_string(c.min_speed_mbps).c_str() : "?", measured.c_str(),
                    verdict.c_str());
      s += line;
      for (const auto& p : c.probes) {
        s += "      rank " + std::to_string(p.from) + " -> " + std::to_string(p.to) + ": ";
        s += p.ok ? fmt_us(p.rtt_us) + " us" + (p.bandwidth_gbps > 0 ? ", " + fmt_gbps(p.bandwidth_gbps) + " GB/s" : "")
                  : "FAILED " + p.error;
        s += "\n";
      }
    }
  }
  if (!excluded.empty()) {
    s += "  excluded:\n";
    for (const auto& e : excluded)
      s += "    rank " + std::to_string(e.rank) + " (" + e.host + ") " + e.name + ": " + e.reason + "\n";
  }
  std::string per_rank;
  if (!single_host) {
    for (size_t r = 0; r < chosen_per_rank.size(); ++r)
      per_rank += (r ? ", " : "") + chosen_per_rank[r] + " on rank " + std::to_string(r);
  }
  s += "  chosen: " +
       (chosen.empty()     ? std::string("none (UCX chooses)")
        : per_rank.empty() ? chosen
                           : per_rank) +
       (chosen_subnet.empty() ? "" : " in " + chosen_subnet) + ": " + reason;
  if (probe_ms > 0) s += " [probing took " + fmt_us(probe_ms) + " ms]";
  return s;
}

std::string interfaces_to_text(const std::vector<NetInterface>& interfaces) {
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %-8s %10s %5s %-13s %s\n", "interface", "state", "speed", "numa", "pci",
                "addresses");
  s += line;
  for (const auto& i : interfaces) {
    std::string addrs;
    for (const auto& a : i.addresses) addrs += (addrs.empty() ? "" : " ") + a.address + "/" + std::to_string(a.prefix);
    std::string state = i.up ? (i.operstate.empty() ? "up" : i.operstate) : "down";
    std::snprintf(line, sizeof line, "%-16s %-8s %10s %5s %-13s %s\n", i.name.c_str(), state.c_str(),
                  i.speed_mbps > 0 ? (std::to_string(i.speed_mbps) + " Mb/s").c_str() : "-",
                  i.numa_node >= 0 ? std::to_string(i.numa_node).c_str() : "-",
                  i.pci_bus_id.empty() ? "-" : i.pci_bus_id.c_str(), addrs.empty() ? "-" : addrs.c_str());
    s += line;
  }
  return s;
}

std::string interfaces_to_json(const std::vector<NetInterface>& interfaces, const HostIdentity& host) {
  nlohmann::json ifs = nlohmann::json::array();
  for (const auto& i : interfaces) ifs.push_back(netif::to_j(i));
  return nlohmann::json{{"host", {{"hostname", host.hostname}, {"boot_id", host.boot_id}, {"netns", host.netns}}},
                        {"interfaces", ifs}}
      .dump();
}

}  // namespace tandem
