// Membership after a failure: shrink(). The survivors revoke the
// communicator, then agree through the store. Each writes that it arrived
// (with the ranks it excludes); the first to arrive, by an atomic add, waits
// until every rank has arrived or is recorded as failed and writes the one
// decision; every rank reads it. The store orders the writes, so there is one
// decision however the ranks interleave; a decider that fails before it
// decides is replaced (agree()). A rank the decision leaves out —
// recorded failed (a stopped rank that woke), excluded, or late — is fenced:
// it holds no keys of the new communicator and its calls on the old one fail.
#include <algorithm>
#include <set>
#include <string>
#include <thread>

#include "communicator_impl.h"
#include "decision.h"

namespace tandem {
namespace {

std::set<int> parse_ranks(const std::optional<std::string>& csv) {
  if (!csv) return {};
  const std::vector<int> ranks = parse_rank_list(*csv);
  return {ranks.begin(), ranks.end()};
}

template <typename Ranks>
std::string to_csv(const Ranks& ranks) {
  return format_rank_list(std::vector<int>(ranks.begin(), ranks.end()));
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

// Rounds of deciding: the first rank to a round (an atomic add) is its
// decider and says so; the others wait for the decision, and go to the next
// round when this round's decider is recorded as failed. The store refuses a
// failed process's writes, so a decider that was stopped and wakes cannot
// write a second decision; the next round's decider writes only if none was
// written before that decider's failure was recorded.
std::string agree(KeyValueStore& store, const std::string& base, int size, int me, Clock::time_point give_up,
                  Deadline deadline, const std::string& name) {
  for (int round = 1;; ++round) {
    const std::string here = base + "/round/" + std::to_string(round);
    if (store.add(here + "/deciders", 1, deadline) == 1) {
      store.set(here + "/decider", std::to_string(me), deadline);
      const std::string decision = decide(store, base, size, give_up, deadline);
      if (!store.try_get(base + "/decision", deadline)) store.set(base + "/decision", decision, deadline);
      return store.get(base + "/decision", deadline);
    }
    // Nothing: a decider that failed before it decided; the next round.
    if (auto decision = await_decision(store, base + "/decision", here + "/decider", deadline, name)) return *decision;
  }
}

// Why this rank is out of the decision (a woken stopped rank finds its writes refused).
[[noreturn]] void left_out(int me, int n, const std::string& name, const std::set<int>& kept) {
  throw Excluded("rank " + std::to_string(me) + " was left out of " + name + " (members " + to_csv(kept) + " of " +
                 std::to_string(n) +
                 "): it was recorded as failed or excluded by a survivor, or came after the decision; its calls "
                 "on this communicator fail, and it must not rejoin but as a new process");
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
    try {
      store->set(base + "/arrived/" + std::to_string(me), to_csv(exclude), deadline);
      // Past three quarters of the timeout a decider goes on without a silent
      // rank that is not recorded failed, so that the decision reaches the others within theirs.
      decision = agree(*store, base, n, me, deadline - timeout / 4, deadline, name);
    } catch (const Excluded&) {  // recorded as failed: the store refuses this process's writes
      const std::optional<std::string> made = store->try_get(base + "/decision", deadline);
      if (made && made->rfind("members:", 0) == 0) left_out(me, n, name, parse_ranks(made->substr(8)));
      throw;
    }
  }
  if (decision.rfind("none:", 0) == 0) throw Excluded(name + " found " + decision.substr(5));
  const std::set<int> kept = parse_ranks(decision.substr(decision.find(':') + 1));
  if (!kept.count(me)) left_out(me, n, name, kept);
  Shrunk result;
  result.members.assign(kept.begin(), kept.end());
  result.comm = over_members(result.members, base);
  return result;
}

}  // namespace tandem

namespace tandem {

std::optional<std::string> await_decision(KeyValueStore& store, const std::string& decision_key,
                                          const std::string& decider_key, Deadline deadline, const std::string& what) {
  for (;;) {
    if (auto decision = store.try_get(decision_key, deadline)) return decision;
    const std::optional<std::string> decider = store.try_get(decider_key, deadline);
    if (decider && parse_ranks(store.try_get(kFailedRanksKey, deadline)).count(std::atoi(decider->c_str()))) {
      return store.try_get(decision_key, deadline);  // written before the failure was recorded, or never
    }
    if (Clock::now() >= deadline) {
      throw Timeout(what + ": no decision within the timeout (rank " + (decider ? *decider : "?") +
                    " was deciding and is not recorded as failed)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace tandem
