// Fault injection: a rank killed mid-collective must make every other rank
// fail with PeerFailure naming it, fast, and `tandem launch` must exit
// non-zero naming it.
#include <gtest/gtest.h>
#include <signal.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "multiprocess.h"
#include "tandem/tandem.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kVictim = 1;
// A survivor exits with kNamedVictim + the failed rank it was told about.
constexpr int kNamedVictim = 20;
constexpr int kTooSlow = 5;

// 64 MiB runs staged through the shared segments, 1 MiB by cross-memory
// attach straight from the peers' buffers.
TEST(PeerFailure, KilledRankIsNamedWithinTenSeconds) {
  for (int n : {2, 3}) {
    for (size_t bytes : {size_t(64) << 20, size_t(1) << 20}) {
      SCOPED_TRACE("world size " + std::to_string(n) + ", " + std::to_string(bytes) + " bytes");
      int ready[2];
      ASSERT_EQ(pipe(ready), 0);
      RankGroup group(n, [&, bytes](const CommOptions& o) {
        close(ready[0]);
        auto comm = ring::connect(o);
        std::vector<float> data(bytes / sizeof(float), 1.0f);
        comm->allreduce(data.data(), data.size(), DataType::f32, ReduceOp::sum);
        if (comm->rank() == 0) (void)!write(ready[1], "x", 1);  // the group is in its all-reduce loop
        for (;;) {
          auto t0 = Clock::now();
          try {
            comm->allreduce(data.data(), data.size(), DataType::f32, ReduceOp::sum);
          } catch (const PeerFailure& e) {
            fprintf(stderr, "[rank %d] %s\n", comm->rank(), e.what());
            // The failure must surface well within 10 s of the kill (one 64 MiB
            // all-reduce takes far less than a second here).
            if (Clock::now() - t0 > 10s) return kTooSlow;
            return kNamedVictim + e.rank();
          }
        }
      });
      close(ready[1]);
      char c;
      ASSERT_EQ(read(ready[0], &c, 1), 1);
      close(ready[0]);
      std::this_thread::sleep_for(200ms);  // well inside an all-reduce
      const auto killed_at = Clock::now();
      kill(group.pid(kVictim), SIGKILL);
      auto codes = group.wait(60s);
      const auto elapsed = Clock::now() - killed_at;
      EXPECT_LT(elapsed, 10s);
      for (int r = 0; r < n; ++r) {
        if (r == kVictim) {
          EXPECT_EQ(codes[r], 128 + SIGKILL);
        } else {
          EXPECT_EQ(codes[r], kNamedVictim + kVictim) << "rank " << r << " did not name rank " << kVictim;
        }
      }
    }
  }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The pid of `tandem launch`'s child that runs the given rank.
pid_t find_rank_pid(pid_t launcher, int rank) {
  std::istringstream children(
      read_file("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children"));
  pid_t child;
  while (children >> child) {
    std::string env = read_file("/proc/" + std::to_string(child) + "/environ");
    if (env.find(std::string("TANDEM_RANK=") + std::to_string(rank) + '\0') != std::string::npos) return child;
  }
  return -1;
}

TEST(PeerFailure, LauncherNamesTheKilledRank) {
  const char* bin = getenv("TANDEM_BIN");
  if (!bin) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const std::string out_path = "/tmp/tandem_failure_test_" + std::to_string(getpid()) + ".log";
  const std::string cmd = std::string("exec timeout -s KILL 60 ") + bin + " launch -n 3 -- " + bin +
                          " bench allreduce -b 64M -e 64M -n 100000 -w 1 -c 0 > " + out_path + " 2>&1";
  pid_t shell = fork();
  if (shell == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
    _exit(127);
  }
  // `exec` makes the shell become `timeout`, whose child is the launcher.
  pid_t launcher = -1, victim = -1;
  for (int i = 0; i < 300 && victim < 0; ++i) {
    std::this_thread::sleep_for(50ms);
    if (launcher < 0) {
      std::istringstream c(
          read_file("/proc/" + std::to_string(shell) + "/task/" + std::to_string(shell) + "/children"));
      c >> launcher;
      if (!c) launcher = -1;
    }
    if (launcher > 0) victim = find_rank_pid(launcher, kVictim);
  }
  ASSERT_GT(victim, 0) << "could not find rank 1 of the launched job";
  std::this_thread::sleep_for(1500ms);  // let it get into its all-reduce loop
  const auto killed_at = Clock::now();
  kill(victim, SIGKILL);
  int status = 0;
  waitpid(shell, &status, 0);
  const auto elapsed = Clock::now() - killed_at;
  const std::string out = read_file(out_path);
  std::remove(out_path.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGKILL) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  EXPECT_LT(elapsed, 20s) << out;
  // The survivors report the peer failure themselves, naming rank 1.
  EXPECT_NE(out.find("[0] "), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 failed"), std::string::npos) << out;
}

}  // namespace
}  // namespace tandem::testing
