#include "elastic.h"

#include <algorithm>
#include <map>

namespace tandem::launch {

long Elastic::workers_running(const std::vector<Rank>& ranks) const {
  return std::count_if(ranks.begin(), ranks.end(), [&](const Rank& r) { return is_worker(r) && r.running; });
}

bool Elastic::others_finished(const std::vector<Rank>& ranks, const Rank* except, bool but_replacements,
                              const RecordedFailed& failed) const {
  return std::all_of(ranks.begin(), ranks.end(), [&](const Rank& r) {
    return !is_worker(r) || &r == except || (but_replacements && is_replacement(r)) || (!r.running && r.status == 0) ||
           failed(r.rank);
  });
}

bool Elastic::only_replacements_running(const std::vector<Rank>& ranks) const {
  return std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; }) &&
         std::none_of(ranks.begin(), ranks.end(), [&](const Rank& r) { return r.running && !is_replacement(r); });
}

const Placement& Elastic::placement_of(int number, const std::vector<Placement>& first) const {
  return size_t(number) < first.size() ? first[size_t(number)] : later_[size_t(number) - first.size()].at;
}

Elastic::Started& Elastic::start_next(int slot, Placement at) {
  const int number = opts_.nprocs + opts_.servers + int(later_.size());
  later_.push_back({number, slot < 0 ? number : slot, std::move(at)});
  return later_.back();
}

std::optional<Elastic::Started> Elastic::replace(const Rank& lost, const std::vector<Placement>& first) {
  if (restarts_ >= opts_.max_restarts) return std::nullopt;
  ++restarts_;
  const int slot = lost.rank < opts_.nprocs ? lost.rank : later_[size_t(lost.rank) - first.size()].slot;
  return start_next(slot, placement_of(lost.rank, first));
}

int Elastic::node_of(const std::string& host) {
  for (size_t i = 0; i < opts_.hosts.size(); ++i)
    if (placement_host(opts_.hosts[i].host) == host) return int(i);
  auto it = std::find(other_hosts_.begin(), other_hosts_.end(), host);
  if (it == other_hosts_.end()) it = other_hosts_.insert(it, host);
  return int(opts_.hosts.size() + size_t(it - other_hosts_.begin()));
}

std::vector<Elastic::Started> Elastic::add_offered(const std::vector<HostSlots>& offered,
                                                   const std::vector<Rank>& ranks, const std::vector<Placement>& first,
                                                   bool remote_ok, std::vector<std::string>& refused) {
  // A worker that finished means the job is ending: nobody would admit a new one.
  if (std::any_of(ranks.begin(), ranks.end(),
                  [&](const Rank& r) { return is_worker(r) && !r.running && r.pid > 0 && r.status == 0; }))
    return {};
  int room = std::min<int>(opts_.elastic_max - int(workers_running(ranks)), most_added() - added_);
  std::map<std::string, int> running_on;  // by host ("": this one)
  for (const Rank& r : ranks)
    if (is_worker(r) && r.running) ++running_on[placement_of(r.rank, first).host];
  std::vector<Started> out;
  for (const HostSlots& h : offered) {
    const std::string host = placement_host(h.host);
    int& here = running_on[host];
    if (room <= 0 || here >= h.slots) continue;
    if (!host.empty() && !remote_ok) {
      refused.push_back(h.host);
      continue;
    }
    for (; here < h.slots && room > 0; --room, ++added_) {
      out.push_back(start_next(-1, Placement{host, node_of(host), here++, h.slots}));
    }
  }
  return out;
}

std::vector<Rank*> Elastic::waiting_in_vain(std::vector<Rank>& ranks, const RecordedFailed& failed,
                                            Clock::time_point now) {
  const auto waiting = [&](const Rank& r) { return is_replacement(r) && r.running && !r.signalled_by_us; };
  if (!std::any_of(ranks.begin(), ranks.end(), waiting) || !others_finished(ranks, nullptr, true, failed)) {
    others_done_at_.reset();
    return {};
  }
  if (!others_done_at_) others_done_at_ = now;
  if (now - *others_done_at_ < std::chrono::duration<double>(opts_.kill_after_seconds)) return {};
  std::vector<Rank*> out;
  for (Rank& r : ranks) {
    if (waiting(r)) out.push_back(&r);
  }
  return out;
}

}  // namespace tandem::launch
