#include "tandem/bench/compare.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "tandem/bench/report.h"
#include "tandem/errors.h"

namespace tandem::bench {
namespace {

// One size of one table in one run; rows of several cycles (-N) pooled.
struct Spread {
  std::vector<double> medians;  // each row's time_p50_us
  double low = 0, high = 0;     // the fastest iteration, the slowest row's p99
};

struct Run {
  std::vector<std::string> order;  // keys as first seen
  std::map<std::string, Spread> sizes;
};

std::string key_of(const nlohmann::json& j) {
  char text[256];
  std::snprintf(text, sizeof text, "%-14s %-5s %5s %5s %4d %12zu %6d", j.at("collective").get<std::string>().c_str(),
                j.at("inplace").get<bool>() ? "in" : "out", j.value("dtype", "").c_str(), j.value("op", "").c_str(),
                j.value("root", -1), j.at("bytes").get<size_t>(), j.value("nranks", 0));
  return text;
}

void add_row(Run& run, const nlohmann::json& j) {
  const std::string key = key_of(j);
  auto [it, fresh] = run.sizes.try_emplace(key);
  Spread& s = it->second;
  const double low = j.at("time_min_us").get<double>(), high = j.at("time_p99_us").get<double>();
  if (fresh) {
    run.order.push_back(key);
    s.low = low, s.high = high;
  }
  s.medians.push_back(j.at("time_p50_us").get<double>());
  s.low = std::min(s.low, low), s.high = std::max(s.high, high);
}

// JSON lines (a launcher's prefix before the brace is skipped), or one array of rows.
Run read_run(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument("tandem bench --compare: cannot read '" + path + "'");
  Run run;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    size_t brace = 0;
    if (line.size() > 2 && line[0] == '[' && std::isdigit(static_cast<unsigned char>(line[1]))) {
      brace = line.find("] ") == std::string::npos ? 0 : line.find("] ") + 2;  // a launcher's "[rank] "
    }
    brace = line.find_first_of("{[", brace);
    if (brace == std::string::npos) continue;
    try {
      const nlohmann::json j = nlohmann::json::parse(line.substr(brace));
      for (const auto& row : j.is_array() ? j : nlohmann::json::array({j})) {
        if (row.contains("collective") && row.value("bytes", size_t(0)) > 0) add_row(run, row);
      }
    } catch (const nlohmann::json::exception& e) {
      throw InvalidArgument("tandem bench --compare: " + path + ":" + std::to_string(number) +
                            ": not a tandem bench JSON row with time_p50_us, time_min_us and time_p99_us (" + e.what() +
                            "); write runs with -J FILE.json or --format json");
    }
  }
  if (run.order.empty()) {
    throw InvalidArgument("tandem bench --compare: '" + path +
                          "' holds no JSON rows of sizes; write runs with -J FILE.json or --format json");
  }
  return run;
}

// B against A: a size differs when one run's [fastest, p99] interval lies wholly beyond the other's.
const char* verdict(const Spread& a, const Spread& b) {
  if (b.high < a.low) return "B faster";
  if (b.low > a.high) return "B slower";
  return "same within noise";
}

}  // namespace

int run_compare(const std::string& a_path, const std::string& b_path, std::ostream& out) {
  const Run a = read_run(a_path), b = read_run(b_path);
  out << "# tandem bench --compare A=" << a_path << " B=" << b_path << "\n"
      << "# p50: median per-iteration time (us); B/A of the p50s; a size differs when one run's [min, p99]\n"
      << "# lies wholly above the other's (rows of several cycles pooled: median of p50s, overall min and p99)\n";
  char line[320];
  std::snprintf(line, sizeof line, "#%-13s %-5s %5s %5s %4s %12s %6s %10s %10s %7s  %s\n", "collective", "place",
                "type", "redop", "root", "size", "ranks", "A p50", "B p50", "B/A", "verdict");
  out << line;
  int differ = 0, same = 0;
  std::vector<std::string> keys = a.order;
  for (const auto& k : b.order)
    if (!a.sizes.count(k)) keys.push_back(k);
  for (const auto& k : keys) {
    const auto ia = a.sizes.find(k), ib = b.sizes.find(k);
    if (ia == a.sizes.end() || ib == b.sizes.end()) {
      out << k << "  " << (ia == a.sizes.end() ? "only in B" : "only in A") << "\n";
      continue;
    }
    const double ma = median(ia->second.medians), mb = median(ib->second.medians);
    const char* v = verdict(ia->second, ib->second);
    (std::string(v) == "same within noise" ? same : differ) += 1;
    std::snprintf(line, sizeof line, "%s %10.2f %10.2f %7.3f  %s\n", k.c_str(), ma, mb, ma > 0 ? mb / ma : 0.0, v);
    out << line;
  }
  out << "# " << differ << " size(s) differ, " << same << " the same within noise\n";
  return 0;
}

}  // namespace tandem::bench
