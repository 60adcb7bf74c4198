// The scale model's arithmetic and its calibration file; terms in model.h.
#include "tandem/bench/model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/errors.h"

namespace tandem::bench {
namespace {

// Ranks per core on a host.
double ranks_per_core(const Calibration& c, const Topology& t) {
  const int on_cores = t.ranks_on_cores > 0 ? t.ranks_on_cores : t.ranks_per_host;
  return double(on_cores) / std::max(c.cores, 1);
}

// Ranks sharing a host's cores slow a cpu-bound cost by their excess over the cores.
double contention(const Calibration& c, const Topology& t) { return std::max(1.0, ranks_per_core(c, t)); }

// The curve through (1, at_one) and `points` (ranks per core above 1, ascending)
// at rho > 1: linear between points, in proportion to rho - 1 beyond the last.
double beyond_the_cores(const std::vector<std::pair<double, double>>& points, double at_one, double rho) {
  double lo_rho = 1, lo = at_one;
  for (const auto& [r, y] : points) {
    if (rho <= r) return lo + (y - lo) * (rho - lo_rho) / (r - lo_rho);
    lo_rho = r, lo = y;
  }
  return at_one + (lo - at_one) * (rho - 1) / (lo_rho - 1);
}

// Seconds per byte of messages of `message_bytes` from each rank. A cpu-bound
// link slows once its ranks want more cores than the host has: by the stretch
// measured there (cores shared unevenly cost more than their share), else as
// if each kept cpu_share of a core busy (a whole one when not measured).
double link_beta(const Calibration& c, const Link& l, const Topology& t, double message_bytes) {
  const double beta = l.beta_at(message_bytes);
  if (!l.cpu_bound) return beta;
  const double rho = ranks_per_core(c, t);
  if (rho <= 1) return beta;
  std::vector<std::pair<double, double>> measured;
  for (const auto& [r, stretch] : l.stretch) {
    if (r > 1) measured.emplace_back(r, stretch);
  }
  if (!measured.empty()) return beta * std::max(1.0, beyond_the_cores(measured, 1, rho));
  const double share = l.cpu_share > 0 ? l.cpu_share : 1.0;
  return beta * std::max(1.0, rho * share);
}

// The shared-memory all-reduce makes every rank wait for all the others twice
// per call: staged (3+ ranks) once for the stamps, once for the reduced
// slices; direct once to arrive, once to finish.
constexpr double kShmRendezvousPerCall = 2;

// Shared-memory all-reduce of `bytes` among L ranks on one host.
double shared_memory_time(const Calibration& c, const Topology& t, double bytes) {
  if (t.ranks_per_host < 2) return 0;
  const double per_rank = c.shm.traffic_at(bytes) * bytes;
  const double rho = ranks_per_core(c, t);
  return c.shm.alpha * contention(c, t) + per_rank * c.shm.beta_at(bytes) * copy_stretch(c.shm, rho) +
         kShmRendezvousPerCall * oversubscribed_step(c.shm.step, rho);
}

// Reducing a received segment overlaps the next segment's transfer when
// different resources do the two (a NIC moves, a core reduces); when the
// cores also move the bytes (cpu-bound), they add up.
double transfer_and_reduce(const Link& l, double beta, double gamma) {
  return l.cpu_bound ? beta + gamma : std::max(beta, gamma);
}

// One step's transfer of `seconds` plus `wait`, what oversubscribed cores add
// to it. A wire keeps delivering into a rank's socket while the rank waits for
// a core, so there only the wait beyond the transfer counts; a cpu-bound link
// needs the cores for the transfer itself, so the two add up.
double transfer_and_wait(const Link& l, double seconds, double wait) {
  return l.cpu_bound ? seconds + wait : std::max(seconds, wait);
}

// A pipelined ring of n ranks: n-1 reduce-scatter steps of N/n (transfer and
// reduce), n-1 allgather steps (transfer), each also paying alpha and `wait`.
double ring_time(const Link& l, double beta, double gamma, int n, double bytes, double wait) {
  if (n < 2) return 0;
  const double chunk = bytes / n;
  return (n - 1) * (2 * l.alpha + transfer_and_wait(l, chunk * transfer_and_reduce(l, beta, gamma), wait) +
                    transfer_and_wait(l, chunk * beta, wait));
}

}  // namespace

// Piecewise linear in log(bytes), flat beyond the ends.
double interpolate(const std::map<double, double>& table, double bytes, double fallback) {
  if (table.empty()) return fallback;
  if (bytes <= table.begin()->first) return table.begin()->second;
  if (bytes >= table.rbegin()->first) return table.rbegin()->second;
  auto hi = table.lower_bound(bytes);
  auto lo = std::prev(hi);
  const double w = (std::log(bytes) - std::log(lo->first)) / (std::log(hi->first) - std::log(lo->first));
  return lo->second + w * (hi->second - lo->second);
}

double oversubscribed_step(const StepTable& step, double rho) {
  if (rho <= 1 || step.empty() || step.rbegin()->first <= 1) return 0;
  // The unshared step: the entry at the most ranks per core not above 1 (else none).
  auto base_it = step.upper_bound(1.0);
  const double base = base_it == step.begin() ? 0.0 : std::prev(base_it)->second;
  std::vector<std::pair<double, double>> extra;  // what each entry above 1 adds to it
  for (auto it = base_it; it != step.end(); ++it) extra.emplace_back(it->first, std::max(0.0, it->second - base));
  return beyond_the_cores(extra, 0, rho);
}

double copy_stretch(const SharedMemoryCost& shm, double rho) {
  if (rho <= 1) return 1;
  auto base_it = shm.copy.upper_bound(1.0);
  if (base_it == shm.copy.begin() || base_it == shm.copy.end()) return rho;  // nothing to compare
  const auto step_at = [&](double r) {
    auto it = shm.step.find(r);
    return it == shm.step.end() ? 0.0 : kShmRendezvousPerCall * it->second;  // the all-reduce's rendezvous
  };
  const auto base = std::prev(base_it);
  const double unshared = base->second - step_at(base->first);
  if (unshared <= 0) return rho;
  std::vector<std::pair<double, double>> stretch;
  for (auto it = base_it; it != shm.copy.end(); ++it)
    stretch.emplace_back(it->first, std::max(1.0, (it->second - step_at(it->first)) / unshared));
  return beyond_the_cores(stretch, 1, rho);
}

double SharedMemoryCost::beta_at(double bytes) const { return interpolate(beta, bytes, 0.0); }
double Link::beta_at(double message_bytes) const { return interpolate(beta_by_size, message_bytes, beta); }
// 5: the staged path's figure (ring/src/shm_collectives.cc).
double SharedMemoryCost::traffic_at(double bytes) const { return interpolate(traffic, bytes, 5.0); }

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::ring: return "ring";
    case Algorithm::recursive_doubling: return "recursive_doubling";
    case Algorithm::hierarchical: return "hierarchical";
    case Algorithm::shared_memory: return "shared_memory";
    case Algorithm::parameter_server: return "parameter_server";
  }
  return "?";
}

bool applies(Algorithm a, const Topology& t) {
  switch (a) {
    case Algorithm::shared_memory: return t.hosts == 1;
    case Algorithm::hierarchical: return t.hosts > 1 && t.ranks_per_host > 1;
    case Algorithm::parameter_server: return t.hosts > 1;
    default: return t.ranks() > 1 && t.hosts > 1;
  }
}

double predict(const Calibration& c, const Link& inter, const Topology& t, Algorithm a, double bytes) {
  if (t.hosts < 1 || t.ranks_per_host < 1) throw InvalidArgument("tandem model: hosts and ranks per host must be >= 1");
  if (!applies(a, t)) {
    throw InvalidArgument(std::string("tandem model: ") + to_string(a) + " does not apply to " +
                          std::to_string(t.hosts) + " host(s) x " + std::to_string(t.ranks_per_host) + " rank(s)");
  }
  const int p = t.ranks();
  const double cpu = contention(c, t);
  const double wait = oversubscribed_step(inter.step, ranks_per_core(c, t));  // per step over the link
  switch (a) {
    case Algorithm::shared_memory: return shared_memory_time(c, t, bytes);
    case Algorithm::ring:
      // Host-major: each host has one outgoing inter-host edge, the slowest on every step.
      return ring_time(inter, link_beta(c, inter, t, bytes / p), c.gamma * cpu, p, bytes, wait);
    case Algorithm::recursive_doubling: {
      // log2(q) exchanges among q, the largest power of two <= p, plus the fold
      // and unfold when p is not one. Only the ranks exchanging compete for the
      // cores: q of the p in an exchange, the 2(p - q) pairing up in the fold.
      const int q = 1 << int(std::floor(std::log2(double(p))));
      const double rho = ranks_per_core(c, t);
      const double transfer = bytes * link_beta(c, inter, t, bytes), reduce = bytes * c.gamma * cpu;
      const double exchanges =
          std::log2(double(q)) *
          (inter.alpha + transfer_and_wait(inter, transfer, oversubscribed_step(inter.step, rho * q / p)) + reduce);
      if (q == p) return exchanges;
      // The fold comes in and the unfold goes out over opposite directions of
      // the partner's link: a wire, busy only with the busier direction, moves
      // one of the two messages' bytes per call (its rate, not the steps'
      // latency, bounds back-to-back calls); cpu-bound, the cores move both.
      const double fold_wait = oversubscribed_step(inter.step, rho * 2 * (p - q) / p);
      const double moves = inter.cpu_bound ? 2 * transfer_and_wait(inter, transfer, fold_wait)
                                           : transfer_and_wait(inter, transfer, fold_wait) + fold_wait;
      return exchanges + 2 * (inter.alpha + reduce) + moves;
    }
    case Algorithm::hierarchical: {
      // Reduce-scatter then allgather on the host cost about one shared-memory all-reduce;
      // L rings of N/L share the NIC, so on a wire each sees L times beta, the
      // wire carrying the L chunks of a step as one message of N/H.
      const int L = t.ranks_per_host;
      const double ring_beta =
          inter.cpu_bound ? link_beta(c, inter, t, bytes / L / t.hosts) : link_beta(c, inter, t, bytes / t.hosts) * L;
      return shared_memory_time(c, t, bytes) + ring_time(inter, ring_beta, c.gamma * cpu, t.hosts, bytes / L, wait);
    }
    case Algorithm::parameter_server: {
      // S = H servers; a worker's NIC carries N each way, a server's p*N/S each way.
      const double servers = t.hosts;
      const double server_bytes = p * bytes / servers;
      const double wire = std::max(bytes * t.ranks_per_host, server_bytes) * inter.beta_at(bytes / servers);
      return 2 * (inter.alpha + wait) + wire + (p - 1) * (bytes / servers) * c.gamma;
    }
  }
  return 0;
}

Algorithm tandem_choice(const Topology& t, double bytes, double small_message_bytes) {
  if (t.hosts == 1) return Algorithm::shared_memory;
  if (bytes <= small_message_bytes) return Algorithm::recursive_doubling;
  return t.ranks_per_host > 1 ? Algorithm::hierarchical : Algorithm::ring;
}

Algorithm parse_algorithm(const std::string& name) {
  for (Algorithm a : {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::hierarchical, Algorithm::shared_memory,
                      Algorithm::parameter_server}) {
    if (name == to_string(a)) return a;
  }
  throw InvalidArgument("tandem model: unknown algorithm '" + name +
                        "' (ring, recursive_doubling, hierarchical, shared_memory, parameter_server)");
}

Algorithm fastest(const Calibration& c, const Link& inter, const Topology& t, double bytes) {
  if (t.hosts == 1) return Algorithm::shared_memory;
  Algorithm best = Algorithm::ring;
  double best_time = predict(c, inter, t, best, bytes);
  for (Algorithm a : {Algorithm::recursive_doubling, Algorithm::hierarchical}) {
    if (!applies(a, t)) continue;
    const double time = predict(c, inter, t, a, bytes);
    if (time < best_time) best = a, best_time = time;
  }
  return best;
}

double busbw_gbps(const Topology& t, double bytes, double seconds) {
  const int p = t.ranks();
  if (seconds <= 0 || p < 2) return 0;
  return bytes / seconds * 2.0 * (p - 1) / p / 1e9;
}

LineFit fit_bandwidth(const std::vector<double>& x, const std::vector<double>& y, double large) {
  if (x.size() != y.size() || x.size() < 2) throw InvalidArgument("tandem model: a fit needs two or more sizes");
  std::vector<double> slopes;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] >= large && x[i] > x[0]) slopes.push_back((y[i] - y[0]) / (x[i] - x[0]));
  }
  if (slopes.empty()) slopes.push_back((y.back() - y[0]) / (x.back() - x[0]));
  std::sort(slopes.begin(), slopes.end());
  LineFit f;
  f.b = std::max(0.0, slopes[slopes.size() / 2]);
  f.a = std::max(0.0, y[0] - f.b * x[0]);
  return f;
}

LineFit fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size() || x.size() < 2) throw InvalidArgument("tandem model: a line fit needs two or more sizes");
  // Relative least squares (weights 1/y^2): small and large sizes count alike.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (y[i] * y[i]);
    sw += w, sx += w * x[i], sy += w * y[i], sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
  }
  const double det = sw * sxx - sx * sx;
  LineFit f;
  if (det > 0) {
    f.b = (sw * sxy - sx * sy) / det;
    f.a = (sy - f.b * sx) / sw;
  }
  if (f.b < 0) f.b = 0, f.a = sy / sw;
  if (f.a < 0) f.a = 0, f.b = sxy / sxx;
  return f;
}

namespace {
// " step 1: 0.5 us, 1.5: 2.6 us" (ranks per core: seconds per step), or nothing.
std::string describe_steps(const StepTable& step) {
  std::ostringstream s;
  for (const auto& [rho, seconds] : step)
    s << (s.tellp() > 0 ? ", " : " step ") << rho << ": " << seconds * 1e6 << " us";
  return s.str();
}
}  // namespace

std::string Calibration::describe() const {
  std::ostringstream s;
  s << "cores " << cores << ", gamma " << gamma * 1e9 << " ns/B, shared memory alpha " << shm.alpha * 1e6
    << " us, beta " << shm.beta_at(0) * 1e9 << " ns/B (smallest size) to " << shm.beta_at(1e15) * 1e9
    << " ns/B (largest)" << describe_steps(shm.step);
  for (const auto& [rho, seconds] : shm.copy) {
    if (rho > 1) s << ", copies x" << copy_stretch(shm, rho) << " at " << rho;
  }
  for (const auto& [name, l] : links) {
    s << "; " << name << " alpha " << l.alpha * 1e6 << " us beta " << l.beta * 1e9 << " ns/B";
    if (!l.beta_by_size.empty()) {
      s << " (" << l.beta_at(0) * 1e9 << " ns/B at " << l.beta_by_size.begin()->first << " B messages)";
    }
    if (l.cpu_bound) s << " (cpu-bound, " << l.cpu_share << " core per rank)";
    for (const auto& [rho, stretch] : l.stretch) s << ", beta x" << stretch << " at " << rho;
    s << describe_steps(l.step);
  }
  return s.str();
}

namespace {
// "step_s": {"RANKS_PER_CORE": seconds, ...}
StepTable step_table(const nlohmann::json& j, const char* key = "step_s") {
  StepTable t;
  const auto steps = j.value(key, nlohmann::json::object());
  for (const auto& [rho, s] : steps.items()) t[std::stod(rho)] = s.get<double>();
  return t;
}
nlohmann::json step_json(const StepTable& t) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [rho, s] : t) {
    std::ostringstream key;
    key << rho;
    j[key.str()] = s;
  }
  return j;
}
}  // namespace

Calibration load_calibration(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw InvalidArgument("tandem model: cannot read calibration '" + path + "' (run `tandem model calibrate`)");
  Calibration c;
  try {
    const auto j = nlohmann::json::parse(f);
    c.cores = j.value("cores", 2);
    c.gamma = j.value("gamma_s_per_byte", 0.0);
    if (j.contains("shared_memory")) {
      const auto& s = j["shared_memory"];
      c.shm.alpha = s.value("alpha_s", 0.0);
      const auto beta = s.value("beta_s_per_byte", nlohmann::json::object());
      for (const auto& [bytes, b] : beta.items()) c.shm.beta[std::stod(bytes)] = b.get<double>();
      const auto traffic = s.value("traffic_per_byte", nlohmann::json::object());
      for (const auto& [bytes, t] : traffic.items()) c.shm.traffic[std::stod(bytes)] = t.get<double>();
      c.shm.step = step_table(s);
      c.shm.copy = step_table(s, "copy_s");
    }
    const auto links = j.value("links", nlohmann::json::object());
    for (const auto& [name, l] : links.items()) {
      Link& link = c.links[name];
      link = Link{l.value("alpha_s", 0.0),
                  l.value("beta_s_per_byte", 0.0),
                  l.value("cpu_bound", false),
                  step_table(l),
                  l.value("cpu_share", 0.0),
                  {},
                  {}};
      // Absent from older calibrations: beta then holds at every size.
      const auto by_size = l.value("beta_s_per_byte_by_message", nlohmann::json::object());
      for (const auto& [bytes, b] : by_size.items()) link.beta_by_size[std::stod(bytes)] = b.get<double>();
      link.stretch = step_table(l, "stretch");
    }
    const auto samples = j.value("samples", nlohmann::json::object());
    for (const auto& [key, values] : samples.items()) c.samples[key] = values.get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("tandem model: calibration '" + path + "' is not valid: " + e.what());
  }
  return c;
}

void save_calibration(const Calibration& c, const std::string& path) {
  auto by_size = [](const std::map<double, double>& table) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [bytes, v] : table) j[std::to_string(uint64_t(bytes))] = v;
    return j;
  };
  nlohmann::json links = nlohmann::json::object();
  for (const auto& [name, l] : c.links) {
    links[name] = {{"alpha_s", l.alpha},
                   {"beta_s_per_byte", l.beta},
                   {"cpu_bound", l.cpu_bound},
                   {"step_s", step_json(l.step)},
                   {"cpu_share", l.cpu_share},
                   {"beta_s_per_byte_by_message", by_size(l.beta_by_size)},
                   {"stretch", step_json(l.stretch)}};
  }
  nlohmann::json j = {{"cores", c.cores},
                      {"gamma_s_per_byte", c.gamma},
                      {"shared_memory",
                       {{"alpha_s", c.shm.alpha},
                        {"beta_s_per_byte", by_size(c.shm.beta)},
                        {"traffic_per_byte", by_size(c.shm.traffic)},
                        {"step_s", step_json(c.shm.step)},
                        {"copy_s", step_json(c.shm.copy)}}},
                      {"links", links},
                      {"samples", c.samples}};
  std::ofstream f(path);
  if (!(f << j.dump(2) << '\n')) throw InvalidArgument("tandem model: cannot write '" + path + "'");
}

const Link& link_named(const Calibration& c, const std::string& name) {
  auto it = c.links.find(name);
  if (it != c.links.end()) return it->second;
  std::string known;
  for (const auto& [n, l] : c.links) known += (known.empty() ? "" : ", ") + n;
  throw InvalidArgument("tandem model: no link '" + name + "' in the calibration (known: " +
                        (known.empty() ? "none; calibrate one with --link NAME" : known) + ")");
}

Link parse_hypothetical_link(const std::string& text) {
  const auto colon = text.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t gbps_used = 0, alpha_used = 0;
    const std::string gbps_text = text.substr(0, colon), alpha_text = text.substr(colon + 1);
    const double gbps = std::stod(gbps_text, &gbps_used);
    const double alpha_us = std::stod(alpha_text, &alpha_used);
    if (gbps_used != gbps_text.size() || alpha_used != alpha_text.size()) throw std::invalid_argument("trailing text");
    if (gbps <= 0 || alpha_us < 0) throw std::invalid_argument("range");
    return Link{alpha_us * 1e-6, 8.0 / (gbps * 1e9), false, {}, 0, {}, {}};
  } catch (const std::exception&) {
    throw InvalidArgument("tandem model: link '" + text +
                          "' is neither a calibrated link nor GBPS:ALPHA_US (e.g. 100:5 for 100 Gbit/s, 5 us)");
  }
}

ValidateCase parse_case(const std::string& text) {
  // HxL[:LINK]=FILE
  const auto eq = text.find('=');
  const auto x = text.find('x');
  ValidateCase v;
  try {
    if (eq == std::string::npos || x == std::string::npos || x > eq) throw std::invalid_argument("shape");
    v.topology.hosts = std::stoi(text.substr(0, x));
    const std::string rest = text.substr(x + 1, eq - x - 1);
    const auto colon = rest.find(':');
    v.topology.ranks_per_host = std::stoi(rest.substr(0, colon));
    if (colon != std::string::npos) v.link = rest.substr(colon + 1);
    v.file = text.substr(eq + 1);
    if (v.topology.hosts < 1 || v.topology.ranks_per_host < 1 || v.file.empty()) throw std::invalid_argument("range");
    if (v.topology.hosts > 1 && v.link.empty()) throw std::invalid_argument("link");
  } catch (const std::exception&) {
    throw InvalidArgument("tandem model: --case '" + text +
                          "' must be HOSTSxRANKS[:LINK]=FILE, e.g. 1x4=shm4.json or 2x1:veth=veth2.json "
                          "(LINK is needed for more than one host)");
  }
  return v;
}

}  // namespace tandem::bench
