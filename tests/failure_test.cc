// Fault injection: a rank killed mid-collective must make every other rank
// fail with PeerFailure naming it, fast, and `tandem launch` must exit
// non-zero naming it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>

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

// n ranks loop on all-reduces of `bytes`; rank kVictim is killed in one,
// and every other rank must fail within 10 s naming it.
void expect_killed_rank_named(int n, size_t bytes, const CommOptions& base = {}) {
  SCOPED_TRACE("world size " + std::to_string(n) + ", " + std::to_string(bytes) + " bytes");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  RankGroup group(
      n,
      [&, bytes](const CommOptions& o) {
        close(ready[0]);
        auto comm = ring::connect(o, {});
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
      },
      base);
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

// Both sizes run staged through the shared segments: 64 MiB cycles the slots
// many times per call, 1 MiB fits in them.
TEST(PeerFailure, KilledRankIsNamedWithinTenSeconds) {
  for (int n : {2, 3}) {
    for (size_t bytes : {size_t(64) << 20, size_t(1) << 20}) expect_killed_rank_named(n, bytes);
  }
}

// With heartbeats off the store still records a rank whose connection
// drops, and the liveness thread's poll still finds it.
TEST(PeerFailure, KilledRankIsNamedWithHeartbeatsOff) {
  CommOptions base;
  base.heartbeat = std::chrono::milliseconds(0);
  expect_killed_rank_named(3, size_t(1) << 20, base);
}

// ---- Fault-injection matrix ------------------------------------------------
//
// One case: n ranks loop on all-reduces of `bytes`; after `delay` the test
// sends `sig` to the last rank. Every survivor must fail with a PeerFailure
// naming that rank within 3 heartbeats of the fault (a stopped rank is only
// found by its silence), and none may report success. A hard wall-clock guard
// kills everything on a hang.

struct FaultCase {
  int ranks;
  size_t bytes;
  int sig;
  int delay_ms;
  bool shared_memory;
  std::string name() const {
    return std::to_string(ranks) + "ranks_" + std::to_string(bytes) + "B_" + (sig == SIGKILL ? "KILL" : "STOP") + "_" +
           std::to_string(delay_ms) + "ms_" + (shared_memory ? "shm" : "ucx");
  }
};

constexpr auto kTestHeartbeat = 1000ms;

// What the ranks report back, in memory shared across fork().
struct FaultReport {
  std::atomic<int64_t> caught_ns[8];  // steady-clock time each rank caught its failure
  char message[8][512];
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

void run_fault_case(const FaultCase& c, std::chrono::milliseconds heartbeat = kTestHeartbeat) {
  SCOPED_TRACE(c.name());
  auto* report = static_cast<FaultReport*>(
      mmap(nullptr, sizeof(FaultReport), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(report, MAP_FAILED);
  new (report) FaultReport{};
  const int victim = c.ranks - 1;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  CommOptions base;
  base.heartbeat = heartbeat;
  ring::RingOptions ring_base;
  ring_base.shared_memory = c.shared_memory;
  base.timeout = 60s;  // far beyond the bound: only liveness can name the rank in time
  RankGroup group(
      c.ranks,
      [&](const CommOptions& o) {
        close(ready[0]);
        auto comm = ring::connect(o, ring_base);
        std::vector<float> data(std::max<size_t>(1, c.bytes / sizeof(float)), 1.0f);
        try {
          // Rank 0 signals after its first call; the others may still be in theirs.
          comm->allreduce(data.data(), data.size(), DataType::f32, ReduceOp::sum);
          if (comm->rank() == 0) (void)!write(ready[1], "x", 1);
          for (;;) comm->allreduce(data.data(), data.size(), DataType::f32, ReduceOp::sum);
        } catch (const PeerFailure& e) {
          report->caught_ns[o.rank] = now_ns();
          fprintf(stderr, "[rank %d] %s\n", o.rank, e.what());
          snprintf(report->message[o.rank], sizeof report->message[o.rank], "%s", e.what());
          return kNamedVictim + std::max(0, e.rank());
        } catch (const std::exception& e) {
          snprintf(report->message[o.rank], sizeof report->message[o.rank], "%s", e.what());
          return 6;
        }
      },
      base);
  close(ready[1]);
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  close(ready[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(c.delay_ms));
  const int64_t fault_ns = now_ns();
  kill(group.pid(victim), c.sig);
  const auto codes = group.wait_for_all_but(victim, 30s);
  for (int r = 0; r < c.ranks; ++r) {
    if (r != victim && report->caught_ns[r] > 0)
      fprintf(stderr, "%s (heartbeat %lld ms): rank %d named the failure %lld ms after the fault\n", c.name().c_str(),
              (long long)heartbeat.count(), r, (long long)((report->caught_ns[r] - fault_ns) / 1000000));
  }
  for (int r = 0; r < c.ranks; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(codes[r], kNamedVictim + victim) << "rank " << r << ": " << report->message[r];
    const int64_t caught = report->caught_ns[r].load();
    EXPECT_GT(caught, 0) << "rank " << r << " never caught a PeerFailure: " << report->message[r];
    if (caught > 0) {
      EXPECT_LT(caught - fault_ns, 3 * std::chrono::nanoseconds(heartbeat).count())
          << "rank " << r << " named the failure after " << (caught - fault_ns) / 1000000
          << " ms: " << report->message[r];
    }
    const std::string msg = report->message[r];
    EXPECT_NE(msg.find("rank " + std::to_string(victim) + " (host "), std::string::npos) << msg;
    EXPECT_NE(msg.find("allreduce #"), std::string::npos) << msg;
    if (c.sig == SIGSTOP && codes[r] == kNamedVictim + victim) {
      EXPECT_NE(msg.find("no heartbeat"), std::string::npos) << msg;
    }
  }
  munmap(report, sizeof(FaultReport));
}

// The quick subset: {2, 3 ranks} x {4 B, 16 MiB} x {SIGKILL, SIGSTOP}; the
// path and the delay alternate so that each signal meets both paths.
// A rank that registers with the store and dies before the wire-up is done:
// the others' create() fails within a wait slice, naming it, instead of at
// the connect timeout.
TEST(PeerFailure, ARankDeadDuringTheWireUpIsNamed) {
  CommOptions base;
  base.connect_timeout = std::chrono::seconds(30);
  RankGroup group(
      3,
      [](const CommOptions& o) {
        if (o.rank == 2) {
          const auto colon = o.store_address.rfind(':');
          StoreClient store(o.store_address.substr(0, colon), uint16_t(std::stoi(o.store_address.substr(colon + 1))),
                            Clock::now() + std::chrono::seconds(5), o.secret);
          store.hello(2, Clock::now() + std::chrono::seconds(5));
          _exit(0);  // no goodbye: the store records rank 2 as failed
        }
        const auto start = Clock::now();
        try {
          ring::connect(o, {});
          ADD_FAILURE() << "create() returned without rank 2";
        } catch (const PeerFailure& e) {
          EXPECT_EQ(e.rank(), 2) << e.what();
          EXPECT_NE(std::string(e.what()).find("failed while the communicator was being set up"), std::string::npos)
              << e.what();
          EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << e.what();
        }
        return 0;
      },
      base);
  group.expect_success(std::chrono::seconds(60));
}

TEST(FaultMatrix, QuickSubset) {
  int i = 0;
  for (int ranks : {2, 3}) {
    for (size_t bytes : {size_t(4), size_t(16) << 20}) {
      for (int sig : {SIGKILL, SIGSTOP}) {
        const bool shared = ((i >> 1) ^ i) & 1;
        run_fault_case(FaultCase{ranks, bytes, sig, std::array{0, 5, 50}[i % 3], shared});
        ++i;
      }
    }
  }
}

// With the default heartbeat (2 s), a stopped rank is named within 6 s, on
// the shared-memory path and with shared memory off (TANDEM_SHM=0).
TEST(Liveness, StoppedRankIsNamedWithinThreeDefaultHeartbeats) {
  ASSERT_EQ(CommOptions{}.heartbeat, 2s);
  for (bool shared : {true, false}) run_fault_case(FaultCase{2, 1 << 20, SIGSTOP, 5, shared}, CommOptions{}.heartbeat);
}

// The whole matrix: ctest -L full (fault_matrix_full), about 108 cases.
class FaultMatrixFull : public ::testing::TestWithParam<std::tuple<int, size_t, int, int, bool>> {};

TEST_P(FaultMatrixFull, DISABLED_EverySurvivorNamesTheFaultyRank) {
  auto [ranks, bytes, sig, delay, shared] = GetParam();
  run_fault_case(FaultCase{ranks, bytes, sig, delay, shared});
}

INSTANTIATE_TEST_SUITE_P(All, FaultMatrixFull,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(size_t(4), size_t(1024), size_t(16) << 20),
                                            ::testing::Values(SIGKILL, SIGSTOP), ::testing::Values(0, 5, 50),
                                            ::testing::Bool()));

// A job with a secret completes while clients without it, with a wrong one,
// or replaying nothing but a bare write are turned away, changing nothing.
TEST(JobSecret, SecuredJobCompletesWhileIntrudersAreRejected) {
  CommOptions base;
  base.secret = std::string(64, 'k');
  RankGroup group(
      3,
      [](const CommOptions& o) {
        auto comm = ring::connect(o, {});
        std::vector<float> x(4096, 1.0f);
        for (int i = 0; i < 2000; ++i) {  // outlasts the intruders below
          std::fill(x.begin(), x.end(), 1.0f);
          comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
          if (x[0] != 3.0f) return 9;
        }
        return 0;
      },
      base);
  const uint16_t port = group.store().port();
  int missing = 0, wrong = 0;
  for (int i = 0; i < 20; ++i) {
    try {
      StoreClient intruder("127.0.0.1", port, Clock::now() + 2s);
      intruder.set(kFailedRanksKey, "0", Clock::now() + 2s);
    } catch (const InvalidArgument& e) {
      missing += std::string(e.what()).find("requires the job secret") != std::string::npos;
    }
    try {
      StoreClient intruder("127.0.0.1", port, Clock::now() + 2s, std::string(64, 'x'));
      intruder.hello(1, Clock::now() + 2s);
    } catch (const InvalidArgument& e) {
      wrong += std::string(e.what()).find("wrong job secret") != std::string::npos;
    }
    std::this_thread::sleep_for(20ms);
  }
  group.expect_success(60s);
  EXPECT_EQ(missing, 20);
  EXPECT_EQ(wrong, 20);
  EXPECT_TRUE(group.store().failed_ranks().empty());
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
  const std::string out_path = ::testing::TempDir() + "tandem_failure_test_" + std::to_string(getpid()) + ".log";
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
