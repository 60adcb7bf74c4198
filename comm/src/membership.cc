// Membership after a failure: shrink(). The survivors revoke the
// communicator, then agree through the store. Each writes that it arrived
// (with the ranks it excludes); the first to arrive, by an atomic add, waits
// until every rank has arrived or is recorded as failed and writes the one
// decision; every rank reads it. The store orders the writes, so there is one
// decision however the ranks interleave. A rank the decision leaves out —
// recorded failed (a stopped rank that woke), excluded, or late — is fenced:
// it holds no keys of the new communicator and its calls on the old one fail.
#include <algorithm>
#include <set>
#include <string>
#include <thread>

#include "communicator_impl.h"

namespace tandem {
namespace {

std::set<int> parse_ranks(const std::optional<std::string>& csv) {
  if (!csv) return {};
  const std::vector<int> ranks = parse_rank_list(*csv);
  return {ranks.begin(), ranks.end()};
}

template <typename Ranks>
std::string to_csv(const Ranks& ranks) {
  std::string out;
  for (int r : ranks) {
    if (!out.empty()) out += ',';
    out += std::to_string(r);
  }
  return out;
}

// The decision: "members:0,2,3" or "none:<why>". Waits until every rank has
// arrived or is out (recorded failed, excluded by one that arrived), or until
// `give_up`; the store's reads may take until `deadline`.
std::string decide(KeyValueStore& store, const std::string& base, int size, Clock::time_point give_up,
                   Deadline deadline) {
  std::set<int> out, arrived;
  for (;;) {
    out = parse_ranks(store.try_get(kFailedRanksKey, deadline));
    arrived.clear();
    for (int r = 0; r < size; ++r) {
      if (auto excluded = store.try_get(base + "/arrived/" + std::to_string(r), deadline)) {
        arrived.insert(r);
        for (int x : parse_ranks(excluded)) out.insert(x);
      }
    }
    bool settled = true;
    for (int r = 0; r < size; ++r) settled = settled && (out.count(r) || arrived.count(r));
    if (settled || Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<int> members;
  for (int r : arrived) {
    if (!out.count(r)) members.push_back(r);
  }
  if (2 * members.size() <= size_t(size)) {
    return "none:no majority: ranks " + to_csv(members) + " are " + std::to_string(members.size()) + " of " +
           std::to_string(size) +
           " (a majority is needed so that the other side of a partition cannot go on as well); out: " + to_csv(out);
  }
  return "members:" + to_csv(members);
}

}  // namespace

Communicator::Shrunk Communicator::shrink(const std::vector<int>& exclude, const CollectiveOptions& opts) {
  const int n = size(), me = rank();
  for (int r : exclude) {
    if (r < 0 || r >= n) {
      throw InvalidArgument("shrink: excluded rank " + std::to_string(r) + " is out of range for world size " +
                            std::to_string(n));
    }
  }
  if (!revoked()) revoke("shrinking after a failure");
  CommContext& ctx = impl_->ctx;
  const uint64_t number = ++impl_->shrinks;  // the same on every survivor: each shrinks after each failure
  const std::string name = "shrink #" + std::to_string(number);
  const std::string base = ctx.key("shrink/" + std::to_string(number));
  const auto timeout = opts.timeout.value_or(ctx.opts.timeout);
  const Deadline deadline = Clock::now() + timeout;

  std::string decision = "members:0";
  if (n > 1) {
    std::unique_ptr<KeyValueStore> store = ctx.store->connect_again(deadline);
    store->set(base + "/arrived/" + std::to_string(me), to_csv(exclude), deadline);
    if (store->add(base + "/deciders", 1, deadline) == 1) {
      // Past three quarters of the timeout it goes on without a silent rank
      // that is not recorded failed, so that the decision reaches the others within theirs.
      store->set(base + "/decision", decide(*store, base, n, deadline - timeout / 4, deadline), deadline);
    }
    decision = store->get(base + "/decision", deadline);
  }
  if (decision.rfind("none:", 0) == 0) throw Excluded(name + " found " + decision.substr(5));
  const std::set<int> kept = parse_ranks(decision.substr(decision.find(':') + 1));
  if (!kept.count(me)) {
    throw Excluded("rank " + std::to_string(me) + " was left out of " + name + " (members " + to_csv(kept) + " of " +
                   std::to_string(n) +
                   "): it was recorded as failed or excluded by a survivor, or came after the decision; its calls "
                   "on this communicator fail, and it must not rejoin but as a new process");
  }
  Shrunk result;
  result.members.assign(kept.begin(), kept.end());
  result.comm = over_members(result.members, base);
  return result;
}

}  // namespace tandem
