// Several "hosts" on one machine: network namespaces joined by veth pairs to
// bridges that live in a dedicated "switch" namespace, so nothing touches the
// root namespace's interfaces. Links can be rate-limited with tc tbf (netem
// is not needed). Each rank runs in its host's namespace (and its own UTS
// namespace, so hostnames differ as on real machines):
//
//   ip netns exec NS unshare --uts sh -c 'hostname H; exec env TANDEM_RANK=... cmd'
//
// Cleanup: the lab deletes every namespace it made in its destructor (deleting
// a namespace deletes its veth ends and bridges). Names carry the test's pid
// ("tdm<pid>h0"), and a new lab first deletes namespaces of pids that no
// longer exist, so a crashed or killed test leaves nothing behind for long.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tandem::testing {

struct ShellResult {
  int code = -1;
  std::string output;  // stdout and stderr
};

inline ShellResult shell(const std::string& command) {
  ShellResult r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Throws with the command and its output when it fails.
inline std::string must(const std::string& command) {
  ShellResult r = shell(command);
  if (r.code != 0) throw std::runtime_error("`" + command + "` failed (" + std::to_string(r.code) + "): " + r.output);
  return r.output;
}

// Why namespace tests cannot run here, or "" when they can.
inline std::string netns_unavailable() {
  if (::geteuid() != 0) return "network-namespace tests need root (they create namespaces, veths and bridges)";
  if (shell("ip netns list").code != 0) return "`ip netns` is unavailable (install iproute2)";
  if (shell("command -v unshare").code != 0) return "`unshare` (util-linux) is unavailable";
  const std::string probe = "tdm" + std::to_string(::getpid()) + "probe";
  if (shell("ip netns add " + probe).code != 0)
    return "cannot create a network namespace here (container without CAP_SYS_ADMIN?)";
  shell("ip netns del " + probe);
  return "";
}

// Deletes lab namespaces whose owning test process is gone.
inline void delete_stale_namespaces() {
  std::istringstream list(shell("ip netns list").output);
  std::string line;
  while (std::getline(list, line)) {
    std::string name = line.substr(0, line.find(' '));
    if (name.rfind("tdm", 0) != 0) continue;
    size_t end = 3;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end == 3) continue;
    pid_t pid = static_cast<pid_t>(std::stol(name.substr(3, end - 3)));
    if (::kill(pid, 0) != 0 && errno == ESRCH) shell("ip netns del " + name);
  }
}

class NetnsLab {
 public:
  struct Rank {
    int code = -1;  // exit code; 128+signal; -1 when the guard killed it
    std::string output;
    double seconds = 0;
  };

  explicit NetnsLab(const std::vector<std::string>& hostnames) : hostnames_(hostnames) {
    delete_stale_namespaces();
    try {
      must("ip netns add " + switch_ns());
      made_.push_back(switch_ns());
      for (size_t h = 0; h < hostnames.size(); ++h) {
        must("ip netns add " + ns(int(h)));
        made_.push_back(ns(int(h)));
        must("ip -n " + ns(int(h)) + " link set lo up");
      }
    } catch (...) {
      cleanup();
      throw;
    }
  }
  ~NetnsLab() { cleanup(); }
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  int hosts() const { return int(hostnames_.size()); }
  const std::string& hostname(int h) const { return hostnames_[size_t(h)]; }
  std::string ns(int h) const { return base() + "h" + std::to_string(h); }
  std::string switch_ns() const { return base() + "sw"; }

  // A LAN: bridge br<tag> in the switch namespace and, per host, a veth named
  // names[h] with address <net3>.<h+1>/24. rate (tc syntax, e.g. "200mbit")
  // limits both directions of every host's link with tbf.
  void add_lan(const std::string& tag, const std::string& net3, const std::vector<std::string>& names,
               const std::string& rate = "") {
    const std::string sw = "ip -n " + switch_ns();
    must(sw + " link add br" + tag + " type bridge");
    must(sw + " link set br" + tag + " up");
    for (int h = 0; h < hosts(); ++h) {
      const std::string port = tag + "p" + std::to_string(h);
      const std::string& name = names[size_t(h)];
      must(sw + " link add " + port + " type veth peer name " + name + " netns " + ns(h));
      must(sw + " link set " + port + " master br" + tag + " up");
      must("ip -n " + ns(h) + " addr add " + net3 + "." + std::to_string(h + 1) + "/24 dev " + name);
      must("ip -n " + ns(h) + " link set " + name + " up");
      if (!rate.empty()) {
        // burst >= one GSO packet (64 KiB), else tbf drops them; a short queue keeps the rate honest.
        const std::string tbf = " root tbf rate " + rate + " burst 128kb latency 20ms";
        must("tc -n " + ns(h) + " qdisc add dev " + name + tbf);
        must("tc -n " + switch_ns() + " qdisc add dev " + port + tbf);
      }
    }
  }

  // Carrier comes up asynchronously; ranks that start before it wait out TCP
  // connection retries. Waits up to 5 s for `itf` to be up on every host.
  void wait_up(const std::string& itf) const {
    for (int h = 0; h < hosts(); ++h) {
      for (int i = 0; i < 100; ++i) {
        if (shell("ip netns exec " + ns(h) + " cat /sys/class/net/" + itf + "/operstate").output.rfind("up", 0) == 0)
          break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  // An interface only this host has: a veth in its own subnet whose other end
  // sits unbridged in the switch namespace (up, with carrier, reaching no one).
  // (A dummy device would do, but not every kernel has the module.)
  void add_decoy(int h, const std::string& name, const std::string& cidr) {
    const std::string port = "decoy" + std::to_string(h);
    must("ip -n " + switch_ns() + " link add " + port + " type veth peer name " + name + " netns " + ns(h));
    must("ip -n " + switch_ns() + " link set " + port + " up");
    must("ip -n " + ns(h) + " addr add " + cidr + " dev " + name);
    must("ip -n " + ns(h) + " link set " + name + " up");
  }

  uint64_t tx_bytes(int h, const std::string& itf) const {
    return std::stoull(must("ip netns exec " + ns(h) + " cat /sys/class/net/" + itf + "/statistics/tx_bytes"));
  }

  // Runs commands[h] in host h's namespace with its hostname, all at once;
  // env is "K=V K=V" per host. A rank still running at the guard is killed
  // (with its process group) and reported with code -1.
  std::vector<Rank> run(const std::vector<std::string>& env, const std::vector<std::string>& commands,
                        std::chrono::seconds guard) {
    std::vector<int> host_of;
    for (int h = 0; h < hosts(); ++h) host_of.push_back(h);
    return run_ranks(host_of, env, commands, guard);
  }

  // The same with several processes per host: process i runs commands[i]
  // with env[i] in host host_of[i]'s namespace (processes of one host share
  // its network namespace and hostname, as on one machine).
  std::vector<Rank> run_ranks(const std::vector<int>& host_of, const std::vector<std::string>& env,
                              const std::vector<std::string>& commands, std::chrono::seconds guard) {
    std::vector<pid_t> pids;
    std::vector<std::string> files;
    const auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < host_of.size(); ++i) {
      const int h = host_of[i];
      files.push_back(::testing::TempDir() + base() + "_run" + std::to_string(runs_) + "_" + std::to_string(i) +
                      ".out");
      const std::string cmd = "exec ip netns exec " + ns(h) + " unshare --uts sh -c 'hostname " + hostname(h) +
                              " && exec env " + env[i] + " " + commands[i] + "' > " + files.back() + " 2>&1";
      std::fflush(stdout);
      pid_t pid = ::fork();
      if (pid == 0) {
        ::setpgid(0, 0);
        ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        ::_exit(127);
      }
      pids.push_back(pid);
    }
    ++runs_;
    std::vector<Rank> ranks(pids.size());
    const auto deadline = start + guard;
    size_t left = pids.size();
    while (left > 0) {
      for (size_t h = 0; h < pids.size(); ++h) {
        int status = 0;
        if (pids[h] > 0 && ::waitpid(pids[h], &status, WNOHANG) == pids[h]) {
          ranks[h].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          ranks[h].seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          pids[h] = 0;
          --left;
        }
      }
      if (left > 0 && std::chrono::steady_clock::now() > deadline) {
        for (size_t h = 0; h < pids.size(); ++h) {
          if (pids[h] <= 0) continue;
          ADD_FAILURE() << "wall-clock guard (" << guard.count() << " s) killed process " << h << " on "
                        << hostname(host_of[h]);
          ::kill(-pids[h], SIGKILL);
          ::waitpid(pids[h], nullptr, 0);
          pids[h] = 0;
          --left;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (size_t h = 0; h < files.size(); ++h) {
      std::ifstream f(files[h]);
      std::stringstream ss;
      ss << f.rdbuf();
      ranks[h].output = ss.str();
      std::remove(files[h].c_str());
    }
    return ranks;
  }

 private:
  std::string base() const { return "tdm" + std::to_string(::getpid()); }
  void cleanup() {
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) shell("ip netns del " + *it);
    made_.clear();
  }

  std::vector<std::string> hostnames_;
  std::vector<std::string> made_;
  int runs_ = 0;
};

}  // namespace tandem::testing
