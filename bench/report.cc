#include "tandem/bench/report.h"

#include <algorithm>
#include <cstdio>

namespace tandem::bench {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string human_bytes(double bytes) {
  static const char* const kSuffixes[] = {"", "K", "M", "G"};
  int unit = 0;
  while (bytes >= 1024 && unit < 3) bytes /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, "%g%s", bytes, kSuffixes[unit]);
  return text;
}

}  // namespace tandem::bench
