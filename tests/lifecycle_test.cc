// Communicator create/destroy and create/abort cycles in one process: two
// ranks make a communicator, check one all-reduce, then destroy it (or abort
// and then destroy it), again and again. After a few warm-up cycles (UCX
// and the allocator set themselves up once) the process's open file
// descriptors, memory mappings and resident memory must stay flat: within
// 5% of the warm-up figures. Quick: 50 + 50 cycles; full: 1,000 + 1,000.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "multiprocess.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr int kWarmup = 5;

struct Usage {
  long fds = 0, maps = 0, rss_kib = 0;
};

Usage usage() {
  Usage u;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++u.fds;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) ++u.maps;
  std::ifstream status("/proc/self/status");
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) u.rss_kib = std::stol(line.substr(6));
  return u;
}

bool within(long base, long now, double fraction) { return now <= base + long(double(base) * fraction); }

// Each rank: `cycles` communicators, each checked with one all-reduce, then
// destroyed (abort = false) or aborted and destroyed. Exit 0 if flat.
int cycle(const CommOptions& base, int cycles, bool abort, const std::string& what) {
  Usage warm;
  for (int i = 0; i < cycles; ++i) {
    CommOptions o = base;
    o.prefix = base.prefix + "/" + what + std::to_string(i);
    auto comm = ring::connect(o, {});
    std::vector<float> x(257, float(o.rank + 1));
    comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
    if (x[0] != 3.0f || x[256] != 3.0f) return 9;
    if (abort) comm->abort("cycle " + std::to_string(i));
    comm.reset();
    if (i + 1 == kWarmup) warm = usage();
  }
  const Usage end = usage();
  std::printf(
      "rank %d, %d create/%s cycles: fds %ld -> %ld, mappings %ld -> %ld, RSS %ld -> %ld KiB (after %d "
      "warm-up cycles)\n",
      base.rank, cycles, what.c_str(), warm.fds, end.fds, warm.maps, end.maps, warm.rss_kib, end.rss_kib, kWarmup);
  std::fflush(stdout);
  const bool flat =
      within(warm.fds, end.fds, 0.05) && within(warm.maps, end.maps, 0.05) && within(warm.rss_kib, end.rss_kib, 0.05);
  return flat ? 0 : 6;
}

void run_cycles(int cycles, std::chrono::seconds guard) {
  const fs::path dir = fs::temp_directory_path() / ("tandem-lifecycle-" + std::to_string(getpid()));
  fs::create_directories(dir);
  CommOptions base;
  base.flight_dir = dir;  // aborts write their flight recorder here
  base.job_id = "lifecycle";
  RankGroup group(
      2,
      [&](const CommOptions& o) {
        if (int code = cycle(o, cycles, /*abort=*/false, "destroy")) return code;
        return cycle(o, cycles, /*abort=*/true, "abort");
      },
      base);
  group.expect_success(guard);
  fs::remove_all(dir);
}

TEST(Lifecycle, CreateDestroyAndCreateAbortLeaveFdsMappingsAndRssFlat) { run_cycles(50, 240s); }

TEST(Lifecycle, DISABLED_ThousandCyclesEach) { run_cycles(1000, 3000s); }

}  // namespace
}  // namespace tandem::testing
