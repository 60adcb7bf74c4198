// The shared-memory path table (tandem/ring/shm_paths.h): its defaults, the
// override rows' parser, and the table as `tandem info` prints it.
#include "tandem/ring/shm_paths.h"

#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "tandem/errors.h"
#include "tandem/settings.h"

namespace tandem::ring {

namespace {

constexpr size_t kKiB = 1 << 10, kMiB = 1 << 20, kAll = SIZE_MAX;

using C = ShmCollective;
using B = ShmBuffers;
using P = ShmPath;

constexpr C kCollectives[] = {C::allreduce, C::reduce, C::reduce_scatter, C::allgather, C::broadcast, C::alltoall};
constexpr B kBuffers[] = {B::heap, B::shared};
constexpr P kPaths[] = {P::staged, P::mapped, P::cma, P::timed};

template <class T, size_t N>
std::optional<T> named(const T (&values)[N], const std::string& name) {
  for (T v : values)
    if (name == to_string(v)) return v;
  return std::nullopt;
}

template <class T, size_t N>
std::string names(const T (&values)[N]) {
  std::string out;
  for (T v : values) out += (out.empty() ? "" : ", ") + std::string(to_string(v));
  return out;
}

std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

[[noreturn]] void bad_row(const std::string& row, const std::string& what) {
  throw InvalidArgument("shared-memory path row '" + row + "': " + what);
}

// "*", "FROM-TO" (both included) or "FROM-" (and up).
std::pair<size_t, size_t> parse_range(const std::string& row, const std::string& text) {
  if (text == "*") return {0, kAll};
  const size_t dash = text.find('-');
  const std::string fix = "write a byte range as FROM-TO (both included), FROM- or *, sizes with K, M or G";
  if (dash == std::string::npos) bad_row(row, "'" + text + "' is no byte range; " + fix);
  const auto from = parse_byte_size(text.substr(0, dash));
  const std::string rest = text.substr(dash + 1);
  const auto to = rest.empty() ? std::optional<size_t>(kAll) : parse_byte_size(rest);
  if (!from || !to) bad_row(row, "'" + text + "' is no byte range; " + fix);
  if (*from > *to) bad_row(row, "the range '" + text + "' ends before it starts");
  return {*from, *to};
}

std::string valid_paths(C c, B b) {
  std::string out;
  for (P p : kPaths)
    if (shm_path_valid(c, b, p)) out += (out.empty() ? "" : ", ") + std::string(to_string(p));
  return out;
}

// Every (collective, buffers) pair a row names; a wildcard takes those the path can carry.
std::vector<ShmPathRow> parse_row(const std::string& row) {
  const size_t eq = row.find('=');
  const size_t c1 = row.find(':'), c2 = c1 == std::string::npos ? c1 : row.find(':', c1 + 1);
  if (eq == std::string::npos || c2 == std::string::npos || c2 > eq || row.find(':', c2 + 1) < eq) {
    bad_row(row, "a row is collective:buffers:bytes=path, e.g. allreduce:heap:256K-16M=timed");
  }
  const std::string cname = trimmed(row.substr(0, c1)), bname = trimmed(row.substr(c1 + 1, c2 - c1 - 1));
  const std::string range = trimmed(row.substr(c2 + 1, eq - c2 - 1)), pname = trimmed(row.substr(eq + 1));
  const auto c = named(kCollectives, cname);
  if (!c && cname != "*") bad_row(row, "unknown collective '" + cname + "'; valid: " + names(kCollectives) + ", *");
  const auto b = named(kBuffers, bname);
  if (!b && bname != "*") bad_row(row, "unknown buffers '" + bname + "'; valid: " + names(kBuffers) + ", *");
  const auto [from, to] = parse_range(row, range);
  const auto path = named(kPaths, pname);
  if (!path) bad_row(row, "unknown path '" + pname + "'; valid: " + names(kPaths));
  if (*path != P::staged && to < kShmDirectMinBytes) {
    bad_row(row,
            "below 16K every call stages (the direct paths start there, on every rank alike); start the "
            "range at 16K or above");
  }
  std::vector<ShmPathRow> rows;
  for (C ci : kCollectives) {
    for (B bi : kBuffers) {
      if ((c && ci != *c) || (b && bi != *b)) continue;
      if (shm_path_valid(ci, bi, *path)) {
        rows.push_back({ci, bi, from, to, *path});
      } else if (c && b) {
        bad_row(row, std::string(to_string(*path)) + " cannot carry " + cname + " on " + bname +
                         " buffers; valid there: " + valid_paths(ci, bi));
      }
    }
  }
  if (rows.empty()) bad_row(row, std::string(to_string(*path)) + " carries none of the calls the row names");
  return rows;
}

using Run = ShmPathTable::Run;

// A run starts at `at`.
void split_at(std::vector<Run>& runs, size_t at) {
  auto it = std::upper_bound(runs.begin(), runs.end(), at, [](size_t x, const auto& r) { return x < r.from; });
  if (std::prev(it)->from != at) runs.insert(it, {at, std::prev(it)->path, std::prev(it)->overridden});
}

}  // namespace

const char* to_string(ShmCollective c) {
  switch (c) {
    case C::allreduce: return "allreduce";
    case C::reduce: return "reduce";
    case C::reduce_scatter: return "reduce_scatter";
    case C::allgather: return "allgather";
    case C::broadcast: return "broadcast";
    case C::alltoall: return "alltoall";
  }
  return "?";
}

const char* to_string(ShmBuffers b) { return b == B::heap ? "heap" : "shared"; }

const char* to_string(ShmPath p) {
  switch (p) {
    case P::staged: return "staged";
    case P::mapped: return "mapped";
    case P::cma: return "cma";
    case P::timed: return "timed";
  }
  return "?";
}

bool shm_path_valid(ShmCollective c, ShmBuffers b, ShmPath path) {
  if (path == P::staged) return true;
  if (b == B::shared) return path == P::mapped && c != C::reduce;  // the root's output is known only at its arrival
  return path == P::cma || (path == P::timed && c != C::broadcast);
}

// Each row names its measurement in docs/algorithms.md.
const std::vector<ShmPathRow>& ShmPathTable::default_rows() {
  static const std::vector<ShmPathRow> rows = {
      // 'shm: the all-reduce timed window'
      {C::allreduce, B::heap, 256 * kKiB, 16 * kMiB, P::timed},
      // 'shm: the direct reduce'
      {C::reduce, B::heap, 256 * kKiB, 16 * kMiB, P::timed},
      // 'shm: cross-memory attach for the reduce-scatter and allgather'
      {C::reduce_scatter, B::heap, 32 * kKiB, kAll, P::timed},
      {C::allgather, B::heap, 32 * kKiB, kAll, P::timed},
      // 'shm: the all-to-all timed path'
      {C::alltoall, B::heap, 32 * kKiB, kAll, P::timed},
      // 'shm: the direct floor'
      {C::allreduce, B::shared, kShmDirectMinBytes, kAll, P::mapped},
      {C::reduce_scatter, B::shared, kShmDirectMinBytes, kAll, P::mapped},
      {C::allgather, B::shared, kShmDirectMinBytes, kAll, P::mapped},
      {C::broadcast, B::shared, kShmDirectMinBytes, kAll, P::mapped},
      {C::alltoall, B::shared, kShmDirectMinBytes, kAll, P::mapped},
  };
  return rows;
}

namespace {

void apply(ShmPathTable::Table& table, const ShmPathRow& row, bool overridden) {
  std::vector<Run>& runs = table.runs[size_t(row.collective) * kShmBuffers + size_t(row.buffers)];
  split_at(runs, row.from);
  if (row.to != kAll) split_at(runs, row.to + 1);
  for (Run& r : runs) {
    if (r.from >= row.from && r.from <= row.to) r.path = row.path, r.overridden = overridden;
  }
  std::vector<Run> merged;
  for (const Run& r : runs) {
    if (merged.empty() || merged.back().path != r.path || merged.back().overridden != r.overridden) {
      merged.push_back(r);
    }
  }
  runs = std::move(merged);
}

ShmPathTable::Table defaults() {
  ShmPathTable::Table table;
  for (auto& runs : table.runs) runs = {Run{0, P::staged, false}};
  for (const ShmPathRow& row : ShmPathTable::default_rows()) apply(table, row, false);
  return table;
}

}  // namespace

ShmPathTable::ShmPathTable() {
  static const auto shared_defaults = std::make_shared<const Table>(defaults());
  table_ = shared_defaults;
}

ShmPathTable::ShmPathTable(const std::string& overrides) {
  Table table = defaults();
  table.overrides = overrides;
  std::stringstream in(overrides);
  for (std::string row; std::getline(in, row, ',');) {
    row = trimmed(row);
    if (row.empty()) continue;
    for (const ShmPathRow& r : parse_row(row)) apply(table, r, true);
  }
  // Rows reach below the floor only with `staged` or with part of their range.
  for (C c : kCollectives) {
    for (B b : kBuffers) apply(table, {c, b, 0, kShmDirectMinBytes - 1, P::staged}, false);
  }
  table_ = std::make_shared<const Table>(std::move(table));
}

namespace {

std::string size_text(size_t x) {
  if (x != 0 && x % (kMiB << 10) == 0) return std::to_string(x >> 30) + "G";
  if (x != 0 && x % kMiB == 0) return std::to_string(x >> 20) + "M";
  if (x != 0 && x % kKiB == 0) return std::to_string(x >> 10) + "K";
  return std::to_string(x);
}

bool whole_kib(size_t x) { return x % kKiB == 0; }

// [from, end) as an interval whose bounds read as round sizes where they
// can: a bound off a whole KiB is printed as the size before it, excluded.
std::string interval(size_t from, size_t end) {
  std::string s;
  if (from == 0 || whole_kib(from)) {
    s.append("[").append(size_text(from));
  } else {
    s.append("(").append(size_text(from - 1));
  }
  s.append(", ");
  if (end == 0) return s.append("inf)");  // no run after this one
  if (whole_kib(end)) return s.append(size_text(end)).append(")");
  return s.append(size_text(end - 1)).append("]");
}

}  // namespace

std::string describe_shm_paths(const ShmPathTable& table, const std::string& cma_unavailable) {
  std::string out =
      "shared-memory paths by collective, buffers and bytes per call (the buffer; reduce_scatter "
      "its input, allgather its output, alltoall what each rank sends; * a TANDEM_SHM_PATHS row):\n";
  char line[64];
  for (C c : kCollectives) {
    for (B b : kBuffers) {
      std::snprintf(line, sizeof line, "  %-15s %-7s", to_string(c), to_string(b));
      std::string text = line;
      const auto& runs = table.runs(c, b);
      for (size_t i = 0; i < runs.size(); ++i) {
        const ShmPathTable::Run& r = runs[i];
        const bool blocked = !cma_unavailable.empty() && (r.path == P::cma || r.path == P::timed);
        text += (i ? ", " : " ") + interval(r.from, i + 1 < runs.size() ? runs[i + 1].from : 0) + " " +
                (blocked ? std::string("staged (not ") + to_string(r.path) + ")" : to_string(r.path)) +
                (r.overridden ? "*" : "");
      }
      out += text + "\n";
    }
  }
  out +=
      "  staged: through the slots; mapped: read in place; cma: cross-memory attach; timed: staged or cma, "
      "whichever rank 0 timed faster for the size class (docs/algorithms.md, 'The path table')\n";
  if (!table.overrides().empty()) out += "  TANDEM_SHM_PATHS=" + table.overrides() + "\n";
  if (!cma_unavailable.empty()) out += "  cross-memory attach unavailable: " + cma_unavailable + "\n";
  return out;
}

namespace {

// Whether this process holds CAP_SYS_PTRACE, which Yama's scopes 1 and 2 let through.
bool may_ptrace_any() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("CapEff:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> 19 & 1) != 0;
  }
  return false;
}

}  // namespace

std::string cross_memory_attach_limit() {
  int scope = 0;
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  if (yama >> scope) {
    const std::string setting = "kernel.yama.ptrace_scope is " + std::to_string(scope);
    if (scope >= 3) return setting + ": no process may read another's memory";
    if (scope >= 1 && !may_ptrace_any()) {
      return setting + (scope == 1 ? ": a process may read only its descendants' memory, and ranks are siblings"
                                   : ": only processes with CAP_SYS_PTRACE may read another's memory");
    }
  }
  // A seccomp filter (a container's) refuses the call whatever it reads: try it on this process.
  uint64_t word = 1, copy = 0;
  iovec local{&copy, sizeof copy}, remote{&word, sizeof word};
  if (::process_vm_readv(::getpid(), &local, 1, &remote, 1, 0) != ssize_t(sizeof word)) {
    return std::string("process_vm_readv fails here (") + std::strerror(errno) + ")";
  }
  return "";
}

}  // namespace tandem::ring
