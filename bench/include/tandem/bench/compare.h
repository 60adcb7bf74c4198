// `tandem bench --compare A.json B.json`: two runs' JSON rows (-J or
// --format json) side by side, size by size, with whether they differ beyond
// their own spread (docs/bench.md has the rule).
#pragma once

#include <ostream>
#include <string>

namespace tandem::bench {

// Prints the comparison table; returns 0. Throws InvalidArgument naming the
// file and line when a file cannot be read or holds no usable rows.
int run_compare(const std::string& a_path, const std::string& b_path, std::ostream& out);

}  // namespace tandem::bench
