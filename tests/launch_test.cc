// `tandem launch` end to end: runs the built executable (env TANDEM_BIN) on
// small shell commands and checks environment, output relay, exit codes and
// clean-up. Every run goes through run_tandem(), which kills the launcher at
// a hard wall-clock limit, so a launcher bug fails a test instead of hanging it.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "scratch_dir.h"
#include "tandem/bootstrap.h"
#include "tandem/store.h"

namespace {

using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;

struct RunResult {
  int exit_code = -1;  // shell-style: 128 + signal when killed
  std::string out, err;
  double seconds = 0;
  bool hit_limit = false;  // the guard had to kill the launcher
};

struct RunOptions {
  double limit_seconds = 20;
  int send_signal = 0;  // sent to the launcher after signal_after_seconds
  double signal_after_seconds = 0;
};

std::string tandem_bin() {
  const char* bin = std::getenv("TANDEM_BIN");
  return bin ? bin : "";
}

// Runs argv_s (argv_s[0] a path) with stdout and stderr captured; never outlives limit_seconds (+1 s drain).
RunResult run_program(std::vector<std::string> argv_s, RunOptions opts = {}) {
  RunResult r;
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe failed";
    return r;
  }
  auto start = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);

  auto limit = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.limit_seconds));
  auto signal_at =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.signal_after_seconds));
  bool signal_sent = opts.send_signal == 0;
  std::optional<Clock::time_point> stop_reading;
  int fds[2] = {out[0], err[0]};
  std::string* sinks[2] = {&r.out, &r.err};
  while (fds[0] >= 0 || fds[1] >= 0) {
    auto now = Clock::now();
    if (!signal_sent && now >= signal_at) {
      ::kill(pid, opts.send_signal);
      signal_sent = true;
    }
    if (!r.hit_limit && now >= limit) {
      r.hit_limit = true;
      ::kill(pid, SIGKILL);
      stop_reading = now + std::chrono::seconds(1);  // its ranks' descendants may hold the pipes
    }
    if (stop_reading && now >= *stop_reading) break;
    pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    ::poll(p, 2, 20);
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      ssize_t n = ::read(fds[i], buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else {
        ::close(fds[i]);
        fds[i] = -1;
      }
    }
  }
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
  // Pipes closed: the launcher has exited or is about to; bound the wait anyway.
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= limit && !r.hit_limit) {
      r.hit_limit = true;
      ::kill(pid, SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs `tandem args...` as run_program does.
RunResult run_tandem(const std::vector<std::string>& args, RunOptions opts = {}) {
  std::vector<std::string> argv{tandem_bin()};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_program(argv, opts);
}

std::string describe(const RunResult& r) {
  std::ostringstream s;
  s << "exit " << r.exit_code << " after " << r.seconds << "s" << (r.hit_limit ? " (KILLED BY TEST GUARD)" : "")
    << "\n--- stdout ---\n"
    << r.out.substr(0, 4000) << "\n--- stderr ---\n"
    << r.err.substr(0, 4000);
  return s.str();
}

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tandem_bin().empty()) << "TANDEM_BIN must name the built `tandem` executable (ctest sets it)";
    ASSERT_EQ(::access(tandem_bin().c_str(), X_OK), 0) << tandem_bin() << " is not executable";
  }
};

TEST_F(LaunchTest, SetsRankEnvironmentAndPrefixesEachLine) {
  RunResult r = run_tandem({"launch", "-n", "3", "--", "sh", "-c",
                            "echo hi $TANDEM_RANK/$TANDEM_WORLD_SIZE; "
                            "echo local $TANDEM_LOCAL_RANK/$TANDEM_LOCAL_WORLD_SIZE; "
                            "echo store $TANDEM_STORE_ADDR; echo oops >&2; printf 'no newline'"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (int rank = 0; rank < 3; ++rank) {
    std::string p = "[" + std::to_string(rank) + "] ";
    EXPECT_THAT(r.out, HasSubstr(p + "hi " + std::to_string(rank) + "/3\n")) << describe(r);
    EXPECT_THAT(r.out, HasSubstr(p + "local " + std::to_string(rank) + "/3\n")) << describe(r);
    EXPECT_THAT(r.out, HasSubstr(p + "no newline\n")) << "a partial last line is flushed at EOF\n" << describe(r);
    EXPECT_THAT(r.err, HasSubstr(p + "oops\n")) << "stderr goes to stderr\n" << describe(r);
  }
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[0\] store 127\.0\.0\.1:(\d+)\n)"))) << describe(r);
  int port = std::stoi(m[1]);
  EXPECT_GT(port, 0);
  EXPECT_LT(port, 65536);
  EXPECT_THAT(r.out, HasSubstr("[2] store 127.0.0.1:" + std::to_string(port) + "\n")) << "one store for all ranks";
}

// Every worker also gets torchrun's variables, so torch.distributed's env://
// works unchanged: rank 0's TCPStore at MASTER_ADDR:MASTER_PORT, a free port
// other than tandem's store's; stale values in the launcher's environment
// are replaced, not duplicated.
TEST_F(LaunchTest, SetsTorchrunsVariablesForEveryWorker) {
  ::setenv("RANK", "7", 1);
  ::setenv("GROUP_RANK", "3", 1);
  RunResult r =
      run_tandem({"launch", "-n", "2", "--", "sh", "-c",
                  "echo torch $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK "
                  "$MASTER_ADDR $MASTER_PORT $TANDEM_STORE_ADDR; env | grep -c -e '^RANK=' -e '^GROUP_RANK='"});
  ::unsetenv("RANK");
  ::unsetenv("GROUP_RANK");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(r.out, m, std::regex(R"(\[0\] torch 0 0 2 2 0 127\.0\.0\.1 (\d+) 127\.0\.0\.1:(\d+)\n)")))
      << describe(r);
  const std::string master_port = m[1], store_port = m[2];
  EXPECT_NE(master_port, store_port) << "torch's store and tandem's need ports of their own";
  EXPECT_GT(std::stoi(master_port), 0);
  EXPECT_LT(std::stoi(master_port), 65536);
  EXPECT_THAT(r.out, HasSubstr("[1] torch 1 1 2 2 0 127.0.0.1 " + master_port + " 127.0.0.1:" + store_port + "\n"))
      << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] 2\n")) << "one RANK and one GROUP_RANK each\n" << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[1] 2\n")) << describe(r);
}

// MASTER_ADDR and MASTER_PORT the user exported are kept; across hosts the
// rest follow the placement (GROUP_RANK: the host's index, LOCAL_WORLD_SIZE:
// its workers); parameter servers get none of them.
TEST_F(LaunchTest, TorchrunsVariablesFollowThePlacementAndTheUser) {
  const std::string show =
      "echo torch ${REMOTE_HOST:-here} ${RANK-none} ${LOCAL_RANK-none} ${WORLD_SIZE-none} "
      "${LOCAL_WORLD_SIZE-none} ${GROUP_RANK-none} ${MASTER_ADDR-none}:${MASTER_PORT-none}";
  RunResult r = run_tandem({"launch", "-H", "alpha:2,beta:1", "--rsh", "env REMOTE_HOST={host} sh -c", "--store-addr",
                            "127.0.0.1", "--", "sh", "-c", show});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[0\] torch alpha 0 0 3 2 0 alpha:(\d+)\n)"))) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[1] torch alpha 1 1 3 2 0 alpha:" + m[1].str() + "\n")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[2] torch beta 2 0 3 1 1 alpha:" + m[1].str() + "\n")) << describe(r);

  ::setenv("MASTER_ADDR", "localhost", 1);
  ::setenv("MASTER_PORT", "29999", 1);
  r = run_tandem({"launch", "-n", "2", "--servers", "1", "--timeout", "2", "--", "sh", "-c", show});
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  // The workers only print; the server waits for them in vain until --timeout.
  EXPECT_THAT(r.out, HasSubstr("[0] torch here 0 0 2 2 0 localhost:29999\n")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[1] torch here 1 1 2 2 0 localhost:29999\n")) << describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("[2] torch"))) << "the server runs `tandem ps serve`\n" << describe(r);
}

// An exported MASTER_PORT that is the store's own port on rank 0's host is a usage error.
TEST_F(LaunchTest, MasterPortOnTheStoresPortIsAUsageError) {
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  ::setenv("MASTER_PORT", port.c_str(), 1);
  RunResult r = run_tandem(
      {"launch", "-H", "localhost:1,beta:1", "--rsh", "sh -c", "--store-addr", "127.0.0.1:" + port, "--", "true"});
  ::unsetenv("MASTER_PORT");
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("MASTER_PORT=" + port + " is the port of tandem's store")) << describe(r);
}

// torch.distributed's default env:// rendezvous under tandem launch, unchanged
// (gloo; the "tandem" backend is checked in c_api_test).
TEST_F(LaunchTest, TorchInitProcessGroupFromTheEnvironment) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed (python3-torch)";
  const std::string script =
      "import torch, torch.distributed as dist\n"
      "dist.init_process_group('gloo')\n"
      "t = torch.ones(1) * (dist.get_rank() + 1)\n"
      "dist.all_reduce(t)\n"
      "print('gloo', dist.get_rank(), dist.get_world_size(), int(t.item()), flush=True)\n"
      "dist.destroy_process_group()\n";
  RunOptions limit;
  limit.limit_seconds = 60;
  RunResult r = run_tandem({"launch", "-n", "2", "--timeout", "50", "--", "/usr/bin/python3", "-c", script}, limit);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] gloo 0 2 3\n")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[1] gloo 1 2 3\n")) << describe(r);
}

// --bind auto (the default): ranks on this host get disjoint, equal shares of
// the launcher's CPUs while there are enough; otherwise one CPU each, dealt
// round-robin. With --bind none every rank keeps all of them.
TEST_F(LaunchTest, RanksAreBoundToTheirShareOfTheCpus) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  const int cpus = CPU_COUNT(&allowed);
  if (cpus < 2) GTEST_SKIP() << "needs at least 2 CPUs (this process may use " << cpus << ")";
  auto masks = [&](const std::vector<std::string>& args) {
    RunResult r = run_tandem(args);
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    std::vector<std::string> out;
    const std::regex line(R"(\[(\d+)\] Cpus_allowed_list:\s*(\S+))");
    std::smatch m;
    for (auto it = r.out.cbegin(); std::regex_search(it, r.out.cend(), m, line); it = m.suffix().first) {
      const size_t rank = std::stoul(m[1]);
      if (out.size() <= rank) out.resize(rank + 1);
      out[rank] = m[2];
    }
    return out;
  };
  const std::string show = "grep Cpus_allowed_list /proc/self/status";
  const auto bound = masks({"launch", "-n", "2", "--", "sh", "-c", show});
  ASSERT_EQ(bound.size(), 2u);
  EXPECT_NE(bound[0], bound[1]) << "each rank its own CPUs";
  const auto unbound = masks({"launch", "-n", "2", "--bind", "none", "--", "sh", "-c", show});
  ASSERT_EQ(unbound.size(), 2u);
  EXPECT_EQ(unbound[0], unbound[1]);
  EXPECT_NE(unbound[0], bound[0]);
  const auto crowded = masks({"launch", "-n", std::to_string(cpus + 1), "--", "sh", "-c", show});
  ASSERT_EQ(crowded.size(), size_t(cpus + 1));
  EXPECT_EQ(crowded.front(), crowded.back()) << "more ranks than CPUs: rank " << cpus << " back on rank 0's CPU";
  EXPECT_NE(crowded[0], crowded[1]) << "ranks 0 and 1 on different CPUs";
  EXPECT_NE(crowded[0], unbound[0]) << "one CPU each, not all of them";
  EXPECT_EQ(crowded[0].find_first_of(",-"), std::string::npos) << "a single CPU: " << crowded[0];
}

// -H: ranks fill each host's slots in order; other hosts run through the
// remote shell (here a local `sh -c` that records the host), which gets the
// job variables on its command line and the secret on its standard input only.
TEST_F(LaunchTest, HostListPlacesRanksHostMajorThroughTheRemoteShell) {
  RunResult r =
      run_tandem({"launch", "-H", "alpha:2,beta:1,localhost:1", "--rsh", "env REMOTE_HOST={host} sh -c", "--store-addr",
                  "127.0.0.1", "--", "sh", "-c",
                  "echo at ${REMOTE_HOST:-here} $TANDEM_RANK $TANDEM_LOCAL_RANK/$TANDEM_LOCAL_WORLD_SIZE "
                  "$TANDEM_WORLD_SIZE ${#TANDEM_SECRET} $TANDEM_STORE_ADDR; "
                  "cat /proc/$$/cmdline /proc/$PPID/cmdline | tr '\\0' ' ' | grep -c \"$TANDEM_SECRET\" || true"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[0\] at alpha 0 0/2 4 64 127\.0\.0\.1:(\d+)\n)")))
      << describe(r);
  const std::string store = "127.0.0.1:" + m[1].str();
  EXPECT_THAT(r.out, HasSubstr("[1] at alpha 1 1/2 4 64 " + store + "\n")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[2] at beta 2 0/1 4 64 " + store + "\n")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[3] at here 3 0/1 4 64 " + store + "\n")) << "localhost runs directly\n" << describe(r);
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_THAT(r.out, HasSubstr("[" + std::to_string(rank) + "] 0\n")) << "the secret is on no command line\n"
                                                                        << describe(r);
  EXPECT_THAT(r.err, HasSubstr("4 ranks on alpha:2, beta:1, localhost:1 (host-major)")) << describe(r);
}

TEST_F(LaunchTest, BadHostListsAreUsageErrors) {
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"launch", "-H", "a:x", "--", "true"}, "-H entry 'a:x' is not host or host:slots"},
           {{"launch", "-H", "a:0", "--", "true"}, "-H entry 'a:0'"},
           {{"launch", "-H", "a:2", "-n", "3", "--", "true"},
            "-n 3 asks for more ranks than the hosts (-H or --hostfile) offer (2"},
           {{"launch", "-H", "a:2", "--servers", "1", "--", "true"}, "--servers cannot be combined with -H"},
           {{"launch", "--", "true"}, "say how many ranks: -n/--nprocs N"},
           {{"launch", "-H", "a:1", "--rsh", "no-such-rsh {host}", "--", "true"},
            "the remote shell (--rsh): no-such-rsh"},
       }) {
    RunResult r = run_tandem(args);
    EXPECT_NE(r.exit_code, 0) << describe(r);
    EXPECT_THAT(r.err, HasSubstr(message)) << describe(r);
  }
}

std::string write_file(const std::string& stem, const std::string& text) {
  std::string path = tandem::testing::scratch_template(stem);
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return "";
  ::close(fd);
  std::ofstream(path) << text;
  return path;
}

// --hostfile: Open MPI's and Horovod's `host slots=N` lines, MPICH's `host:N`
// and bare hosts (1 slot), with comments and blank lines; a host listed again
// adds its slots; -n below the slots fills them in order.
TEST_F(LaunchTest, HostfileInEveryShapePlacesRanksAsMpirun) {
  const std::string hostfile = write_file("hostfile",
                                          "# Open MPI / Horovod\n"
                                          "alpha slots=2 max_slots=4   # two here\n"
                                          "\n"
                                          "beta:1\n"
                                          "   gamma\n"
                                          "localhost slots=1\n"
                                          "alpha slots=1\n");
  RunResult r = run_tandem({"launch", "--hostfile", hostfile, "-n", "5", "--rsh", "env REMOTE_HOST={host} sh -c",
                            "--store-addr", "127.0.0.1", "--", "sh", "-c",
                            "echo at ${REMOTE_HOST:-here} $TANDEM_RANK $TANDEM_LOCAL_RANK/$TANDEM_LOCAL_WORLD_SIZE"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("5 ranks on alpha:3, beta:1, gamma:1, localhost:1 (host-major)")) << describe(r);
  for (const char* line : {"[0] at alpha 0 0/3\n", "[1] at alpha 1 1/3\n", "[2] at alpha 2 2/3\n",
                           "[3] at beta 3 0/1\n", "[4] at gamma 4 0/1\n"})
    EXPECT_THAT(r.out, HasSubstr(line)) << describe(r);
  EXPECT_THAT(r.out, Not(HasSubstr("at here"))) << "localhost's slot is past -n 5\n" << describe(r);
  std::remove(hostfile.c_str());
}

// --oversubscribe: ranks past the slots go one per host in turn, never past
// a host's max_slots (mpirun's); without it, -n above the slots is refused.
TEST_F(LaunchTest, OversubscribedRanksGoOnePerHostInTurn) {
  const std::string hostfile = write_file("hostfile", "alpha slots=1 max_slots=2\nbeta slots=1\n");
  const std::vector<std::string> common = {"--hostfile",   hostfile,   "--rsh", "env REMOTE_HOST={host} sh -c",
                                           "--store-addr", "127.0.0.1"};
  std::vector<std::string> args = {"launch", "-n", "5", "--oversubscribe"};
  args.insert(args.end(), common.begin(), common.end());
  args.insert(args.end(),
              {"--", "sh", "-c", "echo at $REMOTE_HOST $TANDEM_RANK $TANDEM_LOCAL_RANK/$TANDEM_LOCAL_WORLD_SIZE"});
  RunResult r = run_tandem(args);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* line : {"[0] at alpha 0 0/2\n", "[1] at alpha 1 1/2\n", "[2] at beta 2 0/3\n", "[3] at beta 3 1/3\n",
                           "[4] at beta 4 2/3\n"})
    EXPECT_THAT(r.out, HasSubstr(line)) << describe(r);
  args = {"launch", "-n", "3"};
  args.insert(args.end(), common.begin(), common.end());
  args.insert(args.end(), {"--", "true"});
  r = run_tandem(args);
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_THAT(r.err,
              HasSubstr("(2 slots); add hosts or slots, leave -n out to use every slot, or give --oversubscribe"))
      << describe(r);
  std::remove(hostfile.c_str());
  const std::string capped = write_file("hostfile", "alpha slots=1 max_slots=2\nbeta:1 max_slots=1\n");
  r = run_tandem({"launch", "-n", "4", "--oversubscribe", "--hostfile", capped, "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("-n 4 asks for more ranks than the hosts' max_slots allow")) << describe(r);
  std::remove(capped.c_str());
}

TEST_F(LaunchTest, BadHostfilesAreUsageErrors) {
  const std::vector<std::pair<std::string, std::string>> files = {
      {"a slots=x\n", "line 1: 'slots=x' needs a count of 1..1024"},
      {"a\nb cpus=2\n", "line 2: 'cpus=2' is not slots=N or max_slots=N"},
      {"a:2 slots=2\n", "line 1: the slots are given twice"},
      {"a slots=4 max_slots=2\n", "line 1: slots=4 exceeds max_slots=2"},
      {"a:0\n", "line 1: 'a:0' is not a host, or not host:N"},
      {"# nothing\n\n", "names no host"},
      {"a slots=2\n", "-n 3 asks for more ranks than the hosts (-H or --hostfile) offer (2 slots)"},
  };
  for (const auto& [text, message] : files) {
    const std::string hostfile = write_file("hostfile", text);
    RunResult r = run_tandem({"launch", "--hostfile", hostfile, "-n", "3", "--", "true"});
    EXPECT_EQ(r.exit_code, 2) << text << describe(r);
    EXPECT_THAT(r.err, HasSubstr(message)) << text << describe(r);
    std::remove(hostfile.c_str());
  }
  RunResult r = run_tandem({"launch", "--hostfile", "/nonexistent/hosts", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("cannot read the hostfile '/nonexistent/hosts'")) << describe(r);
  r = run_tandem({"launch", "-H", "a:1", "--hostfile", "/nonexistent/hosts", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("-H and --hostfile both name hosts; give one of them")) << describe(r);
}

// -x NAME (its value here), -x NAME=value and --env NAME=value reach every
// rank, here and through the remote shell (whose line must carry them: it
// does not inherit them, unlike TANDEM_* ones), whatever the value holds.
TEST_F(LaunchTest, ExportedVariablesReachLocalAndRemoteRanks) {
  const std::string awkward = "a b  'q' \"d\" $HOME `x` \\ ; *";
  ::setenv("LAUNCH_TEST_EXPORTED", awkward.c_str(), 1);
  const std::string show =
      "printf 'got %s|%s|%s|%s|%s\\n' \"${REMOTE_HOST:-here}\" \"$LAUNCH_TEST_EXPORTED\" \"$OMP_NUM_THREADS\" "
      "\"$SPACED\" \"${EMPTY-unset}\"";
  for (const std::vector<std::string>& hosts :
       {std::vector<std::string>{"-n", "2"}, std::vector<std::string>{"-H", "alpha:1,localhost:1"}}) {
    std::vector<std::string> args = {"launch"};
    args.insert(args.end(), hosts.begin(), hosts.end());
    // No "--": each -x and --env takes one word, the command starts after them.
    for (const char* a : {"--rsh", "env -u LAUNCH_TEST_EXPORTED REMOTE_HOST={host} sh -c", "--store-addr", "127.0.0.1",
                          "-x", "LAUNCH_TEST_EXPORTED", "-x", "OMP_NUM_THREADS=3", "--env", "SPACED=two  words $1",
                          "--env", "EMPTY=", "sh", "-c"})
      args.push_back(a);
    args.push_back(show);
    RunResult r = run_tandem(args);
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    const std::string values = "|" + awkward + "|3|two  words $1|\n";
    if (hosts[0] == "-n") {
      EXPECT_THAT(r.out, HasSubstr("[0] got here" + values)) << describe(r);
      EXPECT_THAT(r.out, HasSubstr("[1] got here" + values)) << describe(r);
    } else {
      EXPECT_THAT(r.out, HasSubstr("[0] got alpha" + values)) << "the remote shell unset it: the line carries it\n"
                                                              << describe(r);
      EXPECT_THAT(r.out, HasSubstr("[1] got here" + values)) << describe(r);
    }
  }
  ::unsetenv("LAUNCH_TEST_EXPORTED");
}

TEST_F(LaunchTest, BadEnvironmentFlagsAreUsageErrors) {
  ::unsetenv("TANDEM_TEST_NOT_SET");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-x", "1A=3"}, "-x/--env '1A=3': '1A' is not a variable name"},
      {{"--env", "=x"}, "'' is not a variable name"},
      {{"--env", "A-B=x"}, "'A-B' is not a variable name"},
      {{"-x", "TANDEM_TEST_NOT_SET"}, "-x/--env TANDEM_TEST_NOT_SET has no value: give TANDEM_TEST_NOT_SET=value"},
      {{"--env", "OMP_NUM_THREADS"}, "-x/--env OMP_NUM_THREADS has no value"},
      {{"--env", "TANDEM_RANK=3"}, "-x/--env TANDEM_RANK: tandem launch sets it for each rank"},
      {{"-x", "TANDEM_SECRET=x"}, "-x/--env TANDEM_SECRET: tandem launch sets it for each rank"},
      {{"-x", "WORLD_SIZE=9"}, "-x/--env WORLD_SIZE: tandem launch sets it for each rank"},
      {{"-x", "A=1", "--env", "A=2"}, "-x/--env A is given twice; give it once"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"launch", "-n", "1"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "true"});
    RunResult r = run_tandem(args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(flags) << describe(r);
    EXPECT_THAT(r.err, HasSubstr(message)) << ::testing::PrintToString(flags) << describe(r);
  }
}

// tandem's own tools run as ranks: they authenticate to the job's store.
TEST_F(LaunchTest, NetifRunsAsRanks) {
  RunResult r = run_tandem({"launch", "-n", "2", "--timeout", "30", "--", tandem_bin(), "netif"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] tandem network interface selection: 2 ranks on 1 host")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[1] rank 1: lo")) << describe(r);
}

// `tandem info` as a rank prints the shared-memory plan in force, with the
// variables that change it, and the path table with TANDEM_SHM_PATHS's rows.
TEST_F(LaunchTest, InfoPrintsTheSharedMemoryPlanInForce) {
  RunResult r = run_tandem({"launch", "-n", "3", "--", "sh", "-c",
                            tandem_bin() + " info; TANDEM_SHM_SPLIT_MIN_RANKS=4 TANDEM_SHM_CHUNK_BYTES=65536 " +
                                "TANDEM_SHM_PATHS=alltoall:heap:1M-=cma " + tandem_bin() + " info"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] shared memory for 3 ranks on this host:")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("staged all-reduce: split: each rank reduces its slice")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("staged all-reduce: every rank folds every slot")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("split from 4 ranks (TANDEM_SHM_SPLIT_MIN_RANKS)")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("4 slots of 64 KiB per rank")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] cpus: ")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0]     allreduce       heap    [0, 256K) staged, [256K, 16M] timed, (16M, inf) "
                               "staged\n"))
      << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0]     alltoall        heap    [0, 32K) staged, [32K, inf) timed\n")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0]     alltoall        heap    [0, 32K) staged, [32K, 1M) timed, [1M, inf) cma*\n"))
      << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0]     TANDEM_SHM_PATHS=alltoall:heap:1M-=cma\n")) << describe(r);
  // A bad row is named, with the choices.
  r = run_tandem(
      {"launch", "-n", "2", "--", "sh", "-c", "TANDEM_SHM_PATHS=alltoall:heap:*=fast " + tandem_bin() + " info"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("job environment: invalid: tandem: TANDEM_SHM_PATHS='alltoall:heap:*=fast' is invalid: "
                               "shared-memory path row 'alltoall:heap:*=fast': unknown path 'fast'; valid: staged, "
                               "mapped, cma, timed"))
      << describe(r);
  // Outside a job: the table in effect on this host still.
  r = run_tandem({"info"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("job environment: none")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("  alltoall        heap    [0, 32K) staged, [32K, inf) timed\n")) << describe(r);
}

// A fresh 32-byte secret per job, in the ranks' environment only: never on
// the launcher's or a rank's command line; the store admits only its holders.
TEST_F(LaunchTest, JobSecretTravelsInTheEnvironmentOnly) {
  RunResult r = run_tandem({"launch", "-n", "2", "--", "sh", "-c",
                            "echo secret $TANDEM_SECRET; "
                            "tr '\\0' ' ' < /proc/$PPID/cmdline; echo; tr '\\0' ' ' < /proc/$$/cmdline; echo"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\[0\] secret ([0-9a-f]+)\n)"))) << describe(r);
  const std::string secret = m[1];
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_THAT(r.out, HasSubstr("[1] secret " + secret + "\n")) << "one secret for all ranks";
  size_t seen = 0;
  for (size_t at = r.out.find(secret); at != std::string::npos; at = r.out.find(secret, at + 1)) ++seen;
  EXPECT_EQ(seen, 2u) << "only where echoed, not in a command line\n" << describe(r);
  EXPECT_THAT(r.out, HasSubstr(" launch -n 2 -- sh -c")) << "the launcher's command line was printed\n" << describe(r);
  RunResult again = run_tandem({"launch", "-n", "1", "--", "sh", "-c", "echo secret $TANDEM_SECRET"});
  EXPECT_THAT(again.out, Not(HasSubstr(secret))) << "a new secret per job";
}

TEST_F(LaunchTest, CommandMayCarryItsOwnFlagsWithoutDoubleDash) {
  RunResult r = run_tandem({"launch", "-n", "2", "sh", "-c", "echo flags ok $TANDEM_RANK", "-n", "5"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[1] flags ok 1\n")) << describe(r);
}

// mpirun's -np and -hostfile are the launcher's -n and --hostfile; the
// command's own words are left alone.
TEST_F(LaunchTest, MpirunsSingleDashSpellings) {
  const std::string hostfile = write_file("hostfile", "alpha slots=2\nbeta slots=2\n");
  RunResult r =
      run_tandem({"launch", "-np", "3", "-hostfile", hostfile, "--rsh", "env REMOTE_HOST={host} sh -c", "--store-addr",
                  "127.0.0.1", "sh", "-c", "echo at $REMOTE_HOST \"$@\"", "sh", "-np", "-hostfile"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("3 ranks on alpha:2, beta:2 (host-major)")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[2] at beta -np -hostfile\n")) << describe(r);
  std::remove(hostfile.c_str());
}

// python3 -m tandem.launch hands every flag to `tandem launch` (TANDEM_BIN names it here).
TEST_F(LaunchTest, PythonLauncherTakesTheSameFlags) {
  const std::string hostfile = write_file("hostfile", "alpha:1\nlocalhost slots=1\n");
  RunResult r =
      run_program({"/usr/bin/python3", std::string(TANDEM_SOURCE_DIR) + "/capi/python/tandem/launch.py", "-hostfile",
                   hostfile, "--rsh", "env REMOTE_HOST={host} sh -c", "--store-addr", "127.0.0.1", "-x",
                   "OMP_NUM_THREADS=2", "--", "sh", "-c", "echo py ${REMOTE_HOST:-here} $OMP_NUM_THREADS"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] py alpha 2\n")) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[1] py here 2\n")) << describe(r);
  std::remove(hostfile.c_str());
}

TEST_F(LaunchTest, FirstFailingRanksExitCodeIsPropagated) {
  RunResult r = run_tandem(
      {"launch", "-n", "3", "--grace", "1", "--", "sh", "-c", "if [ $TANDEM_RANK = 1 ]; then exit 7; fi; sleep 30"});
  EXPECT_EQ(r.exit_code, 7) << describe(r);
  EXPECT_LT(r.seconds, 1 + 3 + 3) << "grace 1 s, then SIGTERM, SIGKILL 3 s later at worst\n" << describe(r);
  EXPECT_THAT(r.err, HasSubstr("rank 1 exited with code 7")) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("rank 1 failed first")) << "the summary names the first failure\n" << describe(r);
}

TEST_F(LaunchTest, RankThatIgnoresSigtermIsKilled) {
  RunResult r = run_tandem({"launch", "-n", "2", "--grace", "0", "--", "sh", "-c",
                            "trap '' TERM; if [ $TANDEM_RANK = 0 ]; then sleep 0.3; exit 3; fi; "
                            "while :; do sleep 0.1; done"});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_GT(r.seconds, 3) << "SIGKILL only 3 s after SIGTERM\n" << describe(r);
  EXPECT_LT(r.seconds, 0.3 + 3 + 3) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("sending SIGKILL")) << describe(r);
}

TEST_F(LaunchTest, RankKilledBySignalGives128PlusSignal) {
  RunResult r = run_tandem({"launch", "-n", "2", "--grace", "1", "--", "sh", "-c",
                            "if [ $TANDEM_RANK = 1 ]; then kill -9 $$; fi; sleep 30"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("rank 1 killed by signal SIGKILL")) << describe(r);
}

TEST_F(LaunchTest, TimeoutKillsAHangingJob) {
  RunResult r = run_tandem({"launch", "-n", "2", "--timeout", "1", "--", "sleep", "30"});
  EXPECT_EQ(r.exit_code, 124) << describe(r);
  EXPECT_LT(r.seconds, 1 + 3 + 3) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("timeout")) << describe(r);
}

TEST_F(LaunchTest, SigtermToLauncherIsForwarded) {
  RunOptions o;
  o.send_signal = SIGTERM;
  o.signal_after_seconds = 0.5;
  RunResult r = run_tandem({"launch", "-n", "2", "--", "sleep", "30"}, o);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << describe(r);
  EXPECT_LT(r.seconds, 0.5 + 3 + 3) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("SIGTERM")) << describe(r);
}

TEST_F(LaunchTest, CommandNotFoundExits127) {
  RunResult r = run_tandem({"launch", "-n", "2", "--", "tandem-no-such-command-xyz"});
  EXPECT_EQ(r.exit_code, 127) << describe(r);
  EXPECT_THAT(r.err, HasSubstr("command not found")) << describe(r);
  r = run_tandem({"launch", "-n", "1", "--", "/nonexistent/dir/cmd"});
  EXPECT_EQ(r.exit_code, 127) << describe(r);
}

TEST_F(LaunchTest, BadFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"launch", "-n", "0", "--", "true"}, "-n must be between 1 and 1024"},
      {{"launch", "-n", "5000", "--", "true"}, "-n must be between 1 and 1024"},
      {{"launch", "-n", "abc", "--", "true"}, "nprocs"},
      {{"launch", "--", "true"}, "nprocs"},
      {{"launch", "-n", "2"}, "no command given"},
      {{"launch", "-n", "2", "--grace", "-1", "--", "true"}, "--grace"},
      {{"launch", "-n", "2", "--timeout", "x", "--", "true"}, "timeout"},
      {{"launch", "-n", "2", "--bind", "socket", "--", "true"}, "--bind must be auto or none"},
  };
  for (const Case& c : cases) {
    RunResult r = run_tandem(c.args);
    EXPECT_EQ(r.exit_code, 2) << ::testing::PrintToString(c.args) << "\n" << describe(r);
    EXPECT_THAT(r.err, HasSubstr(c.message)) << ::testing::PrintToString(c.args) << "\n" << describe(r);
  }
}

TEST_F(LaunchTest, LinesFromDifferentRanksNeverInterleave) {
  // 5000-byte lines exceed PIPE_BUF, so the writes themselves are not atomic;
  // only the launcher's line reassembly keeps them whole.
  RunResult r = run_tandem({"launch", "-n", "3", "--", "sh", "-c",
                            "L=$(head -c 5000 /dev/zero | tr '\\0' \"$TANDEM_RANK\"); i=0; "
                            "while [ $i -lt 200 ]; do echo \"$L\"; i=$((i+1)); done"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::istringstream lines(r.out);
  std::string line;
  int count[3] = {0, 0, 0};
  while (std::getline(lines, line)) {
    ASSERT_EQ(line.size(), 4 + 5000u) << "line: " << line.substr(0, 80);
    int rank = line[1] - '0';
    ASSERT_TRUE(rank >= 0 && rank < 3) << line.substr(0, 80);
    ASSERT_EQ(line.substr(0, 4), "[" + std::to_string(rank) + "] ");
    ASSERT_EQ(line.find_first_not_of(static_cast<char>('0' + rank), 4), std::string::npos)
        << "mixed line: " << line.substr(0, 80);
    ++count[rank];
  }
  EXPECT_EQ(count[0], 200);
  EXPECT_EQ(count[1], 200);
  EXPECT_EQ(count[2], 200);
}

std::string proc_stat(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  return text;
}

bool process_alive(pid_t pid) {
  const std::string text = proc_stat(pid);
  if (text.empty()) return false;
  auto close_paren = text.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < text.size() && text[close_paren + 2] != 'Z';
}

TEST_F(LaunchTest, DescendantsOfRanksAreCleanedUp) {
  std::string dir_template = tandem::testing::scratch_template("tandem-launch-test");
  ASSERT_NE(::mkdtemp(dir_template.data()), nullptr);
  std::string dir = dir_template;
  RunResult r = run_tandem({"launch", "-n", "2", "--timeout", "1", "--", "sh", "-c",
                            "sleep 30 & echo $! > " + dir + "/pid$TANDEM_RANK; wait"});
  EXPECT_EQ(r.exit_code, 124) << describe(r);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream f(dir + "/pid" + std::to_string(rank));
    pid_t pid = 0;
    ASSERT_TRUE(static_cast<bool>(f >> pid)) << "rank " << rank << " did not write its child's pid";
    auto until = Clock::now() + std::chrono::seconds(2);
    while (process_alive(pid) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(process_alive(pid)) << "rank " << rank << "'s child " << pid << " survived the launcher";
    ::unlink((dir + "/pid" + std::to_string(rank)).c_str());
  }
  ::rmdir(dir.c_str());
}

// `tandem launch` itself SIGKILLed, as early as the ranks have started: its
// ranks (PR_SET_PDEATHSIG) and what they started (the group guard kills their
// process groups) must not outlive it.
TEST_F(LaunchTest, KilledLauncherLeavesNoRanksOrTheirChildren) {
  std::string dir_template = tandem::testing::scratch_template("tandem-launch-test");
  ASSERT_NE(::mkdtemp(dir_template.data()), nullptr);
  const std::string dir = dir_template;
  const std::string body =
      "sleep 300 & echo $! > " + dir + "/child$TANDEM_RANK; echo $$ > " + dir + "/rank$TANDEM_RANK; wait";
  const std::string bin = tandem_bin();
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
    ::execl(bin.c_str(), bin.c_str(), "launch", "-n", "2", "--", "sh", "-c", body.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  std::vector<std::string> files;
  for (const char* what : {"rank", "child"})
    for (int r = 0; r < 2; ++r) files.push_back(dir + "/" + what + std::to_string(r));
  auto all_written = [&] {
    for (const auto& f : files) {
      std::ifstream in(f);
      pid_t pid = 0;
      if (!(in >> pid)) return false;
    }
    return true;
  };
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (!all_written() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(all_written()) << "the ranks did not start";
  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  for (const auto& f : files) {
    std::ifstream in(f);
    pid_t pid = 0;
    in >> pid;
    const auto limit = Clock::now() + std::chrono::seconds(3);
    while (process_alive(pid) && Clock::now() < limit) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(process_alive(pid)) << f << " (pid " << pid
                                     << ") outlived the SIGKILLed launcher; /proc stat: " << proc_stat(pid);
    if (process_alive(pid)) ::kill(pid, SIGKILL);
    ::unlink(f.c_str());
  }
  ::rmdir(dir.c_str());
}

// Runs this test binary itself as the ranks: rank 1 fails without ever
// talking to the store, so only the launcher can have recorded it there.
TEST_F(LaunchTest, FailureIsRecordedInTheStore) {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  RunResult r = run_tandem({"launch", "-n", "2", "--grace", "5", "--", self, "--gtest_also_run_disabled_tests",
                            "--gtest_filter=LaunchChild.DISABLED_StoreProbe"});
  EXPECT_EQ(r.exit_code, 3) << describe(r);
  EXPECT_THAT(r.out, HasSubstr("[0] failed_ranks=1\n")) << describe(r);
  EXPECT_LT(r.seconds, 5) << "rank 0 exits by itself once it sees the failure\n" << describe(r);
}

// Not a test on its own: the rank body for FailureIsRecordedInTheStore.
TEST(LaunchChild, DISABLED_StoreProbe) {
  const char* rank = std::getenv("TANDEM_RANK");
  const char* addr = std::getenv("TANDEM_STORE_ADDR");
  ASSERT_TRUE(rank && addr) << "run only under tandem launch";
  if (std::string(rank) == "1") std::_Exit(3);
  auto [host, port] = tandem::parse_host_port(addr);
  auto deadline = Clock::now() + std::chrono::seconds(10);
  tandem::StoreClient client(host, port, deadline, tandem::read_secret());  // the job secret tandem launch set
  std::string failed = client.get(tandem::kFailedRanksKey, deadline);
  std::printf("failed_ranks=%s\n", failed.c_str());
  std::fflush(stdout);
}

}  // namespace
