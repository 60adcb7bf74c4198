#include "doctor.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>

namespace tandem::cli {
namespace {

using nlohmann::json;

struct Dump {
  std::string path;
  int rank = -1, size = 0;
  std::string host, reason;
  std::map<uint64_t, json> calls;  // by sequence number
};

std::string describe(const json& e) {
  std::string s = e.value("kind", "?");
  if (e.contains("dtype")) {
    s += "(" + std::to_string(e.value("count", uint64_t{0})) + " x " + e.value("dtype", "");
    if (e.contains("op")) s += ", " + e.value("op", "");
    if (e.value("root", -1) >= 0) s += ", root " + std::to_string(e.value("root", -1));
    s += ")";
  }
  return s;
}

std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// The first field in which two calls differ, or nullopt.
std::optional<std::string> differing(const json& a, const json& b) {
  for (const char* f : {"kind", "op", "dtype", "count", "root"}) {
    if (a.value(f, json()) != b.value(f, json())) return std::string(f);
  }
  return std::nullopt;
}

std::string state_of(const json& e) {
  std::string s = e.value("state", "?");
  if (e.contains("waiting_on")) s += ", waiting on rank " + std::to_string(e.value("waiting_on", -1));
  return s;
}

}  // namespace

int run_doctor(const std::vector<std::string>& paths, std::ostream& out) {
  if (paths.empty()) {
    out << "tandem doctor: name the flight-recorder dumps of the job's ranks (tandem-flight-*.json)\n";
    return 2;
  }
  std::map<int, Dump> dumps;
  for (const auto& path : paths) {
    std::ifstream in(path);
    Dump d;
    d.path = path;
    try {
      if (!in) throw std::runtime_error("cannot open it");
      json j = json::parse(in);
      d.rank = j.at("rank").get<int>();
      d.size = j.at("size").get<int>();
      d.host = j.value("host", "");
      d.reason = j.value("reason", "");
      for (const auto& e : j.at("entries")) d.calls[e.at("seq").get<uint64_t>()] = e;
    } catch (const std::exception& e) {
      out << "tandem doctor: " << path << " is not a flight-recorder dump: " << e.what() << "\n";
      return 2;
    }
    if (dumps.count(d.rank)) {
      out << "tandem doctor: " << path << " and " << dumps[d.rank].path << " are both rank " << d.rank
          << "; give one dump per rank\n";
      return 2;
    }
    dumps[d.rank] = std::move(d);
  }

  int size = 0;
  for (const auto& [r, d] : dumps) size = std::max(size, d.size);
  out << "tandem doctor: " << dumps.size() << " dump(s) of a " << size << "-rank job\n";
  for (const auto& [r, d] : dumps) {
    out << "  rank " << r << ": "
        << (d.calls.empty()
                ? "no calls"
                : "calls #" + std::to_string(d.calls.begin()->first) + "..#" + std::to_string(d.calls.rbegin()->first))
        << ", dumped on " << (d.reason.empty() ? "?" : d.reason) << " (" << d.path << ")\n";
  }
  std::vector<int> absent;
  for (int r = 0; r < size; ++r)
    if (!dumps.count(r)) absent.push_back(r);
  if (!absent.empty())
    out << "  no dump from " << ranks_text(absent)
        << " (killed before it could write one, or TANDEM_FLIGHT_ENTRIES=0); it is left out below\n";

  // The window: from the newest oldest-call of any dump to the newest call of all.
  uint64_t from = 1, to = 0;
  for (const auto& [r, d] : dumps) {
    if (d.calls.empty()) continue;
    from = std::max(from, d.calls.begin()->first);
    to = std::max(to, d.calls.rbegin()->first);
  }
  for (uint64_t s = from; s <= to; ++s) {
    std::vector<int> entered, never;
    for (const auto& [r, d] : dumps) (d.calls.count(s) ? entered : never).push_back(r);
    if (!never.empty()) {
      const json& first = dumps[entered.front()].calls[s];
      out << "first divergence: call #" << s << ", " << describe(first) << ": entered by " << ranks_text(entered)
          << "; " << ranks_text(never) << " never entered it\n";
      for (int r : never) {
        const Dump& d = dumps[r];
        if (d.calls.empty()) {
          out << "  rank " << r << " made no collective call\n";
        } else {
          const json& last = d.calls.rbegin()->second;
          out << "  rank " << r << "'s last call: #" << d.calls.rbegin()->first << " " << describe(last) << " ("
              << state_of(last) << ")\n";
        }
      }
      return 1;
    }
    const json& base = dumps[entered.front()].calls[s];
    for (int r : entered) {
      if (auto field = differing(base, dumps[r].calls[s])) {
        out << "first divergence: call #" << s << ": the " << *field << " differs: rank " << entered.front()
            << " called " << describe(base) << ", rank " << r << " called " << describe(dumps[r].calls[s]) << "\n";
        return 1;
      }
    }
    std::vector<int> unfinished;
    for (int r : entered)
      if (dumps[r].calls[s].value("state", "") != "completed") unfinished.push_back(r);
    if (!unfinished.empty()) {
      out << "first call not completed everywhere: #" << s << " " << describe(base) << "\n";
      for (int r : entered) {
        const json& e = dumps[r].calls[s];
        out << "  rank " << r << ": " << state_of(e);
        if (e.contains("error")) out << ": " << e.value("error", "");
        out << "\n";
      }
      return 1;
    }
  }
  out << "the dumps agree: every rank completed calls #" << from << "..#" << to << "\n";
  return 0;
}

}  // namespace tandem::cli
