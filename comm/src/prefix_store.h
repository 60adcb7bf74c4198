// A communicator's view of the job's store: keys under a prefix of its own,
// over the job's (root) store, for a communicator over some of the job's
// processes (split, shrink, grow). It names each of its ranks by the root
// rank it has in the job (its process's rank in the first communicator, or a
// joiner's number), so that what the root store knows of a process counts
// here too, renumbered: a process it records as failed (its connection
// dropped, its heartbeat stopped, a launcher's report) is this communicator's
// failed rank, with its reason. Registering (hello, heartbeat, goodbye) goes
// to the root store as the root rank, so its liveness watch covers this
// communicator's ranks as the first communicator's.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tandem/store.h"

namespace tandem {

class PrefixStore final : public KeyValueStore {
 public:
  // `root_ranks[r]`: the root rank of this communicator's rank r (-1: none).
  PrefixStore(std::unique_ptr<KeyValueStore> root, std::string prefix, std::vector<int> root_ranks);

  // The view of a communicator over `ranks` of the one whose store is
  // `store` (a PrefixStore or the root itself), under `prefix` within it;
  // `extra` root ranks follow (joiners). Connects again to the root.
  static std::unique_ptr<PrefixStore> within(KeyValueStore& store, const std::string& prefix,
                                             const std::vector<int>& ranks, const std::vector<int>& extra,
                                             Deadline deadline);
  // Another connection to the root store under `store`.
  static std::unique_ptr<KeyValueStore> root_of(KeyValueStore& store, Deadline deadline);
  // The root rank of `store`'s rank r (r itself for the root store, -1 if none).
  static int root_rank_of(KeyValueStore& store, int rank);
  // Where `store`'s keys lie in the root store ("" for the root itself).
  static std::string raw_prefix_of(KeyValueStore& store);

  void set(const std::string& key, const std::string& value, Deadline d) override;
  std::string get(const std::string& key, Deadline d) override;
  std::optional<std::string> try_get(const std::string& key, Deadline d) override;
  int64_t add(const std::string& key, int64_t delta, Deadline d) override;
  void wait(const std::vector<std::string>& keys, Deadline d) override;
  bool check(const std::vector<std::string>& keys, Deadline d) override;
  void erase(const std::string& key, Deadline d) override;
  std::unique_ptr<KeyValueStore> connect_again(Deadline d) override;
  // A rank without a root rank cannot register: then the ranks watch each other (peer_watch.h).
  bool tracks_liveness() const override;
  void hello(int rank, Deadline d) override;
  void goodbye(Deadline d) override { root_->goodbye(d); }
  void heartbeat(int rank, std::chrono::milliseconds interval, Deadline d) override;

 private:
  std::optional<std::string> failed_ranks(Deadline d);
  int root_rank(int rank) const {
    return rank >= 0 && size_t(rank) < root_ranks_.size() ? root_ranks_[size_t(rank)] : -1;
  }
  std::string k(const std::string& key) const { return prefix_ + key; }

  std::unique_ptr<KeyValueStore> root_;
  std::string prefix_;  // ends in '/'
  std::vector<int> root_ranks_;
};

}  // namespace tandem
