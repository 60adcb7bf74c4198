#include "elastic.h"

#include <algorithm>

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

std::optional<Elastic::Replacement> Elastic::replace(const Rank& lost) {
  if (restarts_ >= opts_.max_restarts) return std::nullopt;
  const int number = opts_.nprocs + opts_.servers + restarts_++;
  const int slot = lost.rank < opts_.nprocs ? lost.rank : slot_of_[size_t(lost.rank)];
  slot_of_.resize(size_t(number + 1), 0);
  slot_of_[size_t(number)] = slot;
  return Replacement{number, slot};
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
