#include "tandem/bench/plot.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace tandem::bench {

bool run_gnuplot(const std::string& png, const std::string& data_file, const std::string& body) {
  const std::string script = png + ".gp";
  {
    std::ofstream f(script);
    f << "set terminal pngcairo size 900,540\nset output '" << png << "'\nset grid\nset yrange [0:*]\n" << body;
  }
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::remove(data_file.c_str());
  std::remove(script.c_str());
  if (rc != 0) {
    fprintf(stderr, "tandem bench: gnuplot failed to write %s (is gnuplot-nox installed?)\n", png.c_str());
    return false;
  }
  fprintf(stderr, "tandem bench: wrote %s\n", png.c_str());
  return true;
}

}  // namespace tandem::bench
