// PNG plots through gnuplot, for the bench tools and tandem train.
#pragma once

#include <string>

namespace tandem::bench {

// `text` as a gnuplot string: single-quoted, a quote inside doubled.
std::string gnuplot_quoted(const std::string& text);

// Runs gnuplot on `script` (from a temporary file: no shell in between, so
// paths the script quotes with gnuplot_quoted may hold any character), its
// messages on stdout; "" when it succeeded, else what went wrong.
std::string run_gnuplot_script(const std::string& script);

// Writes `png` by running gnuplot on a pngcairo header and `body`; `body`
// names the data as DATA_FILE. Removes `data_file` afterwards. Says on stderr
// whether it worked; returns that.
bool run_gnuplot(const std::string& png, const std::string& data_file, const std::string& body);

}  // namespace tandem::bench
