// Topology: hosts and local ranks from one host identity per rank.
#include <hwloc.h>

#include <map>
#include <string>

#include "tandem/comm_options.h"
#include "tandem/errors.h"
#include "tandem/transport.h"

namespace tandem {

Topology make_topology(const std::vector<std::string>& host_ids, int rank) {
  if (rank < 0 || size_t(rank) >= host_ids.size()) {
    throw InvalidArgument("make_topology: rank " + std::to_string(rank) + " is out of range for " +
                          std::to_string(host_ids.size()) + " host ids");
  }
  Topology t;
  t.rank = rank;
  t.host_of.resize(host_ids.size());
  t.local_rank_of.resize(host_ids.size());
  std::map<std::string, int> number;  // host id -> host number
  for (size_t r = 0; r < host_ids.size(); ++r) {
    auto [it, fresh] = number.emplace(host_ids[r], int(t.ranks.size()));
    if (fresh) t.ranks.emplace_back();
    t.host_of[r] = it->second;
    t.local_rank_of[r] = int(t.ranks[size_t(it->second)].size());
    t.ranks[size_t(it->second)].push_back(int(r));
  }
  return t;
}

bool Topology::uniform() const {
  for (const auto& h : ranks) {
    if (h.size() != ranks.front().size()) return false;
  }
  return !ranks.empty();
}

std::vector<int> Topology::peers_with_local_rank(int local) const {
  std::vector<int> out;
  for (const auto& h : ranks) {
    if (size_t(local) < h.size()) out.push_back(h[size_t(local)]);
  }
  return out;
}

std::string Topology::str() const {
  const std::string hs = std::to_string(hosts()) + (hosts() == 1 ? " host" : " hosts");
  if (uniform()) {
    const size_t n = ranks.front().size();
    return hs + " x " + std::to_string(n) + (n == 1 ? " rank" : " ranks");
  }
  std::string s = hs + " (";
  for (size_t h = 0; h < ranks.size(); ++h) s += (h ? ", " : "") + std::to_string(ranks[h].size());
  return s + " ranks)";
}

size_t last_level_cache_bytes() {
  static const size_t bytes = [] {
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return size_t(0);
    // Caches only: the whole topology takes several times as long to load.
    hwloc_topology_set_all_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_NONE);
    hwloc_topology_set_cache_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL);
    size_t last = 0;
    if (hwloc_topology_load(topo) == 0) {
      for (int t = HWLOC_OBJ_L1CACHE; t <= HWLOC_OBJ_L5CACHE; ++t) {
        if (hwloc_obj_t c = hwloc_get_obj_by_type(topo, hwloc_obj_type_t(t), 0)) last = size_t(c->attr->cache.size);
      }
    }
    hwloc_topology_destroy(topo);
    return last;
  }();
  return bytes;
}

bool cpu_is_amd() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // may run before the library's constructors
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

}  // namespace tandem
