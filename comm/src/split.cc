// Sub-communicators: split(color, key) and duplicate(). The ranks agree on
// colours and keys through an allgather on this communicator; each new
// communicator then wires up through this one's store under a prefix of its
// own (no new port), with its own UCX worker, shared memory among its ranks
// on a host, and liveness watched among its own ranks, plus the store's
// record of failed ranks renumbered (see PrefixStore).
// over_members() is that last step, for shrink() too (membership.cc).
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "communicator_impl.h"

namespace tandem {
namespace {

// Another store's keys under "<prefix>/", for a communicator over `members`
// (ranks of the store's communicator, in the new order). It does not track
// liveness: the new communicator's ranks watch each other through its keys
// (peer_watch.h). The failures the store records for its own communicator (a
// process that died, a launcher's report) count too, renumbered, so that a
// dead member is named within a failure poll here as there.
class PrefixStore final : public KeyValueStore {
 public:
  PrefixStore(std::unique_ptr<KeyValueStore> store, std::string prefix, std::vector<int> members)
      : store_(std::move(store)), prefix_(std::move(prefix) + "/"), members_(std::move(members)) {}

  void set(const std::string& key, const std::string& value, Deadline d) override { store_->set(k(key), value, d); }
  std::string get(const std::string& key, Deadline d) override { return store_->get(k(key), d); }
  std::optional<std::string> try_get(const std::string& key, Deadline d) override {
    if (key == kFailedRanksKey) return failed_ranks(d);
    std::optional<std::string> value = store_->try_get(k(key), d);
    if (value || key.rfind(kReasonPrefix, 0) != 0) return value;
    const size_t rank = std::strtoul(key.c_str() + kReasonPrefix.size(), nullptr, 10);
    return rank < members_.size() ? store_->try_get(failure_reason_key(members_[rank]), d) : std::nullopt;
  }
  int64_t add(const std::string& key, int64_t delta, Deadline d) override { return store_->add(k(key), delta, d); }
  void wait(const std::vector<std::string>& keys, Deadline d) override { store_->wait(ks(keys), d); }
  bool check(const std::vector<std::string>& keys, Deadline d) override { return store_->check(ks(keys), d); }
  void erase(const std::string& key, Deadline d) override { store_->erase(k(key), d); }
  std::unique_ptr<KeyValueStore> connect_again(Deadline d) override {
    return std::make_unique<PrefixStore>(store_->connect_again(d), prefix_.substr(0, prefix_.size() - 1), members_);
  }

 private:
  inline static const std::string kReasonPrefix = failure_reason_key(0).substr(0, failure_reason_key(0).size() - 1);

  // The ranks recorded here, then the store's communicator's failed members, renumbered.
  std::optional<std::string> failed_ranks(Deadline d) {
    std::optional<std::string> list = store_->try_get(k(kFailedRanksKey), d);
    const std::optional<std::string> outer = store_->try_get(kFailedRanksKey, d);
    for (size_t at = 0; outer && at < outer->size();) {
      const size_t comma = std::min(outer->find(',', at), outer->size());
      const int rank = std::atoi(outer->substr(at, comma - at).c_str());
      at = comma + 1;
      const auto member = std::find(members_.begin(), members_.end(), rank);
      if (member == members_.end()) continue;
      const std::string renumbered = std::to_string(member - members_.begin());
      list = list && !list->empty() ? *list + "," + renumbered : renumbered;
    }
    return list;
  }
  std::string k(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> ks(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& key : keys) out.push_back(k(key));
    return out;
  }
  std::unique_ptr<KeyValueStore> store_;
  std::string prefix_;
  std::vector<int> members_;
};

}  // namespace

std::unique_ptr<Communicator> Communicator::split(int color, int key, const CollectiveOptions& opts) {
  if (color < kUndefinedColor) {
    throw InvalidArgument("split: color " + std::to_string(color) +
                          " must be >= 0, or kUndefinedColor (-1) to join none");
  }
  // Every rank's (color, key), through an allgather named split in fingerprints and errors.
  const int n = size();
  std::vector<int64_t> mine{color, key}, all(size_t(2 * n));
  AllgatherArgs args{mine.data(), all.data(), 2, DataType::i64, MemoryType::host};
  impl_->engine.submit(false, [a = impl_->algorithms, args](Channel& ch) { a->allgather(ch, args); }, opts,
                       {Collective::split, 2, DataType::i64, std::nullopt});
  const uint64_t number = ++impl_->splits;  // the same on every rank: splits are collective
  if (color == kUndefinedColor) return nullptr;

  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[size_t(2 * r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[size_t(2 * a + 1)] < all[size_t(2 * b + 1)]; });

  return over_members(members,
                      impl_->ctx.opts.prefix + "/split/" + std::to_string(number) + "/" + std::to_string(color));
}

std::unique_ptr<Communicator> Communicator::over_members(const std::vector<int>& members, const std::string& prefix) {
  CommOptions o = impl_->ctx.opts;
  o.size = int(members.size());
  o.rank = int(std::find(members.begin(), members.end(), rank()) - members.begin());
  const Topology& t = impl_->endpoints.topology;
  o.local_rank = o.local_size = 0;
  for (int r : members) {
    if (t.host_of[size_t(r)] != t.host()) continue;
    if (r < rank()) ++o.local_rank;
    ++o.local_size;
  }
  o.host_store = false;
  o.store.reset();
  if (o.size > 1) {
    const Deadline deadline = Clock::now() + impl_->ctx.opts.connect_timeout;
    o.store = std::make_shared<PrefixStore>(impl_->ctx.store->connect_again(deadline), prefix, members);
  }
  return Communicator::create(o, impl_->algorithms);
}

std::unique_ptr<Communicator> Communicator::duplicate(const CollectiveOptions& opts) { return split(0, rank(), opts); }

}  // namespace tandem
