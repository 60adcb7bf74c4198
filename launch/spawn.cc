// Starting one rank (see spawn.h), and running one plain command to completion.
#include "spawn.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string_view>
#include <thread>

extern char** environ;

namespace tandem::launch {
namespace {

using namespace std::chrono_literals;

constexpr auto kExecReportTimeout = 10s;  // for a child to exec or report why not

// In the child, between fork and exec: only async-signal-safe calls (the
// store's I/O thread may hold allocator locks that were copied mid-use).
[[noreturn]] void exec_child(const char* path, char* const* argv, char* const* envp, int in_r, int out_w, int err_w,
                             int report_w, pid_t parent, const rlimit& files, const cpu_set_t* cpus) {
  ::setpgid(0, 0);
  ::setrlimit(RLIMIT_NOFILE, &files);                    // the launcher's raised limit is its own business
  if (cpus) ::sched_setaffinity(0, sizeof *cpus, cpus);  // a plain system call; what the rank starts inherits it
  // If the launcher is SIGKILLed, take the rank down with it instead of leaking it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);

  struct sigaction dfl {};
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

}  // namespace

bool set_by(std::string_view kv, const std::vector<std::string>& settings) {
  const std::string_view name = kv.substr(0, kv.find('='));
  return std::any_of(settings.begin(), settings.end(),
                     [&](const std::string& s) { return std::string_view(s).substr(0, s.find('=')) == name; });
}

std::string check_environment(const std::vector<std::string>& settings) {
  constexpr const char* kTorchJob[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"};
  for (size_t i = 0; i < settings.size(); ++i) {
    const std::string& kv = settings[i];
    const size_t eq = kv.find('=');
    const std::string name = kv.substr(0, eq);
    const bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                       std::all_of(name.begin(), name.end(),
                                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!valid)
      return "-x/--env '" + kv + "': '" + name +
             "' is not a variable name (letters, digits and _, not starting with "
             "a digit; e.g. --env OMP_NUM_THREADS=4)";
    if (eq == std::string::npos)
      return "-x/--env " + name + " has no value: give " + name + "=value, or -x " + name + " with " + name +
             " exported here to pass on its value";
    const bool per_rank = std::any_of(std::begin(kOwnedVariables), std::end(kOwnedVariables),
                                      [&](const char* k) { return kv.starts_with(k); }) ||
                          std::find(std::begin(kTorchJob), std::end(kTorchJob), name) != std::end(kTorchJob);
    if (per_rank)
      return "-x/--env " + name + ": tandem launch sets it for each rank (the job secret too); leave it out";
    if (set_by(kv, {settings.begin(), settings.begin() + long(i)}))
      return "-x/--env " + name + " is given twice; give it once";
  }
  return "";
}

EnvLookup environment_with(const std::vector<std::string>& settings) {
  return [settings, env = process_env()](const std::string& name) -> std::optional<std::string> {
    for (const std::string& s : settings)
      if (s.size() > name.size() && s.compare(0, name.size(), name) == 0 && s[name.size()] == '=')
        return s.substr(name.size() + 1);
    return env(name);
  };
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::optional<std::string> resolve_command(const std::string& name, const EnvLookup& env, int& exit_code,
                                           std::string& error) {
  auto executable = [](const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (executable(name)) return name;
    struct stat st {};
    bool exists = ::stat(name.c_str(), &st) == 0;
    exit_code = exists ? 126 : 127;
    error = exists ? name + ": permission denied (not an executable file)" : name + ": command not found";
    return std::nullopt;
  }
  std::string path = env("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  bool seen_non_executable = false;
  size_t begin = 0;
  while (true) {
    size_t end = path.find(':', begin);
    std::string dir = path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(candidate)) return candidate;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) seen_non_executable = true;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  exit_code = seen_non_executable ? 126 : 127;
  error = name + (seen_non_executable ? ": permission denied" : ": command not found (searched PATH)");
  return std::nullopt;
}

int resolve_programs(const LaunchOptions& o, bool need_command, bool need_rsh, bool want_rsh, Programs& programs) {
  int code = 0;
  std::string error;
  const EnvLookup env = environment_with(o.environment);
  if (need_command && !(programs.command = resolve_command(o.command[0], env, code, error))) {
    say(error);
    return code;
  }
  std::istringstream rsh_words(o.rsh);
  std::string rsh_program;
  rsh_words >> rsh_program;
  if ((need_rsh || want_rsh) && !(programs.rsh = resolve_command(rsh_program, env, code, error)) && need_rsh) {
    say("the remote shell (--rsh): " + error);
    return code;
  }
  return 0;
}

namespace {

// A TCP port nobody listens on here now (the kernel's pick for port 0), 0 if none.
uint16_t free_port() {
  for (int family : {AF_INET, AF_INET6}) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage addr{};
    socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    addr.ss_family = sa_family_t(family);  // any address, port 0
    uint16_t port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                     : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    }
    ::close(fd);
    if (port != 0) return port;
  }
  return 0;
}

}  // namespace

std::string plan_torch_job(const std::vector<Placement>& placement, int workers, const std::string& rank0_host,
                           uint16_t store_port, const EnvLookup& env, TorchJob& torch) {
  torch.workers = workers;
  torch.workers_on_node.clear();
  for (int r = 0; r < workers && r < int(placement.size()); ++r) {
    const size_t node = size_t(placement[size_t(r)].node);
    if (torch.workers_on_node.size() <= node) torch.workers_on_node.resize(node + 1);
    ++torch.workers_on_node[node];
  }
  torch.master_addr = env("MASTER_ADDR").value_or(rank0_host);
  if (auto port = env("MASTER_PORT")) {
    torch.master_port = *port;
    const bool rank0_here = !placement.empty() && !placement[0].remote();
    if (rank0_here && *port == std::to_string(store_port))
      return "MASTER_PORT=" + *port +
             " is the port of tandem's store on rank 0's host; export another one (or none: "
             "tandem launch then picks a free port)";
    return "";
  }
  // The kernel hands out a port in use by no socket, so never the store's
  // (bound already); checked anyway. Rank 0 on another host gets a port free
  // here, most likely free there too: export MASTER_PORT to choose it.
  uint16_t port = 0;
  for (int attempt = 0; attempt < 8 && (port == 0 || port == store_port); ++attempt) port = free_port();
  if (port == 0 || port == store_port) return "found no free TCP port for torch's store; export MASTER_PORT";
  torch.master_port = std::to_string(port);
  return "";
}

std::vector<std::string> job_variables(int rank, int world, const Placement& at, const std::string& store_addr,
                                       int servers, const TorchJob& torch) {
  std::vector<std::string> v = {
      "TANDEM_RANK=" + std::to_string(rank),
      "TANDEM_WORLD_SIZE=" + std::to_string(world),
      "TANDEM_LOCAL_RANK=" + std::to_string(at.local_rank),
      "TANDEM_LOCAL_WORLD_SIZE=" + std::to_string(at.local_size),
      "TANDEM_STORE_ADDR=" + store_addr,
      "TANDEM_JOB_ID=launch-" + std::to_string(::getpid()),  // the launcher's pid: one per job on this host
  };
  if (servers > 0) v.push_back("TANDEM_SERVERS=" + std::to_string(servers));
  if (rank < torch.workers) {  // torchrun's, for torch.distributed's env:// (docs/running.md)
    const int on_node = size_t(at.node) < torch.workers_on_node.size() ? torch.workers_on_node[size_t(at.node)] : 0;
    for (std::string kv : {"RANK=" + std::to_string(rank), "LOCAL_RANK=" + std::to_string(at.local_rank),
                           "WORLD_SIZE=" + std::to_string(torch.workers), "LOCAL_WORLD_SIZE=" + std::to_string(on_node),
                           "GROUP_RANK=" + std::to_string(at.node), "MASTER_ADDR=" + torch.master_addr,
                           "MASTER_PORT=" + torch.master_port})
      v.push_back(std::move(kv));
  }
  return v;
}

std::vector<std::string> rank_environment(const std::vector<std::string>& job, const std::string& secret,
                                          const std::vector<std::string>& settings) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view kv(*e);
    bool owned = std::any_of(std::begin(kOwnedVariables), std::end(kOwnedVariables),
                             [&](const char* k) { return kv.starts_with(k); });
    if (!owned && !set_by(kv, settings) && !set_by(kv, job)) env.emplace_back(kv);
  }
  for (const std::string& s : settings)
    if (!set_by(s, job)) env.push_back(s);
  env.insert(env.end(), job.begin(), job.end());
  if (!secret.empty()) env.push_back("TANDEM_SECRET=" + secret);
  return env;
}

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
  auto fail = [&](const char* call) {
    error = std::string(call) + ": " + std::strerror(errno);
    for (Pipe* p : {&in, &out, &err, &report}) p->close_all();
    return 1;
  };
  if ((remote && !in.open()) || !out.open() || !err.open() || !report.open()) return fail("pipe");
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return fail("fork");
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

int run_and_wait(const std::vector<std::string>& argv, const std::function<void()>& on_tick,
                 std::chrono::milliseconds tick_period, std::string& error) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Pipe report;  // closes at a successful exec or carries exec's errno
  if (!report.open()) {
    error = std::string("pipe: ") + std::strerror(errno);
    return 126;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    error = std::string("fork: ") + std::strerror(errno);
    report.close_all();
    return 126;
  }
  if (pid == 0) {
    ::execvp(args[0], args.data());
    int err = errno;
    [[maybe_unused]] ssize_t ignored = ::write(report.w, &err, sizeof err);
    ::_exit(err == ENOENT ? 127 : 126);
  }
  ::close(report.w);
  int exec_errno = 0;
  if (::read(report.r, &exec_errno, sizeof exec_errno) != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;
  ::close(report.r);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) != pid) {
    if (on_tick) on_tick();
    std::this_thread::sleep_for(tick_period);
  }
  if (exec_errno != 0) error = std::string("cannot run ") + argv[0] + ": " + std::strerror(exec_errno);
  return exit_code_of(status);
}

rlimit raise_file_limit() {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  const rlimit as_was = files;
  if (files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  return as_was;
}

void reap_orphans() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (std::chrono::steady_clock::now() < until) {
    const pid_t pid = ::waitpid(-1, nullptr, WNOHANG);
    if (pid < 0) return;  // ECHILD: nothing left
    if (pid == 0) ::usleep(10000);
  }
}

}  // namespace tandem::launch
