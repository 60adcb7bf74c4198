#include "prefix_store.h"

#include <algorithm>
#include <cstdlib>

namespace tandem {
namespace {

const std::string& reason_prefix() {
  static const std::string p = failure_reason_key(0).substr(0, failure_reason_key(0).size() - 1);
  return p;
}

}  // namespace

PrefixStore::PrefixStore(std::unique_ptr<KeyValueStore> root, std::string prefix, std::vector<int> root_ranks)
    : root_(std::move(root)), prefix_(std::move(prefix) + "/"), root_ranks_(std::move(root_ranks)) {}

std::unique_ptr<PrefixStore> PrefixStore::within(KeyValueStore& store, const std::string& prefix,
                                                 const std::vector<int>& ranks, const std::vector<int>& extra,
                                                 Deadline deadline) {
  std::vector<int> root_ranks;
  for (int r : ranks) root_ranks.push_back(root_rank_of(store, r));
  root_ranks.insert(root_ranks.end(), extra.begin(), extra.end());
  return std::make_unique<PrefixStore>(root_of(store, deadline), raw_prefix_of(store) + prefix, std::move(root_ranks));
}

std::unique_ptr<KeyValueStore> PrefixStore::root_of(KeyValueStore& store, Deadline deadline) {
  auto* view = dynamic_cast<PrefixStore*>(&store);
  return view ? view->root_->connect_again(deadline) : store.connect_again(deadline);
}

bool PrefixStore::tracks_liveness() const {
  return root_->tracks_liveness() && std::find(root_ranks_.begin(), root_ranks_.end(), -1) == root_ranks_.end();
}

int PrefixStore::root_rank_of(KeyValueStore& store, int rank) {
  auto* view = dynamic_cast<PrefixStore*>(&store);
  return view ? view->root_rank(rank) : rank;
}

std::string PrefixStore::raw_prefix_of(KeyValueStore& store) {
  auto* view = dynamic_cast<PrefixStore*>(&store);
  return view ? view->prefix_ : "";
}

void PrefixStore::set(const std::string& key, const std::string& value, Deadline d) { root_->set(k(key), value, d); }
std::string PrefixStore::get(const std::string& key, Deadline d) { return root_->get(k(key), d); }
int64_t PrefixStore::add(const std::string& key, int64_t delta, Deadline d) { return root_->add(k(key), delta, d); }
void PrefixStore::erase(const std::string& key, Deadline d) { root_->erase(k(key), d); }

void PrefixStore::wait(const std::vector<std::string>& keys, Deadline d) {
  std::vector<std::string> raw;
  for (const auto& key : keys) raw.push_back(k(key));
  root_->wait(raw, d);
}

bool PrefixStore::check(const std::vector<std::string>& keys, Deadline d) {
  std::vector<std::string> raw;
  for (const auto& key : keys) raw.push_back(k(key));
  return root_->check(raw, d);
}

std::optional<std::string> PrefixStore::try_get(const std::string& key, Deadline d) {
  if (key == kFailedRanksKey) return failed_ranks(d);
  std::optional<std::string> value = root_->try_get(k(key), d);
  if (value || key.rfind(reason_prefix(), 0) != 0) return value;
  const int root = root_rank(std::atoi(key.c_str() + reason_prefix().size()));
  return root >= 0 ? root_->try_get(failure_reason_key(root), d) : std::nullopt;
}

std::unique_ptr<KeyValueStore> PrefixStore::connect_again(Deadline d) {
  return std::make_unique<PrefixStore>(root_->connect_again(d), prefix_.substr(0, prefix_.size() - 1), root_ranks_);
}

// Registering as a rank that has no root rank (a joiner started by hand) is left to the peer watch.
void PrefixStore::hello(int rank, Deadline d) {
  if (root_rank(rank) >= 0) root_->hello(root_rank(rank), d);
}

void PrefixStore::heartbeat(int rank, std::chrono::milliseconds interval, Deadline d) {
  if (root_rank(rank) >= 0) root_->heartbeat(root_rank(rank), interval, d);
}

// The ranks recorded here (by a peer watch), then the root's failed processes that are members, renumbered.
std::optional<std::string> PrefixStore::failed_ranks(Deadline d) {
  std::optional<std::string> list = root_->try_get(k(kFailedRanksKey), d);
  const std::optional<std::string> root = root_->try_get(kFailedRanksKey, d);
  if (!root) return list;
  for (int failed : parse_rank_list(*root)) {
    const auto member = std::find(root_ranks_.begin(), root_ranks_.end(), failed);
    if (member == root_ranks_.end()) continue;
    const std::string renumbered = std::to_string(member - root_ranks_.begin());
    list = list && !list->empty() ? *list + "," + renumbered : renumbered;
  }
  return list;
}

}  // namespace tandem
