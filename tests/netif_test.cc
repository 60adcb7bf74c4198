// Interface selection without root or a network: the override parser, subnet
// arithmetic, and the plan/decide steps over made-up hosts.
#include "tandem/netif.h"

#include <gtest/gtest.h>

#include <map>

#include "netif/netif_select.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"

namespace tandem {
namespace {

using netif::RankRecord;

std::vector<std::string> names_of(std::initializer_list<const char*> n) { return {n.begin(), n.end()}; }

// ---- override syntax ----------------------------------------------------------

TEST(NetifOverride, EmptyMeansAutomatic) {
  EXPECT_TRUE(parse_interface_override("").empty());
  EXPECT_TRUE(parse_interface_override("  ").empty());
  EXPECT_FALSE(parse_interface_override("").for_host("any"));
}

TEST(NetifOverride, ExactNameWinsOverPrefix) {
  auto f = *parse_interface_override("eth1").all_hosts;
  auto host = names_of({"eth1", "eth10", "lo"});
  EXPECT_TRUE(f.allows("eth1", host));
  EXPECT_FALSE(f.allows("eth10", host));  // the host has eth1 itself
  // Without an exact eth1 on the host, it is an NCCL-style prefix.
  EXPECT_TRUE(f.allows("eth10", names_of({"eth10", "lo"})));
}

TEST(NetifOverride, PrefixList) {
  auto f = *parse_interface_override("eth, ib").all_hosts;
  auto host = names_of({"eth0", "ib0", "docker0"});
  EXPECT_FALSE(f.exclude);
  EXPECT_TRUE(f.allows("eth0", host));
  EXPECT_TRUE(f.allows("ib0", host));
  EXPECT_FALSE(f.allows("docker0", host));
  EXPECT_EQ(f.to_string(), "eth,ib");
}

TEST(NetifOverride, Exclusion) {
  auto f = *parse_interface_override("^docker,lo").all_hosts;
  auto host = names_of({"eth0", "docker0", "lo", "lom1"});
  EXPECT_TRUE(f.exclude);
  EXPECT_TRUE(f.allows("eth0", host));
  EXPECT_FALSE(f.allows("docker0", host));
  EXPECT_FALSE(f.allows("lo", host));
  EXPECT_TRUE(f.allows("lom1", host));  // lo exists exactly, so it is not a prefix here
  auto g = *parse_interface_override("^=eth0").all_hosts;
  EXPECT_FALSE(g.allows("eth0", host));
  EXPECT_TRUE(g.allows("eth01", names_of({"eth0", "eth01"})));
}

TEST(NetifOverride, ExactNeverAPrefix) {
  auto f = *parse_interface_override("=eth").all_hosts;
  EXPECT_FALSE(f.allows("eth0", names_of({"eth0"})));
  EXPECT_TRUE(f.patterns[0].exact);
}

TEST(NetifOverride, PerHost) {
  auto o = parse_interface_override("host1:eth0; host2:ens5,ens6 ;*:^docker");
  ASSERT_EQ(o.per_host.size(), 2u);
  EXPECT_EQ(o.for_host("host1")->to_string(), "eth0");
  EXPECT_EQ(o.for_host("host2")->to_string(), "ens5,ens6");
  EXPECT_EQ(o.for_host("host3")->to_string(), "^docker");  // the * default
  auto without_default = parse_interface_override("host1:=eth0;");
  EXPECT_FALSE(without_default.for_host("host3"));  // automatic there
  EXPECT_TRUE(without_default.for_host("host1")->patterns[0].exact);
}

TEST(NetifOverride, RejectsWhatItCannotMean) {
  for (const char* bad : {"eth0;ens5", "^", "eth0,,ib", ":eth0", "host1:", "h:eth0;h:ens5", "*:a;*:b", "eth 0",
                          "averyveryverylongname0", "=", "host1:eth0;ens5"}) {
    EXPECT_THROW(parse_interface_override(bad), InvalidArgument) << bad;
  }
  try {
    parse_interface_override("eth0;ens5");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("host1:eth0;host2:ens5"), std::string::npos) << e.what();
  }
}

// ---- subnets ------------------------------------------------------------------

TEST(NetifSubnet, Arithmetic) {
  EXPECT_EQ(subnet_of("10.1.2.3", 24), "10.1.2.0/24");
  EXPECT_EQ(subnet_of("10.1.2.3", 20), "10.1.0.0/20");
  EXPECT_EQ(subnet_of("10.1.2.3", 32), "10.1.2.3/32");
  EXPECT_EQ(subnet_of("10.1.2.3", 0), "0.0.0.0/0");
  EXPECT_EQ(subnet_of("fd00::1:2", 64), "fd00::/64");
  EXPECT_EQ(subnet_of("fd00:1:2:3:4::1", 56), "fd00:1:2::/56");
  EXPECT_FALSE(subnet_of("10.1.2.3", 33));
  EXPECT_FALSE(subnet_of("not-an-ip", 24));
  EXPECT_TRUE(in_subnet("10.1.2.200", "10.1.2.0", 24));
  EXPECT_FALSE(in_subnet("10.1.3.1", "10.1.2.0", 24));
  EXPECT_TRUE(in_subnet("10.1.3.1", "10.1.2.0", 23));
  EXPECT_FALSE(in_subnet("10.1.2.1", "fd00::", 24));  // families differ
  EXPECT_TRUE(in_subnet("fe80::1", "fe80::", 10));
}

// ---- plan and decide ------------------------------------------------------------

NetInterface itf(const std::string& name, std::vector<InterfaceAddress> addrs, int speed = 10000) {
  NetInterface i;
  i.name = name;
  i.addresses = std::move(addrs);
  i.up = true;
  i.operstate = "up";
  i.speed_mbps = speed;
  i.loopback = name == "lo";
  return i;
}

RankRecord host(int rank, const std::string& hostname, std::vector<NetInterface> ifs, const std::string& ovr = "") {
  HostIdentity id{hostname, "boot-" + hostname, "ns-" + hostname};
  return netif::make_record(rank, id, std::move(ifs), parse_interface_override(ovr));
}

NetInterface lo() { return itf("lo", {{"127.0.0.1", 8, 4}}, -1); }

// Three hosts naming the same two networks differently, one with a decoy.
std::vector<RankRecord> three_hosts(const std::string& ovr = "") {
  return {
      host(0, "a", {lo(), itf("eth0", {{"10.1.0.1", 24, 4}}), itf("eth1", {{"10.2.0.1", 24, 4}}, 1000)}, ovr),
      host(1, "b",
           {lo(), itf("ens5", {{"10.1.0.2", 24, 4}, {"fe80::2", 64, 6}}), itf("ens6", {{"10.2.0.2", 24, 4}}, 1000),
            itf("docker0", {{"172.17.0.1", 16, 4}})},
           ovr),
      host(2, "c", {lo(), itf("enp3s0", {{"10.1.0.3", 24, 4}}), itf("enp4s0", {{"10.2.0.3", 24, 4}}, 1000)}, ovr),
  };
}

void add_probes(NetifDecision& d, const std::string& subnet, double gbps, double rtt) {
  for (auto& c : d.candidates) {
    if (c.subnet != subnet) continue;
    for (int r = 0; r < d.size; ++r) {
      PairProbe p;
      p.from = r;
      p.to = (r + 1) % d.size;
      p.ok = true;
      p.rtt_us = rtt;
      p.bandwidth_gbps = gbps;
      c.probes.push_back(p);
    }
  }
}

TEST(NetifPlan, MatchesBySubnetNotName) {
  auto d = netif::plan(three_hosts(), 1, "");
  EXPECT_FALSE(d.single_host);
  EXPECT_EQ(d.distinct_hosts, 3);
  ASSERT_EQ(d.candidates.size(), 2u);
  EXPECT_EQ(d.candidates[0].subnet, "10.1.0.0/24");
  EXPECT_EQ(d.candidates[0].names, names_of({"eth0", "ens5", "enp3s0"}));
  EXPECT_EQ(d.candidates[1].names, names_of({"eth1", "ens6", "enp4s0"}));
  EXPECT_EQ(d.candidates[1].min_speed_mbps, 1000);
  bool decoy = false, loopback = false;
  for (const auto& e : d.excluded) {
    if (e.name == "docker0") {
      decoy = true;
      EXPECT_EQ(e.rank, 1);
      EXPECT_NE(e.reason.find("172.17.0.0/16 is not shared (no address in it on rank 0 (a), rank 2 (c))"),
                std::string::npos)
          << e.reason;
    }
    if (e.name == "lo") loopback = true;
  }
  EXPECT_TRUE(decoy);
  EXPECT_TRUE(loopback);
}

TEST(NetifPlan, DecidesFastestAndEachRankUsesItsOwnName) {
  for (int rank = 0; rank < 3; ++rank) {
    auto d = netif::plan(three_hosts(), rank, "");
    add_probes(d, "10.1.0.0/24", 2.0, 40);
    add_probes(d, "10.2.0.0/24", 0.1, 60);
    netif::decide(d);
    EXPECT_EQ(d.chosen_subnet, "10.1.0.0/24");
    EXPECT_EQ(d.chosen, (std::vector<std::string>{"eth0", "ens5", "enp3s0"}[size_t(rank)]));
    EXPECT_NE(d.candidates[1].excluded_reason.find("slower"), std::string::npos);
    EXPECT_NE(d.to_text().find("CHOSEN"), std::string::npos);
    EXPECT_EQ(d.to_text().find('{'), std::string::npos) << "the log block must not look like JSON";
    EXPECT_NE(d.to_json().find("\"chosen\":\""), std::string::npos);
  }
}

TEST(NetifPlan, TieBrokenByLinkSpeedAndFailedProbeExcludes) {
  auto d = netif::plan(three_hosts(), 0, "");
  add_probes(d, "10.1.0.0/24", 1.0, 40);
  add_probes(d, "10.2.0.0/24", 1.05, 40);  // within 10%: the 10 Gb/s link wins on speed
  netif::decide(d);
  EXPECT_EQ(d.chosen, "eth0");

  auto e = netif::plan(three_hosts(), 0, "");
  add_probes(e, "10.1.0.0/24", 5.0, 40);
  add_probes(e, "10.2.0.0/24", 0.1, 40);
  e.candidates[0].probes[1].ok = false;
  e.candidates[0].probes[1].error = "connect timed out";
  netif::decide(e);
  EXPECT_EQ(e.chosen, "eth1");
  EXPECT_FALSE(e.candidates[0].common);
  EXPECT_NE(e.candidates[0].excluded_reason.find("rank 1 (b) -> rank 2 (c) failed: connect timed out"),
            std::string::npos);
}

TEST(NetifPlan, OverrideRestrictsAndMatchingNothingNamesTheHost) {
  auto recs = three_hosts("a:eth1;b:ens6;c:enp4s0");
  EXPECT_NO_THROW(netif::check_records(recs, "x"));
  auto d = netif::plan(recs, 2, "a:eth1;b:ens6;c:enp4s0");
  ASSERT_EQ(d.candidates.size(), 1u);
  EXPECT_EQ(d.candidates[0].names[2], "enp4s0");

  auto bad = three_hosts("a:eth0;b:ib;c:enp3s0");
  try {
    netif::check_records(bad, "a:eth0;b:ib;c:enp3s0");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("host b (rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("ens5 [10.1.0.2/24"), std::string::npos) << m;  // lists what it has
    EXPECT_EQ(m.find("host a"), std::string::npos) << m;
  }
  // Allowed everywhere but in different subnets: nothing common, and with an override that is an error.
  auto split = three_hosts("a:eth0;b:ens6;c:enp3s0");
  auto s = netif::plan(split, 0, "a:eth0;b:ens6;c:enp3s0");
  EXPECT_TRUE(s.candidates.empty());
  EXPECT_THROW(netif::decide(s), InvalidArgument);
  // Without an override, the same situation leaves the choice to UCX.
  auto none = netif::plan({host(0, "a", {lo(), itf("eth0", {{"10.1.0.1", 24, 4}})}),
                           host(1, "b", {lo(), itf("eth0", {{"10.9.0.1", 24, 4}})})},
                          0, "");
  netif::decide(none);
  EXPECT_EQ(none.chosen, "");
  EXPECT_NE(none.reason.find("UCX chooses"), std::string::npos);
}

TEST(NetifPlan, OneHostUsesLoopbackAndDifferentNamespacesAreDifferentHosts) {
  HostIdentity id{"same", "boot", "ns1"};
  std::vector<NetInterface> ifs = {lo(), itf("eth0", {{"10.1.0.1", 24, 4}})};
  std::vector<RankRecord> recs = {netif::make_record(0, id, ifs, {}), netif::make_record(1, id, ifs, {})};
  auto d = netif::plan(recs, 1, "");
  EXPECT_TRUE(d.single_host);
  EXPECT_EQ(d.chosen, "lo");
  EXPECT_EQ(netif::probe_target(recs, 0), -1);

  HostIdentity other = id;
  other.netns = "ns2";  // same machine and hostname, another network namespace
  std::vector<NetInterface> ifs2 = {lo(), itf("eth0", {{"10.1.0.2", 24, 4}})};
  recs[1] = netif::make_record(1, other, ifs2, {});
  auto e = netif::plan(recs, 1, "");
  EXPECT_FALSE(e.single_host);
  EXPECT_EQ(e.candidates.size(), 1u);
  EXPECT_EQ(netif::probe_target(recs, 0), 1);
}

TEST(NetifPlan, RecordsSurviveTheStoreAndDownOrLinkLocalInterfacesAreUnusable) {
  NetInterface down = itf("eth2", {{"10.3.0.1", 24, 4}});
  down.up = false;
  down.operstate = "down";
  auto r = host(0, "a", {lo(), down, itf("eth3", {{"fe80::1", 64, 6}})});
  EXPECT_NE(r.unusable[1].find("down"), std::string::npos);
  EXPECT_EQ(r.unusable[2], "only link-local addresses");
  auto back = netif::record_from_json(netif::record_to_json(r));
  EXPECT_EQ(back.interfaces.size(), 3u);
  EXPECT_EQ(back.interfaces[0].addresses[0].address, "127.0.0.1");
  EXPECT_EQ(back.unusable, r.unusable);
  EXPECT_TRUE(back.host.same_host(r.host));
  EXPECT_THROW(netif::record_from_json("{not json"), InvalidArgument);
}

// ---- environment ------------------------------------------------------------------

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(NetifEnv, OverrideAndHostStoreAreReadOnce) {
  std::map<std::string, std::string> base = {
      {"TANDEM_RANK", "0"},
      {"TANDEM_WORLD_SIZE", "3"},
      {"TANDEM_LOCAL_WORLD_SIZE", "1"},
      {"TANDEM_LOCAL_RANK", "0"},
      {"TANDEM_STORE_ADDR", "10.71.1.1:29500"},
      {"TANDEM_SECRET", std::string(64, 's')}};  // a store beyond loopback needs one
  auto o = comm_options_from_env(env_of(base));
  EXPECT_EQ(o.network_interface, "");
  EXPECT_FALSE(o.host_store);
  EXPECT_FALSE(o.ucx_net_devices_pinned);

  auto v = base;
  v["DTRAIN_NETWORK_INTERFACE"] = "^docker,lo";
  v["TANDEM_HOST_STORE"] = "1";
  v["UCX_NET_DEVICES"] = "mlx5_0:1";
  o = comm_options_from_env(env_of(v));
  EXPECT_EQ(o.network_interface, "^docker,lo");
  EXPECT_TRUE(o.host_store);  // rank 0
  EXPECT_TRUE(o.ucx_net_devices_pinned);
  v["TANDEM_RANK"] = "2";
  EXPECT_FALSE(comm_options_from_env(env_of(v)).host_store);  // only rank 0 hosts

  v["TANDEM_NETWORK_INTERFACE"] = "eth0";  // disagrees with DTRAIN_
  EXPECT_THROW(comm_options_from_env(env_of(v)), InvalidArgument);
  v.erase("DTRAIN_NETWORK_INTERFACE");
  v["TANDEM_NETWORK_INTERFACE"] = "eth0;ens5";  // malformed: fails before any connection
  EXPECT_THROW(comm_options_from_env(env_of(v)), InvalidArgument);
  v["TANDEM_NETWORK_INTERFACE"] = "eth0";
  v["TANDEM_HOST_STORE"] = "yes";
  EXPECT_THROW(comm_options_from_env(env_of(v)), InvalidArgument);
}

TEST(NetifDiscovery, FindsLoopback) {
  auto ifs = discover_interfaces(false);
  bool found = false;
  for (const auto& i : ifs)
    if (i.loopback) found = true;
  EXPECT_TRUE(found);
  EXPECT_FALSE(local_host_identity().netns.empty());
}

}  // namespace
}  // namespace tandem
