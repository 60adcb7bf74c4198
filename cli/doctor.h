// `tandem doctor DUMP...`: reads the flight-recorder dumps of a job's ranks
// (comm/src/flight_recorder.h) and says where they part ways.
//
// Terms: the *window* is the calls every dump still holds (a recorder keeps
// its last N); within it, the *first divergence* is the lowest sequence
// number where some rank never entered the call while others did, or where
// the ranks' calls differ (kind, dtype, op, count, root). Failing that, the
// first call some rank did not complete is reported.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace tandem::cli {

// Writes the diagnosis to `out`. Returns 0 if the dumps agree, 1 if they
// diverge or a call did not complete everywhere, 2 if a dump cannot be read.
int run_doctor(const std::vector<std::string>& paths, std::ostream& out);

}  // namespace tandem::cli
