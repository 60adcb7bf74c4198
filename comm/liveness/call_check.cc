// CallCheck: the start-up check of builds, and mismatches published through the store.
#include "liveness/call_check.h"

#include <cstdlib>
#include <string_view>
#include <thread>

#include "src/subsystem_log.h"

#ifndef TANDEM_BUILD_ID
#define TANDEM_BUILD_ID "unknown"
#endif

namespace tandem {
namespace {

// A mismatch another rank published, as this rank reports it.
CollectiveMismatch learned_mismatch(const std::string& found, int rank, const std::string& during) {
  return CollectiveMismatch(found + " (rank " + std::to_string(rank) + " learned it during " + during + ")");
}

// The call a published mismatch names ("call #N: ..."); 0 when it names none.
uint32_t call_named(const std::string& found) {
  constexpr std::string_view kPrefix = "call #";
  if (found.compare(0, kPrefix.size(), kPrefix) != 0) return 0;
  return uint32_t(std::strtoul(found.c_str() + kPrefix.size(), nullptr, 10));
}

}  // namespace

// Every rank waits for rank 0's verdict, so a mismatch fails them all as soon
// as the odd rank has announced itself, naming both values.
void CallCheck::check_versions(Deadline deadline) {
  const CommOptions& opts = ctx_.opts;
  KeyValueStore& store = *ctx_.store;
  const std::string mine = "protocol " + std::to_string(kWireProtocol) + ", build " + TANDEM_BUILD_ID +
                           ", world size " + std::to_string(opts.size) + ", job " +
                           (opts.job_id.empty() ? "(none)" : opts.job_id);
  store.set(ctx_.key("version/" + std::to_string(opts.rank)), mine, deadline);
  const std::string verdict_key = ctx_.key("version/verdict");
  if (opts.rank == 0) {
    std::string verdict = "ok";
    for (int p = 1; p < opts.size && verdict == "ok"; ++p) {
      std::string theirs;
      try {
        theirs = store.get(ctx_.key("version/" + std::to_string(p)), deadline);
      } catch (const Timeout& e) {
        throw Timeout("rendezvous: rank " + std::to_string(p) + " never arrived within the connect timeout (" +
                      std::to_string(opts.connect_timeout.count()) +
                      " ms): it did not start, failed before connecting, or uses another store address or job "
                      "(TANDEM_STORE_ADDR, TANDEM_JOB_ID); raise TANDEM_CONNECT_TIMEOUT_MS if ranks start slowly (" +
                      e.what() + ")");
      }
      if (theirs != mine) {
        verdict = "ranks disagree at start-up: rank 0 has " + mine + "; rank " + std::to_string(p) + " has " + theirs +
                  "; every rank must run the same tandem build, in the same job, with the same world size";
      }
    }
    store.set(verdict_key, verdict, deadline);
    if (verdict != "ok") throw InvalidArgument(verdict);
    return;
  }
  std::string verdict;
  try {
    verdict = store.get(verdict_key, deadline);
  } catch (const Timeout& e) {
    throw Timeout("rendezvous: rank 0 did not finish the start-up check within the connect timeout (" +
                  std::to_string(opts.connect_timeout.count()) +
                  " ms): rank 0 or another rank never arrived; raise TANDEM_CONNECT_TIMEOUT_MS if ranks start "
                  "slowly (" +
                  e.what() + ")");
  }
  if (verdict != "ok") throw InvalidArgument(verdict);
}

void CallCheck::publish_mismatch(const std::string& text) {
  if (!ctx_.store) return;
  try {
    const Deadline until = Clock::now() + std::chrono::milliseconds(500);
    // The first finding stays.
    if (!ctx_.store->try_get(ctx_.key(kMismatchKey), until)) ctx_.store->set(ctx_.key(kMismatchKey), text, until);
  } catch (const Error& e) {
    subsystem_log(Subsystem::liveness)
        .debug("tandem rank {}: could not publish the mismatch: {}", ctx_.rank(), e.what());
  }
}

// A rank that found a mismatch publishes it, throws and may exit before this
// rank polls the store: its departure is the mismatch's doing, so a transport
// error or a failed-rank entry names the mismatch when one is published.
void CallCheck::throw_published_mismatch(const Description& what, uint32_t seq, int waiting_on) {
  if (!ctx_.store) return;
  std::optional<std::string> mismatch;
  try {
    mismatch = ctx_.store->try_get(ctx_.key(kMismatchKey), Clock::now() + std::chrono::milliseconds(500));
  } catch (const Error&) {
    return;  // the store may be going away too: the caller names the failure
  }
  if (mismatch) throw learned_mismatch(*mismatch, ctx_.rank(), describe_wait(what, seq, ctx_.rank(), waiting_on));
}

// What other ranks found out about this call: a mismatch, or a rank that
// left the communicator after the previous call (it skipped this one).
void CallCheck::check_calls_match(const Description& what, uint32_t seq, int waiting_on, Deadline until) {
  KeyValueStore& store = *ctx_.store;
  std::optional<std::string> mismatch, left, abandoned;
  try {
    mismatch = store.try_get(ctx_.key(kMismatchKey), until);
    // An exchange has no call numbers: a peer that gave up after an error is all it can learn.
    if (what.point_to_point()) abandoned = store.try_get(ctx_.key(kAbandonedKey), until);
    if (seq > 1 && !what.point_to_point()) left = store.try_get(ctx_.key("left/" + std::to_string(seq - 1)), until);
  } catch (const Timeout&) {
    return;  // a slow store: ask again at the next poll
  } catch (const PeerFailure& e) {
    ctx_.throw_store_lost(e);
  }
  const std::string during = describe_wait(what, seq, ctx_.rank(), waiting_on);
  // A rank still in an earlier collective can finish it (the peers that found
  // the mismatch finished it before): it fails in the mismatched call.
  if (mismatch && (what.point_to_point() || call_named(*mismatch) <= seq))
    throw learned_mismatch(*mismatch, ctx_.rank(), during);
  if (abandoned) {
    throw PeerFailure(std::atoi(abandoned->c_str()),
                      "rank " + *abandoned + " left the communicator after an error or abort(), during " + during);
  }
  if (left) {
    throw CollectiveMismatch("rank " + *left + " skipped call #" + std::to_string(seq) +
                             ": it destroyed its communicator after call #" + std::to_string(seq - 1) + ", while " +
                             during + "; every rank must issue the same collectives in the same order");
  }
}

void CallCheck::explain_mismatch() {
  if (!ctx_.store) return;
  const Deadline until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until) {
    std::optional<std::string> found;
    try {
      found = ctx_.store->try_get(ctx_.key(kMismatchKey), until);
    } catch (const Error&) {
      return;
    }
    if (found)
      throw CollectiveMismatch(*found + " (rank " + std::to_string(ctx_.rank()) + " learned it from the store)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace tandem
