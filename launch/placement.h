// Placement: which host each rank runs on, its local rank there, and the
// share of this host's CPUs a local rank is bound to.
#pragma once

#include <sched.h>

#include <optional>
#include <string>
#include <vector>

#include "tandem/launch/launch.h"

namespace tandem::launch {

// Where a rank runs: its host (empty: this one), the index of that host's
// entry in the host list (0 without one; torchrun's GROUP_RANK), its local
// rank and how many ranks share that host.
struct Placement {
  std::string host;
  int node = 0;
  int local_rank = 0;
  int local_size = 1;
  bool remote() const { return !host.empty(); }
};

bool is_this_host(const std::string& host);
// `host` as a Placement names it: empty for this one.
std::string placement_host(const std::string& host);

// A count of slots: 1..4 digits, else 0 (which every caller refuses).
int parse_slot_count(const std::string& text);
// "name", "name:slots", "[v6 address]:slots" or a bare v6 address (several
// colons, one slot): the host, and its slots (0 when they are not a count).
HostSlots split_host_slots(const std::string& entry);

// How many of `world` ranks each host gets: its slots in order, then (when
// oversubscribed) one more on each host in turn below its max_slots; the
// sum falls short of `world` only when every host is at its max_slots.
std::vector<int> ranks_per_host(const std::vector<HostSlots>& hosts, int world);

// Host-major: each host's slots in order; without a host list every rank
// (parameter servers too) is local.
std::vector<Placement> place_ranks(const LaunchOptions& o);

// The CPUs that rank `local` of `size` ranks on this host runs on: its equal
// share, in order, of `cpus` (the launcher's); when the ranks outnumber them,
// CPU local % cpus.size(), so each carries as many ranks as another, give or
// take one (left to the scheduler, a passing load could stack three of four
// ranks on one of two cores for seconds).
std::optional<cpu_set_t> cpu_share(const std::vector<int>& cpus, int local, int size);

}  // namespace tandem::launch
