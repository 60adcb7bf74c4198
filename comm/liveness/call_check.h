// CallCheck: what ranks learn about each other's calls through the store.
// At start-up every rank runs the same build, job and world size
// (check_versions); later a rank that finds a mismatched call publishes it,
// so that every rank fails in that call, and a rank that left after call N
// makes call N + 1 a mismatch. (Fingerprints themselves travel between ring
// neighbours inside each call: engine_channel.h.)
#pragma once

#include <cstdint>
#include <string>

#include "call_description.h"
#include "comm_context.h"

namespace tandem {

class CallCheck {
 public:
  explicit CallCheck(CommContext& ctx) : ctx_(ctx) {}

  // Where, under the communicator's prefix, the first mismatch found is
  // published, and the first rank that gave up after an error names itself.
  static constexpr const char* kMismatchKey = "mismatch";
  static constexpr const char* kAbandonedKey = "abandoned";

  // Rank 0 compares every rank's (protocol, build, world size, job) with its
  // own and publishes the verdict; a disagreement fails every rank, naming both.
  void check_versions(Deadline deadline);

  // A mismatch found by this rank, published so that every rank fails in that call.
  void publish_mismatch(const std::string& text);
  // Throws the mismatch another rank published, if any (it explains a peer's exit).
  void throw_published_mismatch(const Description& what, uint32_t seq, int waiting_on);
  // Throws what other ranks found out about this call: a mismatch, a rank
  // that left after the previous call, or (point-to-point) one that gave up.
  void check_calls_match(const Description& what, uint32_t seq, int waiting_on, Deadline until);
  // Throws the mismatch another rank published, waiting up to a second for it.
  void explain_mismatch();

 private:
  CommContext& ctx_;
};

}  // namespace tandem
