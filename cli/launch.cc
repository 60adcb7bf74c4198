// `tandem launch`: see launch.h for what it does. Terms used below:
//   rank    one child process started by the launcher (its pid is also its
//           process-group id, so signals reach whatever it started too);
//   stream  the read end of one rank's stdout or stderr pipe;
//   phase   where shutdown stands: running -> grace (a rank failed; the
//           others may still exit on their own) -> terminating (SIGTERM
//           sent) -> killing (SIGKILL sent).
// Every wait is bounded: poll() wakes at least every kTick, and each phase
// has a deadline after which the next, harsher one starts.
#include "launch.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <filesystem>
#include <string>
#include <vector>

#include "tandem/store.h"

extern char** environ;

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kTick = 100ms;                  // longest poll() sleep
constexpr size_t kReadChunk = 64 << 10;        // bytes read from a stream per wake-up
constexpr size_t kMaxPartialLine = 1 << 20;    // a longer line without '\n' is split
constexpr auto kExecReportTimeout = 10s;       // for a child to exec or report why not
constexpr auto kLinger = 1s;                   // for pipes held open by a rank's descendants
constexpr auto kKillWait = 5s;                 // after SIGKILL; only a stuck kernel exceeds it

// ---------------------------------------------------------------- output

// Writes everything unless the reader is gone; the launcher must not die of
// EPIPE (SIGPIPE is ignored) nor block forever on a non-blocking descriptor.
void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) return;
    } else {
      return;
    }
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "tandem launch: " + message + "\n"); }

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// Shell convention: the exit code, or 128 + signal number.
int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + signal_name(WTERMSIG(status));
  return "exited with code " + std::to_string(exit_code_of(status));
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%gs", s);
  return buf;
}

// ---------------------------------------------------------------- ranks

struct Stream {
  int fd = -1;         // read end; -1 once closed
  int out_fd = -1;     // where prefixed lines go (launcher's stdout or stderr)
  std::string prefix;  // "[rank] "
  std::string partial;  // bytes after the last newline seen

  // Reads once; relays every complete line with one write() so lines from
  // different ranks never interleave. Returns false at EOF (stream closed).
  bool pump() {
    char buf[kReadChunk];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (n <= 0) {
      close_and_flush();
      return false;
    }
    partial.append(buf, static_cast<size_t>(n));
    std::string out;
    size_t start = 0;
    for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
      out += prefix;
      out.append(partial, start, nl + 1 - start);
    }
    partial.erase(0, start);
    if (partial.size() > kMaxPartialLine) {  // bound memory for output that never ends a line
      out += prefix + partial + "\n";
      partial.clear();
    }
    if (!out.empty()) write_all(out_fd, out);
    return true;
  }

  // A last line without '\n' still gets printed, as its own line.
  void close_and_flush() {
    if (!partial.empty()) write_all(out_fd, prefix + partial + "\n");
    partial.clear();
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;  // also the process-group id
  bool running = false;
  bool signalled_by_us = false;
  int status = 0;  // wait status once reaped
  Stream out, err;

  bool streams_open() const { return out.fd >= 0 || err.fd >= 0; }
};

// Signals the rank's whole process group (the command and anything it
// started). Also used after the rank itself has exited while descendants
// still hold its pipes: the group lives as long as any member does.
void signal_rank(Rank& r, int sig) {
  if (r.pid <= 0) return;
  if (::killpg(r.pid, sig) != 0 && r.running) ::kill(r.pid, sig);
  if (r.running) r.signalled_by_us = true;
}

// PATH lookup done once in the launcher, so a missing command is reported
// before any rank starts. Returns the path or sets exit_code to 127 / 126.
std::optional<std::string> resolve_command(const std::string& name, int& exit_code, std::string& error) {
  auto executable = [](const std::string& path) {
    struct stat st{};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (executable(name)) return name;
    struct stat st{};
    bool exists = ::stat(name.c_str(), &st) == 0;
    exit_code = exists ? 126 : 127;
    error = exists ? name + ": permission denied (not an executable file)" : name + ": command not found";
    return std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  bool seen_non_executable = false;
  size_t begin = 0;
  while (true) {
    size_t end = path.find(':', begin);
    std::string dir = path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(candidate)) return candidate;
    struct stat st{};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) seen_non_executable = true;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  exit_code = seen_non_executable ? 126 : 127;
  error = name + (seen_non_executable ? ": permission denied" : ": command not found (searched PATH)");
  return std::nullopt;
}

// What the launcher sets per rank: never inherited from its own environment.
constexpr const char* kOwnedVariables[] = {"TANDEM_RANK=",      "TANDEM_WORLD_SIZE=",   "TANDEM_LOCAL_RANK=",
                                           "TANDEM_LOCAL_WORLD_SIZE=", "TANDEM_STORE_ADDR=", "TANDEM_SECRET=",
                                           "TANDEM_SECRET_FILE=", "TANDEM_JOB_ID=",     "TANDEM_SERVERS="};

// Where a rank runs: its host (empty: this one), its local rank and how many
// ranks share that host.
struct Placement {
  std::string host;
  int local_rank = 0;
  int local_size = 1;
  bool remote() const { return !host.empty(); }
};

bool is_this_host(const std::string& host) {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return host == "localhost" || host == "127.0.0.1" || host == "::1" || host == name;
}

// Host-major: each host's slots in order; without a host list every rank
// (parameter servers too) is local.
std::vector<Placement> place_ranks(const LaunchOptions& o) {
  std::vector<Placement> out;
  const int world = o.nprocs + o.servers;
  if (o.hosts.empty()) {
    for (int r = 0; r < world; ++r) out.push_back({"", r, world});
    return out;
  }
  for (const HostSlots& h : o.hosts) {
    const int here = std::min(h.slots, world - int(out.size()));
    for (int l = 0; l < here; ++l) out.push_back({is_this_host(h.host) ? "" : h.host, l, here});
  }
  return out;
}

// The CPUs that rank `local` of `size` ranks on this host runs on: its equal
// share, in order, of `cpus` (the launcher's); none when they are fewer than
// the ranks (then the scheduler balances).
std::optional<cpu_set_t> cpu_share(const std::vector<int>& cpus, int local, int size) {
  if (size < 1 || local < 0 || local >= size || size > int(cpus.size())) return std::nullopt;
  const size_t per = cpus.size() / size_t(size);
  cpu_set_t mine;
  CPU_ZERO(&mine);
  for (size_t k = 0; k < per; ++k) CPU_SET(cpus[size_t(local) * per + k], &mine);
  return mine;
}

// One word for a POSIX shell: single-quoted, embedded quotes closed and escaped.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The job variables of one rank, NAME=value.
std::vector<std::string> job_variables(int rank, int world, const Placement& at, const std::string& store_addr,
                                       int servers) {
  std::vector<std::string> v = {
      "TANDEM_RANK=" + std::to_string(rank),
      "TANDEM_WORLD_SIZE=" + std::to_string(world),
      "TANDEM_LOCAL_RANK=" + std::to_string(at.local_rank),
      "TANDEM_LOCAL_WORLD_SIZE=" + std::to_string(at.local_size),
      "TANDEM_STORE_ADDR=" + store_addr,
      "TANDEM_JOB_ID=launch-" + std::to_string(::getpid()),  // the launcher's pid: one per job on this host
  };
  if (servers > 0) v.push_back("TANDEM_SERVERS=" + std::to_string(servers));
  return v;
}

// The launcher's own TANDEM_*, DTRAIN_* and UCX_* settings (an interface
// override, timeouts, transports), which a remote shell would not carry over;
// the job variables and the secret are set per rank instead.
std::vector<std::string> forwarded_settings() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    if (!(kv.starts_with("TANDEM_") || kv.starts_with("DTRAIN_") || kv.starts_with("UCX_"))) continue;
    if (std::any_of(std::begin(kOwnedVariables), std::end(kOwnedVariables),
                    [&](const char* k) { return kv.starts_with(k); }))
      continue;
    out.emplace_back(kv);
  }
  return out;
}

// How a remote rank starts: `rsh` with the host, then one shell command line
// that enters the launcher's directory (if the host has it), reads the job
// secret from its standard input (never a command line) and runs the command
// with the forwarded settings and the job variables.
std::vector<std::string> remote_command(const std::string& rsh, const std::string& host,
                                        const std::vector<std::string>& job, const std::vector<std::string>& command) {
  std::vector<std::string> argv;
  bool placed = false;
  std::istringstream words(rsh);
  for (std::string w; words >> w;) {
    for (size_t at; (at = w.find("{host}")) != std::string::npos; placed = true) w.replace(at, 6, host);
    argv.push_back(w);
  }
  if (!placed) argv.push_back(host);
  std::string line = "cd " + shell_quote(std::filesystem::current_path().string()) +
                     " 2>/dev/null; IFS= read -r TANDEM_SECRET || exit 1; export TANDEM_SECRET; exec env";
  for (const auto& kv : forwarded_settings()) line += " " + shell_quote(kv);
  for (const auto& kv : job) line += " " + shell_quote(kv);
  for (const auto& a : command) line += " " + shell_quote(a);
  argv.push_back(line);
  return argv;
}

// The parent's environment minus stale TANDEM_* job variables, plus this rank's.
// The job secret travels in the environment (readable by this user only), never on a command line.
std::vector<std::string> rank_environment(const std::vector<std::string>& job, const std::string& secret) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    bool owned = std::any_of(std::begin(kOwnedVariables), std::end(kOwnedVariables),
                             [&](const char* k) { return kv.starts_with(k); });
    if (!owned) env.emplace_back(kv);
  }
  env.insert(env.end(), job.begin(), job.end());
  if (!secret.empty()) env.push_back("TANDEM_SECRET=" + secret);
  return env;
}

// The group guard: a process that outlives a SIGKILLed launcher just long
// enough to kill every rank's process group. PR_SET_PDEATHSIG reaches the
// ranks themselves, not what they started; the guard takes those down too.
// It starts before the first rank and learns each rank's group through a
// pipe right after that rank's fork, so no rank runs unguarded; the pipe's
// end of file is the launcher's death (the ranks close their copy at exec).
// The launcher kills the guard when the job ends.
class GroupGuard {
 public:
  // Between fork and _exit only async-signal-safe calls; `capacity` bounds
  // the groups the guard remembers (the vector is sized before the fork).
  bool start(size_t capacity) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    groups_.assign(capacity, 0);
    pid_ = ::fork();
    if (pid_ < 0) {
      ::close(fds[0]);
      ::close(fds[1]);
      return false;
    }
    if (pid_ == 0) watch(fds[0], fds[1]);
    ::close(fds[0]);
    write_fd_ = fds[1];
    return true;
  }
  void add(pid_t group) {
    if (write_fd_ >= 0) (void)!::write(write_fd_, &group, sizeof group);  // <= PIPE_BUF: atomic
  }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);  // before the pipe closes, or it would kill the groups
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (write_fd_ >= 0) ::close(write_fd_);
    write_fd_ = -1;
  }
  ~GroupGuard() { stop(); }

 private:
  [[noreturn]] void watch(int read_fd, int write_fd) {
    ::close(write_fd);
    size_t n = 0;
    pid_t group = 0;
    while (true) {
      const ssize_t got = ::read(read_fd, &group, sizeof group);
      if (got == static_cast<ssize_t>(sizeof group)) {
        if (n < groups_.size()) groups_[n++] = group;
      } else if (got == 0 || errno != EINTR) {
        break;  // the launcher is gone
      }
    }
    for (size_t i = 0; i < n; ++i) ::killpg(groups_[i], SIGKILL);
    ::_exit(0);
  }

  std::vector<pid_t> groups_;
  pid_t pid_ = -1;
  int write_fd_ = -1;
};

// In the child, between fork and exec: only async-signal-safe calls (the
// store's I/O thread may hold allocator locks that were copied mid-use).
[[noreturn]] void exec_child(const char* path, char* const* argv, char* const* envp, int in_r, int out_w,
                             int err_w, int report_w, pid_t parent, const rlimit& files, const cpu_set_t* cpus) {
  ::setpgid(0, 0);
  ::setrlimit(RLIMIT_NOFILE, &files);  // the launcher's raised limit is its own business
  if (cpus) ::sched_setaffinity(0, sizeof *cpus, cpus);  // a plain system call; what the rank starts inherits it
  // If the launcher is SIGKILLed, take the rank down with it instead of leaking it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);

  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT}) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  // Ranks share no terminal input; a remote rank's shell reads the secret from in_r.
  int input = in_r >= 0 ? in_r : ::open("/dev/null", O_RDONLY);
  if (input >= 0) ::dup2(input, STDIN_FILENO);
  ::dup2(out_w, STDOUT_FILENO);
  ::dup2(err_w, STDERR_FILENO);
  // Nothing else of the launcher's (store sockets, other ranks' pipes) may
  // leak into the command; report_w is marked too and closes at a successful exec.
  if (::syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) != 0) {
    for (int fd = 3; fd < 4096; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  ::execve(path, argv, envp);
  int err = errno;
  [[maybe_unused]] ssize_t ignored = ::write(report_w, &err, sizeof err);
  ::_exit(err == ENOENT ? 127 : 126);
}

struct Pipe {
  int r = -1, w = -1;
  bool open() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    r = fds[0];
    w = fds[1];
    return true;
  }
  void close_all() {
    if (r >= 0) ::close(r);
    if (w >= 0) ::close(w);
    r = w = -1;
  }
};

// Starts one rank. Returns 0, or the launcher exit code with `error` set.
// A local rank runs `command` with the job variables in its environment; a
// remote one runs `command` (already the remote shell's argv) and gets the
// secret on its standard input. `cpus`: the local rank's CPUs (null: unbound).
int spawn_rank(Rank& r, const std::string& path, const std::vector<std::string>& command,
               const std::vector<std::string>& env, const std::string& remote_secret, const rlimit& child_files,
               const cpu_set_t* cpus, std::string& error, GroupGuard& guard) {
  std::vector<char*> argv, envp;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const bool remote = !remote_secret.empty();
  Pipe in, out, err, report;
  if ((remote && !in.open()) || !out.open() || !err.open() || !report.open()) {
    error = std::string("pipe: ") + std::strerror(errno);
    in.close_all();
    out.close_all();
    err.close_all();
    report.close_all();
    return 1;
  }
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    error = std::string("fork: ") + std::strerror(errno);
    in.close_all();
    out.close_all();
    err.close_all();
    report.close_all();
    return 1;
  }
  if (pid == 0) {
    exec_child(path.c_str(), argv.data(), envp.data(), in.r, out.w, err.w, report.w, parent, child_files, cpus);
  }

  ::setpgid(pid, pid);  // also here, so killpg works even before the child ran
  guard.add(pid);
  ::close(out.w);
  ::close(err.w);
  ::close(report.w);
  if (remote) {
    ::close(in.r);
    write_all(in.w, remote_secret + "\n");  // 65 bytes: fits the pipe, never blocks
    ::close(in.w);
  }
  r.pid = pid;
  r.running = true;
  for (Stream* s : {&r.out, &r.err}) s->prefix = "[" + std::to_string(r.rank) + "] ";
  r.out.fd = out.r;
  r.out.out_fd = STDOUT_FILENO;
  r.err.fd = err.r;
  r.err.out_fd = STDERR_FILENO;
  ::fcntl(out.r, F_SETFL, O_NONBLOCK);
  ::fcntl(err.r, F_SETFL, O_NONBLOCK);

  // The report pipe closes at a successful exec or carries exec's errno.
  pollfd p{report.r, POLLIN, 0};
  int exec_errno = 0;
  if (::poll(&p, 1, static_cast<int>(std::chrono::milliseconds(kExecReportTimeout).count())) > 0) {
    if (::read(report.r, &exec_errno, sizeof exec_errno) != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;
  }
  ::close(report.r);
  if (exec_errno != 0) {
    error = command[0] + ": cannot execute: " + std::strerror(exec_errno);
    return exec_errno == ENOENT ? 127 : 126;
  }
  return 0;
}

// Blocks the signals the launcher handles (they arrive through a signalfd in
// the poll set) for the lifetime of the object; the store's I/O thread is
// created afterwards and so inherits the mask.
class SignalGuard {
 public:
  SignalGuard() {
    sigemptyset(&set_);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set_, sig);
    ::pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
    struct sigaction ign{};
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ign, &old_pipe_);
    fd_ = ::signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC);
  }
  ~SignalGuard() {
    if (fd_ >= 0) ::close(fd_);
    ::sigaction(SIGPIPE, &old_pipe_, nullptr);
    ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;
  int fd() const { return fd_; }

 private:
  sigset_t set_{}, old_mask_{};
  struct sigaction old_pipe_{};
  int fd_ = -1;
};

enum class Phase { running, grace, terminating, killing };

class Launcher {
 public:
  explicit Launcher(const LaunchOptions& o) : opts_(o) {}

  int run() {
    int code = 0;
    std::string error;
    const std::vector<Placement> placement = place_ranks(opts_);
    const bool any_remote = std::any_of(placement.begin(), placement.end(), [](const Placement& p) { return p.remote(); });
    const bool any_local = !any_remote || std::any_of(placement.begin(), placement.end(),
                                                      [](const Placement& p) { return !p.remote(); });
    // Looked up here, so a missing command or remote shell fails before any rank starts.
    std::optional<std::string> path, rsh_path;
    if (any_local && !(path = resolve_command(opts_.command[0], code, error))) {
      say(error);
      return code;
    }
    std::istringstream rsh_words(opts_.rsh);
    std::string rsh_program;
    rsh_words >> rsh_program;
    if (any_remote && !(rsh_path = resolve_command(rsh_program, code, error))) {
      say("the remote shell (--rsh): " + error);
      return code;
    }

    // Each rank costs the launcher two pipes and a store connection; the
    // default soft limit of 1024 descriptors would not last to -n 1024.
    rlimit files{};
    ::getrlimit(RLIMIT_NOFILE, &files);
    const rlimit child_files = files;
    if (files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &files);
    }

    SignalGuard signals;  // before the store, whose thread must inherit the mask
    if (signals.fd() < 0) {
      say(std::string("signalfd: ") + std::strerror(errno));
      return 1;
    }
    std::unique_ptr<StoreServer> store;
    std::string secret;
    try {
      secret = new_job_secret();
      StoreServerOptions so;  // 127.0.0.1 when every rank runs on this host
      so.secret = secret;       // the store admits only holders of the job secret
      if (any_remote) {
        so.host = "0.0.0.0";
        if (!opts_.store_address.empty() && opts_.store_address.find(':') != std::string::npos)
          so.port = parse_host_port(opts_.store_address).second;
      }
      store = std::make_unique<StoreServer>(so);
    } catch (const std::exception& e) {
      say(std::string("cannot start the bootstrap store: ") + e.what());
      return 1;
    }
    store_ = store.get();
    std::string store_addr = "127.0.0.1:" + std::to_string(store->port());
    if (any_remote) {
      char name[256] = {};
      ::gethostname(name, sizeof name - 1);
      std::string host = opts_.store_address.empty() ? name : opts_.store_address;
      if (host.find(':') != std::string::npos) host = parse_host_port(host).first;
      store_addr = host + ":" + std::to_string(store->port());
      std::string where;
      for (const HostSlots& h : opts_.hosts) where += (where.empty() ? "" : ", ") + h.host + ":" + std::to_string(h.slots);
      say(std::to_string(opts_.nprocs) + " ranks on " + where + " (host-major); store at " + store_addr);
    }

    // Orphaned descendants of the ranks become our children, not init's, so
    // they are reaped even in containers whose init never reaps.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    start_ = Clock::now();
    const int world = opts_.nprocs + opts_.servers;
    // Parameter-server ranks run `tandem ps serve` from this very executable.
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::vector<std::string> serve = {self, "ps", "serve"};
    ranks_.resize(static_cast<size_t>(world));
    GroupGuard guard;
    if (!guard.start(ranks_.size()))
      say(std::string("cannot start the group guard (") + std::strerror(errno) +
          "); if the launcher is killed, what the ranks started may outlive it");
    const std::vector<int> launcher_cpus = allowed_cpus();
    for (int i = 0; i < world; ++i) {
      ranks_[i].rank = i;
      const bool server = i >= opts_.nprocs;
      const Placement& at = placement[size_t(i)];
      const std::vector<std::string> job = job_variables(i, world, at, store_addr, opts_.servers);
      const std::optional<cpu_set_t> cpus =
          opts_.bind == "auto" && !at.remote() ? cpu_share(launcher_cpus, at.local_rank, at.local_size) : std::nullopt;
      int rc = at.remote()
                   ? spawn_rank(ranks_[i], *rsh_path, remote_command(opts_.rsh, at.host, job, opts_.command),
                                rank_environment({}, ""), secret, child_files, nullptr, error, guard)
                   : spawn_rank(ranks_[i], server ? self : *path, server ? serve : opts_.command,
                                rank_environment(job, secret), "", child_files, cpus ? &*cpus : nullptr, error, guard);
      if (rc != 0) {
        say("rank " + std::to_string(i) + ": " + error);
        spawn_failure_ = rc;
        // The ranks already running would wait for the missing one forever.
        enter(Phase::killing, SIGKILL, kKillWait);
        break;
      }
    }

    loop(signals.fd());
    guard.stop();
    reap_orphans();
    store_ = nullptr;
    return finish();
  }

 private:
  void loop(int signal_fd) {
    std::optional<Clock::time_point> linger_until;
    bool stragglers_killed = false;
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    while (true) {
      bool any_running = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
      bool any_open = std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.streams_open(); });
      if (!any_running && !any_open) return;
      if (!any_running) {
        // Every rank exited but something it started still holds a pipe:
        // give it kLinger to finish writing, then kill it and stop reading.
        auto now = Clock::now();
        if (!linger_until) linger_until = now + kLinger;
        if (now >= *linger_until) {
          if (stragglers_killed) {
            for (Rank& r : ranks_) r.out.close_and_flush(), r.err.close_and_flush();
            return;
          }
          for (Rank& r : ranks_)
            if (r.streams_open()) signal_rank(r, SIGKILL);
          stragglers_killed = true;
          linger_until = now + kLinger;
        }
      }

      fds.clear();
      streams.clear();
      fds.push_back({signal_fd, POLLIN, 0});
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
      }
      ::poll(fds.data(), fds.size(), poll_timeout_ms(linger_until));

      if (fds[0].revents & POLLIN) handle_signals(signal_fd);
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) streams[i - 1]->pump();
      }
      reap();
      check_deadlines();
    }
  }

  // As child subreaper the launcher inherits what the ranks left behind; reap
  // those (already killed with their process group) so none stays a zombie.
  static void reap_orphans() {
    auto until = Clock::now() + 500ms;
    while (Clock::now() < until) {
      pid_t pid = ::waitpid(-1, nullptr, WNOHANG);
      if (pid < 0) return;  // ECHILD: nothing left
      if (pid == 0) ::usleep(10000);
    }
  }

  int poll_timeout_ms(const std::optional<Clock::time_point>& linger_until) const {
    auto now = Clock::now();
    auto next = now + kTick;
    if (phase_deadline_) next = std::min(next, *phase_deadline_);
    if (job_deadline() && !timed_out_) next = std::min(next, *job_deadline());
    if (linger_until) next = std::min(next, *linger_until);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    return static_cast<int>(std::clamp<long long>(ms + 1, 0, 100));
  }

  std::optional<Clock::time_point> job_deadline() const {
    if (opts_.timeout_seconds <= 0) return std::nullopt;
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.timeout_seconds));
  }

  // SIGINT/SIGTERM/SIGHUP to the launcher go to every rank; a second one
  // means "now": SIGKILL.
  void handle_signals(int signal_fd) {
    signalfd_siginfo info{};
    while (::read(signal_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) continue;  // reap() runs every iteration
      if (interrupt_signal_ == 0 && !stopping()) {
        interrupt_signal_ = sig;
        say("received " + signal_name(sig) + "; forwarding it to all ranks");
        enter(Phase::terminating, sig, seconds(opts_.kill_after_seconds));
      } else if (phase_ != Phase::killing) {
        if (interrupt_signal_ == 0) interrupt_signal_ = sig;
        say("received " + signal_name(sig) + " again; killing all ranks");
        enter(Phase::killing, SIGKILL, kKillWait);
      }
    }
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.pid == pid; });
      if (it == ranks_.end()) continue;
      it->running = false;
      it->status = status;
      if (status == 0) continue;
      if (it->signalled_by_us) {
        ++stopped_by_us_;
        continue;  // expected: we asked it to stop
      }
      ++failed_;
      say("rank " + std::to_string(it->rank) + " " + describe(status));
      if (!first_failure_ && !stopping() && spawn_failure_ == 0) {
        first_failure_ = &*it;
        record_failure_in_store(it->rank, describe(status));
        if (std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; })) {
          say("waiting up to " + seconds_text(opts_.grace_seconds) + " for the other ranks to exit");
        }
        phase_ = Phase::grace;
        phase_deadline_ = Clock::now() + seconds(opts_.grace_seconds);
      }
    }
  }

  // Lets ranks blocked in a collective fail fast with PeerFailure naming the
  // rank, instead of waiting for their timeout.
  void record_failure_in_store(int rank, const std::string& how) {
    if (!store_) return;
    try {
      auto failed = store_->failed_ranks();
      if (std::find(failed.begin(), failed.end(), rank) == failed.end()) store_->mark_failed(rank, how);
    } catch (const std::exception& e) {
      say(std::string("could not record the failure in the store: ") + e.what());
    }
  }

  void check_deadlines() {
    auto now = Clock::now();
    auto running = [&] {
      return std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; });
    };
    if (!timed_out_ && job_deadline() && now >= *job_deadline() && !first_failure_ && interrupt_signal_ == 0 &&
        running() > 0) {
      timed_out_ = true;
      say("timeout: the job exceeded --timeout " + seconds_text(opts_.timeout_seconds) +
          "; terminating all ranks");
      enter(Phase::terminating, SIGTERM, seconds(opts_.kill_after_seconds));
      return;
    }
    if (!phase_deadline_ || now < *phase_deadline_) return;
    switch (phase_) {
      case Phase::running:
        break;
      case Phase::grace:
        if (running() > 0) {
          say("grace period of " + seconds_text(opts_.grace_seconds) + " is over; sending SIGTERM to " +
              std::to_string(running()) + " remaining rank(s)");
        }
        enter(Phase::terminating, SIGTERM, seconds(opts_.kill_after_seconds));
        break;
      case Phase::terminating:
        if (running() > 0) say("sending SIGKILL to " + std::to_string(running()) + " remaining rank(s)");
        enter(Phase::killing, SIGKILL, kKillWait);
        break;
      case Phase::killing:
        // SIGKILL cannot be ignored; only a process stuck in the kernel gets here.
        for (Rank& r : ranks_) {
          if (r.running) say("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") did not die; giving up on it");
          r.running = false;
          r.out.close_and_flush();
          r.err.close_and_flush();
        }
        phase_deadline_.reset();
        break;
    }
  }

  void enter(Phase phase, int sig, Clock::duration wait) {
    phase_ = phase;
    phase_deadline_ = Clock::now() + wait;
    for (Rank& r : ranks_) {
      if (r.running || r.streams_open()) signal_rank(r, sig);
    }
  }

  bool stopping() const { return phase_ == Phase::terminating || phase_ == Phase::killing; }

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  int finish() const {
    std::string abnormal = std::to_string(failed_) + " of " + std::to_string(opts_.nprocs + opts_.servers) +
                           " rank(s) failed on their own, " + std::to_string(stopped_by_us_) +
                           " stopped by the launcher";
    if (spawn_failure_ != 0) return spawn_failure_;
    if (first_failure_) {
      const Rank& r = *first_failure_;
      say("job failed: rank " + std::to_string(r.rank) + " failed first (" + describe(r.status) + "); " + abnormal);
      return exit_code_of(r.status);
    }
    if (timed_out_) {
      say("job timed out after " + seconds_text(opts_.timeout_seconds) + " (--timeout); " + abnormal);
      return 124;
    }
    if (interrupt_signal_ != 0) {
      say("job interrupted by " + signal_name(interrupt_signal_) + "; " + abnormal);
      return 128 + interrupt_signal_;
    }
    return 0;
  }

  const LaunchOptions& opts_;
  std::vector<Rank> ranks_;
  StoreServer* store_ = nullptr;
  Clock::time_point start_{};
  Phase phase_ = Phase::running;
  std::optional<Clock::time_point> phase_deadline_;
  const Rank* first_failure_ = nullptr;
  int spawn_failure_ = 0;
  bool timed_out_ = false;
  int interrupt_signal_ = 0;
  int failed_ = 0;
  int stopped_by_us_ = 0;
};

}  // namespace

std::string validate(const LaunchOptions& o) {
  int slots = 0;
  for (const HostSlots& h : o.hosts) slots += h.slots;
  if (!o.hosts.empty()) {
    if (o.nprocs > slots) {
      return "-n " + std::to_string(o.nprocs) + " asks for more ranks than the hosts (-H) offer (" +
             std::to_string(slots) + " slots); add hosts or slots, or leave -n out to use every slot";
    }
    if (o.servers > 0) return "--servers cannot be combined with -H yet: start parameter servers with mpirun or by hand";
  } else if (o.nprocs == -1) {
    return "say how many ranks: -n/--nprocs N (on this host) or -H host:slots,... (across hosts)";
  }
  if (o.nprocs < 1 || o.nprocs > kMaxLocalRanks) {
    return "-n must be between 1 and " + std::to_string(kMaxLocalRanks) + " local ranks (got " +
           std::to_string(o.nprocs) + ")";
  }
  if (o.servers < 0 || o.nprocs + o.servers > kMaxLocalRanks) {
    return "--servers must be between 0 and " + std::to_string(kMaxLocalRanks - o.nprocs) + " (got " +
           std::to_string(o.servers) + ")";
  }
  auto bad_seconds = [](double s) { return !std::isfinite(s) || s < 0 || s > 1e7; };
  if (bad_seconds(o.timeout_seconds)) return "--timeout must be a number of seconds >= 0 (0 = no limit)";
  if (bad_seconds(o.grace_seconds)) return "--grace must be a number of seconds >= 0";
  if (bad_seconds(o.kill_after_seconds)) return "the SIGTERM-to-SIGKILL delay must be >= 0 seconds";
  if (o.bind != "auto" && o.bind != "none") return "--bind must be auto or none (got '" + o.bind + "')";
  if (o.command.empty() || o.command[0].empty()) {
    return "no command given; usage: tandem launch -n N [--timeout S] [--grace S] -- command [args...]";
  }
  return "";
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::vector<HostSlots> parse_hosts(const std::string& text) {
  std::vector<HostSlots> hosts;
  std::istringstream in(text);
  for (std::string entry; std::getline(in, entry, ',');) {
    // "name", "name:slots", "[v6 address]:slots"; a bare v6 address (several colons) has one slot.
    HostSlots h;
    h.host = entry;
    std::string slots;
    if (!entry.empty() && entry[0] == '[') {
      const size_t close = entry.find(']');
      h.host = close == std::string::npos ? "" : entry.substr(1, close - 1);
      if (close != std::string::npos && close + 1 < entry.size()) {
        slots = entry[close + 1] == ':' ? entry.substr(close + 2) : "bad";
      }
    } else if (std::count(entry.begin(), entry.end(), ':') == 1) {
      h.host = entry.substr(0, entry.find(':'));
      slots = entry.substr(entry.find(':') + 1);
    }
    if (!slots.empty()) {
      const bool digits = slots.size() <= 4 && slots.find_first_not_of("0123456789") == std::string::npos;
      h.slots = digits ? std::atoi(slots.c_str()) : 0;
    }
    if (h.host.empty() || h.slots < 1 || h.slots > kMaxLocalRanks) {
      throw std::invalid_argument("-H entry '" + entry + "' is not host or host:slots with 1.." +
                                  std::to_string(kMaxLocalRanks) + " slots (e.g. -H node1:4,node2:4)");
    }
    hosts.push_back(h);
  }
  if (hosts.empty()) throw std::invalid_argument("-H is empty; give host:slots,... (e.g. -H node1:4,node2:4)");
  return hosts;
}

int run_launch(const LaunchOptions& options) {
  LaunchOptions o = options;
  if (o.nprocs == -1 && !o.hosts.empty()) {
    o.nprocs = 0;
    for (const HostSlots& h : o.hosts) o.nprocs += h.slots;
  }
  if (std::string error = validate(o); !error.empty()) {
    say(error);
    return 2;
  }
  return Launcher(o).run();
}

}  // namespace tandem::cli
