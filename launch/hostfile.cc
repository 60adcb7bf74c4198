// Host files (--hostfile): Open MPI's and Horovod's `node1 slots=4` lines and
// MPICH/Hydra's `node1:4`, into the same host list as -H.
#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "placement.h"
#include "tandem/launch/launch.h"

namespace tandem::launch {
namespace {

constexpr const char* kShapes = "give `host`, `host slots=N` (Open MPI, Horovod) or `host:N` (MPICH)";

// One line without its comment: the host and its slots; nullopt for a blank line.
std::optional<HostSlots> parse_hostfile_line(const std::string& line, const std::string& where) {
  std::istringstream words(line.substr(0, line.find('#')));
  std::string first;
  if (!(words >> first)) return std::nullopt;
  HostSlots h = split_host_slots(first);
  const bool bracketed = first.front() == '[' && first.back() == ']';
  const bool slots_in_name = h.host != first && !bracketed;
  int max_slots = 0;
  bool slots_given = false;
  auto bad = [&](const std::string& why) { return std::invalid_argument(where + ": " + why + "; " + kShapes); };
  for (std::string word; words >> word;) {
    const size_t eq = word.find('=');
    const std::string key = word.substr(0, eq), value = eq == std::string::npos ? "" : word.substr(eq + 1);
    const int count = parse_slot_count(value);
    if (eq == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots"))
      throw bad("'" + word + "' is not slots=N or max_slots=N");
    if (count < 1 || count > kMaxLocalRanks)
      throw bad("'" + word + "' needs a count of 1.." + std::to_string(kMaxLocalRanks));
    if (key == "slots") {
      if (slots_in_name || slots_given) throw bad("the slots are given twice");
      h.slots = count;
      slots_given = true;
    } else {
      max_slots = count;
    }
  }
  if (h.host.empty() || h.slots < 1 || h.slots > kMaxLocalRanks)
    throw bad("'" + first + "' is not a host, or not host:N with 1.." + std::to_string(kMaxLocalRanks) + " slots");
  if (max_slots > 0 && h.slots > max_slots)
    throw bad("slots=" + std::to_string(h.slots) + " exceeds max_slots=" + std::to_string(max_slots));
  h.max_slots = max_slots;
  return h;
}

}  // namespace

std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& name) {
  std::vector<HostSlots> hosts;
  std::istringstream in(text);
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    const std::string where = "hostfile " + name + " line " + std::to_string(++number);
    const std::optional<HostSlots> h = parse_hostfile_line(line, where);
    if (!h) continue;
    // A host listed again adds its slots to its first line's, as mpirun counts them.
    auto same = std::find_if(hosts.begin(), hosts.end(), [&](const HostSlots& o) { return o.host == h->host; });
    if (same == hosts.end()) {
      hosts.push_back(*h);
      continue;
    }
    same->max_slots = same->max_slots > 0 && h->max_slots > 0 ? same->max_slots + h->max_slots : 0;
    if ((same->slots += h->slots) > kMaxLocalRanks) {
      throw std::invalid_argument(where + ": " + h->host + " has more than " + std::to_string(kMaxLocalRanks) +
                                  " slots in all");
    }
  }
  if (hosts.empty()) throw std::invalid_argument("hostfile " + name + " names no host; " + kShapes + ", one a line");
  return hosts;
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read the hostfile '" + path + "'; give the path of a readable file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), "'" + path + "'");
}

}  // namespace tandem::launch
