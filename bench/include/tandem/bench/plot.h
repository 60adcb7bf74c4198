// PNG plots through gnuplot, for the bench tools.
#pragma once

#include <string>

namespace tandem::bench {

// Writes `png` by running gnuplot on a script file (not -e: no shell quoting in
// between) made of a pngcairo header and `body`; removes the script and
// `data_file` afterwards. Says on stderr whether it worked; returns that.
bool run_gnuplot(const std::string& png, const std::string& data_file, const std::string& body);

}  // namespace tandem::bench
