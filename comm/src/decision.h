// Waiting for a decision one rank writes to the store (shrink's members,
// grow's): until it is there, or the store records the deciding rank as
// failed before it wrote one.
#pragma once

#include <optional>
#include <string>

#include "tandem/store.h"
#include "tandem/types.h"

namespace tandem {

// The value of `decision_key`, or nothing when the rank named under
// `decider_key` is recorded as failed and no decision was written before
// that (the store refuses a failed process's writes: none can come later).
// Throws Timeout at the deadline, naming `what`.
std::optional<std::string> await_decision(KeyValueStore& store, const std::string& decision_key,
                                          const std::string& decider_key, Deadline deadline, const std::string& what);

}  // namespace tandem
