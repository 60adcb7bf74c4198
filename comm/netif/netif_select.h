// The pure steps of interface selection, separated from the store and the
// sockets so tests can feed them made-up hosts (tests/netif_test.cc).
//
//   record  -> what one rank publishes: its host, interfaces, and why each is unusable
//   plan    -> from every record: single host, or candidates by shared subnet
//   decide  -> from the candidates' probes: which one, and why
#pragma once

#include <string>
#include <vector>

#include "tandem/netif.h"

namespace tandem::netif {

struct RankRecord {
  int rank = -1;
  HostIdentity host;
  std::vector<NetInterface> interfaces;
  std::vector<std::string> unusable;  // per interface: why it cannot be used here, "" = usable
  std::string error;                  // the override matched nothing usable on this host
};

// Applies the override for this host and the local rules (down, no address,
// only link-local addresses).
RankRecord make_record(int rank, const HostIdentity& host, std::vector<NetInterface> interfaces,
                       const InterfaceOverride& override_spec);
std::string record_to_json(const RankRecord& r);
RankRecord record_from_json(const std::string& text);  // throws InvalidArgument on malformed text

// Throws InvalidArgument naming every host/rank whose record has an error.
void check_records(const std::vector<RankRecord>& records, const std::string& override_text);

// Single host (loopback, or the override's first match), or the candidates
// (subnets in which every rank has an address) with exclusions; no probes yet.
NetifDecision plan(const std::vector<RankRecord>& records, int rank, const std::string& override_text);

// Marks candidates whose probes failed, picks the fastest common one (ties
// within 10% broken by link speed, then RTT) and fills chosen/reason. With an
// override and no common candidate, throws InvalidArgument.
void decide(NetifDecision& d);

// The rank `rank` streams to when probing: the next rank, in ring order, on another host; -1 if none.
int probe_target(const std::vector<RankRecord>& records, int rank);

}  // namespace tandem::netif
