// `tandem launch --hostfile` over real ssh: two network namespaces on one
// bridge stand for two hosts, each running Debian's sshd (openssh-server) on
// port 2222 with a host key and a user key made here. The launcher runs in
// host 0 and reaches both hosts, itself included, through
// `ssh -p 2222 -i KEY ...`, so every rank starts the way it would on a
// cluster: one remote shell command line, the secret on its standard input.
// Checked: -x and --env values survive ssh and the remote login shell, a
// 4-rank all-reduce (2 hosts x 2 ranks, `tandem bench -c 1`) is correct, and
// a 2-host `tandem train` (resources.hosts, --rsh) finishes. The namespaces
// share the file system, so the same paths work on both "hosts".
// Skipped, saying why, without root, `ip netns`, sshd or (the training) the trainer.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "netns.h"
#include "scratch_dir.h"

namespace {

namespace fs = std::filesystem;
using tandem::testing::must;
using tandem::testing::NetnsLab;
using tandem::testing::shell;

constexpr auto kGuard = std::chrono::seconds(90);  // per run; three runs fit the CTest timeout
const std::vector<std::string> kAddresses = {"10.76.1.1", "10.76.1.2"};

std::string tandem_bin() {
  const char* bin = std::getenv("TANDEM_BIN");
  return bin ? bin : "";
}

std::string why_not_runnable() {
  if (tandem_bin().empty()) return "TANDEM_BIN is not set (ctest sets it to the built `tandem`)";
  if (std::string why = tandem::testing::netns_unavailable(); !why.empty()) return why;
  if (::access("/usr/sbin/sshd", X_OK) != 0) return "/usr/sbin/sshd is missing (apt-get install openssh-server)";
  if (shell("command -v ssh && command -v ssh-keygen").code != 0)
    return "ssh or ssh-keygen is missing (apt-get install openssh-client)";
  return "";
}

// Two hosts with sshd each, keys and a config in a directory of their own;
// the destructor stops every process left in the namespaces (sshd, its
// connections, ranks) before the lab deletes them.
class SshHosts {
 public:
  SshHosts() : lab_({"node-0", "node-1"}) {
    std::string dir_template = tandem::testing::scratch_template("ssh");
    if (::mkdtemp(dir_template.data()) == nullptr) throw std::runtime_error("mkdtemp " + dir_template + " failed");
    dir_ = dir_template;
    try {
      lab_.add_lan("s", "10.76.1", {"eth0", "eth0"});
      lab_.wait_up("eth0");
      must("ssh-keygen -q -t ed25519 -N '' -f " + dir_ + "/host_key");
      must("ssh-keygen -q -t ed25519 -N '' -f " + dir_ + "/user_key");
      must("cp " + dir_ + "/user_key.pub " + dir_ + "/authorized_keys");
      std::ofstream(dir_ + "/sshd_config") << "Port 2222\n"
                                           << "HostKey " << dir_ << "/host_key\n"
                                           << "AuthorizedKeysFile " << dir_ << "/authorized_keys\n"
                                           << "PidFile none\nUsePAM no\nPermitRootLogin yes\nStrictModes no\n"
                                           << "PasswordAuthentication no\nKbdInteractiveAuthentication no\n";
      must("mkdir -p /run/sshd");  // sshd's privilege separation directory
      for (int h = 0; h < 2; ++h) start_sshd(h);
      wait_for_sshd();
    } catch (...) {
      stop();
      throw;
    }
  }
  ~SshHosts() { stop(); }
  SshHosts(const SshHosts&) = delete;
  SshHosts& operator=(const SshHosts&) = delete;

  const std::string& dir() const { return dir_; }
  std::string rsh() const {
    return "ssh -p 2222 -i " + dir_ +
           "/user_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR";
  }

  // Runs `script` (a file of shell commands) in host 0, as node-0; returns its exit code and output.
  NetnsLab::Rank run_on_host0(const std::string& name, const std::string& script) {
    const std::string path = dir_ + "/" + name + ".sh";
    std::ofstream(path) << script;
    return lab_.run_ranks({0}, {"UCX_TLS=tcp,self"}, {"sh " + path}, kGuard)[0];
  }

 private:
  void stop() {
    for (int h = 0; h < 2; ++h) {
      std::istringstream pids(shell("ip netns pids " + lab_.ns(h)).output);
      for (pid_t pid; pids >> pid;) ::kill(pid, SIGKILL);
    }
    for (pid_t pid : sshd_) ::waitpid(pid, nullptr, 0);
    sshd_.clear();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void start_sshd(int h) {
    const std::string ns = lab_.ns(h), config = dir_ + "/sshd_config",
                      log = dir_ + "/sshd" + std::to_string(h) + ".log";
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // sshd (ip execs it) dies with a killed test
      ::execlp("ip", "ip", "netns", "exec", ns.c_str(), "/usr/sbin/sshd", "-D", "-f", config.c_str(), "-E", log.c_str(),
               static_cast<char*>(nullptr));
      ::_exit(127);
    }
    sshd_.push_back(pid);
  }

  void wait_for_sshd() {
    for (const std::string& address : kAddresses) {
      const std::string probe = "ip netns exec " + lab_.ns(0) + " " + rsh() + " " + address + " true";
      for (int attempt = 0; shell(probe).code != 0; ++attempt) {
        if (attempt == 50) throw std::runtime_error("sshd on " + address + " does not answer: " + shell(probe).output);
        ::usleep(100'000);
      }
    }
  }

  NetnsLab lab_;
  std::string dir_;
  std::vector<pid_t> sshd_;
};

class SshLaunch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = why_not_runnable(); !why.empty()) GTEST_SKIP() << why;
    hosts_ = std::make_unique<SshHosts>();
  }
  void TearDown() override { hosts_.reset(); }

  std::string hostfile(int slots) {
    const std::string path = hosts_->dir() + "/hostfile";
    std::ofstream f(path);
    f << "# two hosts, Open MPI's shape and MPICH's\n"
      << kAddresses[0] << " slots=" << slots << "\n"
      << kAddresses[1] << ":" << slots << "\n";
    return path;
  }
  std::string launch(const std::string& flags) {
    return tandem_bin() + " launch --timeout 60 --hostfile " + hostfile(2) + " --rsh '" + hosts_->rsh() +
           "' --store-addr " + kAddresses[0] + " " + flags;
  }

  std::unique_ptr<SshHosts> hosts_;
};

// -x and --env values reach every rank through ssh and the remote login
// shell unchanged (spaces, quotes, $, backslash); ranks 2 and 3 run on host 1.
TEST_F(SshLaunch, ExportedVariablesCrossSsh) {
  const std::string awkward = R"(a b  'q' "d" $HOME `x` \ ;)";
  std::string quoted = "'";
  for (char c : awkward) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  quoted += "'";
  const NetnsLab::Rank r = hosts_->run_on_host0(
      "exported", "export AWKWARD=" + quoted + "\n" + launch("-x AWKWARD --env 'SPACED=two  words'") +
                      " -- sh -c 'printf \"got %s %s|%s|%s\\n\" \"$TANDEM_RANK\" \"$(ip -br -4 addr show eth0 | "
                      "tr -s \" \" | cut -d\" \" -f3)\" \"$AWKWARD\" \"$SPACED\"'\n");
  ASSERT_EQ(r.code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string line = "[" + std::to_string(rank) + "] got " + std::to_string(rank) + " 10.76.1." +
                             std::to_string(1 + rank / 2) + "/24|" + awkward + "|two  words\n";
    EXPECT_NE(r.output.find(line), std::string::npos) << line << r.output;
  }
  EXPECT_NE(r.output.find("4 ranks on 10.76.1.1:2, 10.76.1.2:2 (host-major)"), std::string::npos) << r.output;
}

// 2 hosts x 2 ranks, each started by ssh: every size from 8 B to 256 KiB of the
// all-reduce is checked on every rank.
TEST_F(SshLaunch, FourRankAllReduceAcrossTwoHosts) {
  const NetnsLab::Rank r = hosts_->run_on_host0(
      "allreduce", launch("-- " + tandem_bin() + " bench allreduce -b 8 -e 256K -f 32 -n 3 -w 1 -c 1") + "\n");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[0] # Out of bounds values : 0 OK"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4 ranks on 10.76.1.1:2, 10.76.1.2:2"), std::string::npos) << r.output;
}

// `tandem train` with resources.hosts naming both hosts: one slot on each,
// started through the same ssh, synthetic data, 20 batches.
TEST_F(SshLaunch, TwoHostTraining) {
  const fs::path trainer = fs::path(tandem_bin()).parent_path() / "tandem-train";
  if (::access(trainer.c_str(), X_OK) != 0) GTEST_SKIP() << trainer << " is not built (it needs libtorch-dev)";
  const std::string dir = hosts_->dir();
  std::ofstream(dir + "/exp.yaml")
      << "name: ssh\n"
      << "hyperparameters: {global_batch_size: 32, learning_rate: 0.05, momentum: 0.9, model: mlp, mlp_hidden: 64, "
         "dropout: 0}\n"
      << "resources: {slots_per_trial: 2, slots_per_host: 1, hosts: [" << kAddresses[0] << ", " << kAddresses[1]
      << "]}\n"
      << "searcher: {name: single, metric: validation_accuracy, max_length: {batches: 20}}\n"
      << "records_per_epoch: 2048\n"
      << "reproducibility: {experiment_seed: 3}\n"
      << "data: synthetic\n";
  const NetnsLab::Rank r = hosts_->run_on_host0(
      "train", "timeout -k 5 80 " + tandem_bin() + " train " + dir + "/exp.yaml --output " + dir + "/out --rsh '" +
                   hosts_->rsh() + "' --store-addr " + kAddresses[0] + " --quiet\n");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 ranks on 10.76.1.1:1, 10.76.1.2:1"), std::string::npos) << r.output;
  std::ifstream metrics(dir + "/out/metrics.jsonl");
  const std::string text(std::istreambuf_iterator<char>(metrics), {});
  EXPECT_NE(text.find("\"batch\":20"), std::string::npos) << "20 batches trained:\n" << text;
}

}  // namespace
