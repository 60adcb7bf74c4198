// PNG plots through gnuplot, for the bench tools.
#pragma once

#include <string>

namespace tandem::bench {

// `text` as a gnuplot string: single-quoted, a quote inside doubled.
std::string gnuplot_quoted(const std::string& text);

// Writes `png` by running gnuplot (no shell in between) on a script file made
// of a pngcairo header and `body`; `body` names the data as DATA_FILE, so any
// path works, quotes included. Removes the script and `data_file` afterwards.
// Says on stderr whether it worked; returns that.
bool run_gnuplot(const std::string& png, const std::string& data_file, const std::string& body);

}  // namespace tandem::bench
