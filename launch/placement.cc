// Placement of the ranks on hosts and CPUs (see placement.h), the host list
// syntax of -H, and the checks of a launch's options (validate).
#include "placement.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "spawn.h"

namespace tandem::launch {

bool is_this_host(const std::string& host) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return host == "localhost" || host == "127.0.0.1" || host == "::1" || host == name;
}

std::string placement_host(const std::string& host) { return is_this_host(host) ? "" : host; }

std::vector<int> ranks_per_host(const std::vector<HostSlots>& hosts, int world) {
  std::vector<int> counts;
  int left = world;
  for (const HostSlots& h : hosts) {
    counts.push_back(std::min(h.slots, left));
    left -= counts.back();
  }
  // Oversubscribed: one more on each host in turn that has room, as mpirun spreads them.
  for (bool placed = true; left > 0 && placed;) {
    placed = false;
    for (size_t h = 0; h < hosts.size() && left > 0; ++h) {
      if (hosts[h].max_slots > 0 && counts[h] >= hosts[h].max_slots) continue;
      ++counts[h], --left, placed = true;
    }
  }
  return counts;
}

std::vector<Placement> place_ranks(const LaunchOptions& o) {
  std::vector<Placement> out;
  const int world = o.nprocs + o.servers;
  if (o.hosts.empty()) {
    for (int r = 0; r < world; ++r) out.push_back({"", 0, r, world});
    return out;
  }
  const std::vector<int> counts = ranks_per_host(o.hosts, world);
  for (size_t node = 0; node < o.hosts.size(); ++node) {
    const HostSlots& h = o.hosts[node];
    for (int l = 0; l < counts[node]; ++l) out.push_back({placement_host(h.host), int(node), l, counts[node]});
  }
  return out;
}

std::optional<cpu_set_t> cpu_share(const std::vector<int>& cpus, int local, int size) {
  if (size < 1 || local < 0 || local >= size || cpus.empty()) return std::nullopt;
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (size > int(cpus.size())) {
    CPU_SET(cpus[size_t(local) % cpus.size()], &mine);
    return mine;
  }
  const size_t per = cpus.size() / size_t(size);
  for (size_t k = 0; k < per; ++k) CPU_SET(cpus[size_t(local) * per + k], &mine);
  return mine;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

int parse_slot_count(const std::string& text) {
  const bool digits = !text.empty() && text.size() <= 4 && text.find_first_not_of("0123456789") == std::string::npos;
  return digits ? std::atoi(text.c_str()) : 0;
}

HostSlots split_host_slots(const std::string& entry) {
  HostSlots h;
  h.host = entry;
  std::string slots;
  if (!entry.empty() && entry[0] == '[') {
    const size_t close = entry.find(']');
    h.host = close == std::string::npos ? "" : entry.substr(1, close - 1);
    if (close != std::string::npos && close + 1 < entry.size()) {
      slots = entry[close + 1] == ':' ? entry.substr(close + 2) : "bad";
    }
  } else if (std::count(entry.begin(), entry.end(), ':') == 1) {
    h.host = entry.substr(0, entry.find(':'));
    slots = entry.substr(entry.find(':') + 1);
  }
  if (!slots.empty()) h.slots = parse_slot_count(slots);
  return h;
}

std::vector<HostSlots> parse_hosts(const std::string& text) {
  std::vector<HostSlots> hosts;
  std::istringstream in(text);
  for (std::string entry; std::getline(in, entry, ',');) {
    const HostSlots h = split_host_slots(entry);
    if (h.host.empty() || h.slots < 1 || h.slots > kMaxLocalRanks) {
      throw std::invalid_argument("-H entry '" + entry + "' is not host or host:slots with 1.." +
                                  std::to_string(kMaxLocalRanks) + " slots (e.g. -H node1:4,node2:4)");
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) throw std::invalid_argument("-H is empty; give host:slots,... (e.g. -H node1:4,node2:4)");
  return hosts;
}

namespace {

SettingTable<LaunchOptions> make_launch_settings() {
  Setting bind = setting_row("launch", "TANDEM_BIND", "bind", SettingKind::choice, "auto",
                             "auto: each rank runs on its own share of this host's CPUs, or when ranks "
                             "outnumber them on one CPU, dealt round-robin; none: the scheduler places them "
                             "(--bind wins).");
  bind.accepted = {"auto", "none"};
  return {{bind, [bind](LaunchOptions& o, const std::string& v) { o.bind = parse_choice_setting(bind, v); },
           [](const LaunchOptions& o) { return o.bind; }}};
}

}  // namespace

const SettingTable<LaunchOptions>& launch_settings() {
  static const SettingTable<LaunchOptions> table = make_launch_settings();
  return table;
}

std::string default_bind(const EnvLookup& env) {
  LaunchOptions o;
  read_settings(launch_settings(), env, o);
  return o.bind;
}

void parse_elastic(const std::string& text, LaunchOptions& o) {
  int min = 0, max = 0;
  char extra = 0;
  const int fields = std::sscanf(text.c_str(), "%d:%d%c", &min, &max, &extra);
  if (fields == 1 && text.find(':') == std::string::npos) max = min;
  if ((fields != 1 && fields != 2) || (fields == 1 && max != min) || min < 1 || max < min || max > kMaxLocalRanks) {
    throw std::invalid_argument("--elastic takes MIN:MAX workers, 1 <= MIN <= MAX <= " +
                                std::to_string(kMaxLocalRanks) + " (got '" + text + "')");
  }
  o.elastic_min = min;
  o.elastic_max = max;
  if (o.nprocs == -1 && o.hosts.empty()) o.nprocs = max;
}

std::string validate(const LaunchOptions& o) {
  if (o.max_restarts < 0) return "--max-restarts must be 0 or more (got " + std::to_string(o.max_restarts) + ")";
  if (o.max_restarts > 0 && o.elastic_min == 0) {
    return "--max-restarts replaces lost workers of an elastic job: give --elastic MIN:MAX too";
  }
  if (!o.host_discovery_script.empty() && o.elastic_min == 0)
    return "--host-discovery-script adds workers to an elastic job: give --elastic MIN:MAX too";
  int slots = 0;
  for (const HostSlots& h : o.hosts) slots += h.slots;
  if (!o.hosts.empty()) {
    if (o.nprocs > slots && !o.oversubscribe) {
      return "-n " + std::to_string(o.nprocs) + " asks for more ranks than the hosts (-H or --hostfile) offer (" +
             std::to_string(slots) +
             " slots); add hosts or slots, leave -n out to use every slot, or give "
             "--oversubscribe";
    }
    const std::vector<int> counts = ranks_per_host(o.hosts, std::max(o.nprocs, 0));
    if (o.nprocs > std::accumulate(counts.begin(), counts.end(), 0))
      return "-n " + std::to_string(o.nprocs) +
             " asks for more ranks than the hosts' max_slots allow (--hostfile); "
             "raise max_slots or add hosts";
    if (o.servers > 0)
      return "--servers cannot be combined with -H or --hostfile yet: start parameter servers with mpirun or by hand";
  } else if (o.nprocs == -1 && !o.host_discovery_script.empty()) {
    return "the host discovery script offered no slots to start on; it prints host:slots lines (e.g. "
           "localhost:4), or give -n";
  } else if (o.nprocs == -1) {
    return "say how many ranks: -n/--nprocs N (on this host), or -H host:slots,... or --hostfile FILE (across "
           "hosts)";
  }
  if (o.nprocs < 1 || o.nprocs > kMaxLocalRanks) {
    return "-n must be between 1 and " + std::to_string(kMaxLocalRanks) + " local ranks (got " +
           std::to_string(o.nprocs) + ")";
  }
  if (o.servers < 0 || o.nprocs + o.servers > kMaxLocalRanks) {
    return "--servers must be between 0 and " + std::to_string(kMaxLocalRanks - o.nprocs) + " (got " +
           std::to_string(o.servers) + ")";
  }
  if (o.servers > 0 && o.server_command.empty()) return "--servers needs the parameter servers' command";
  auto bad_seconds = [](double s) { return !std::isfinite(s) || s < 0 || s > 1e7; };
  if (bad_seconds(o.timeout_seconds)) return "--timeout must be a number of seconds >= 0 (0 = no limit)";
  if (bad_seconds(o.grace_seconds)) return "--grace must be a number of seconds >= 0";
  if (bad_seconds(o.kill_after_seconds)) return "the SIGTERM-to-SIGKILL delay must be >= 0 seconds";
  if (o.bind != "auto" && o.bind != "none") return "--bind must be auto or none (got '" + o.bind + "')";
  if (o.elastic_min > 0 && (o.nprocs < o.elastic_min || o.nprocs > o.elastic_max)) {
    return "-n " + std::to_string(o.nprocs) + " is outside --elastic " + std::to_string(o.elastic_min) + ":" +
           std::to_string(o.elastic_max) + "; start between MIN and MAX workers (leave -n out for MAX)";
  }
  if (std::string bad = check_environment(o.environment); !bad.empty()) return bad;
  if (o.command.empty() || o.command[0].empty()) {
    return "no command given; usage: tandem launch -n N [--timeout S] [--grace S] -- command [args...]";
  }
  return "";
}

}  // namespace tandem::launch
