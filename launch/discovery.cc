#include "discovery.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace tandem::launch {

HostDiscovery::~HostDiscovery() {
  if (out_fd_ >= 0) ::close(out_fd_);
  if (pid_ > 0) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void HostDiscovery::start() {
  output_.clear();
  killed_ = false;
  started_ = Clock::now();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    failure_ = std::string("cannot make a pipe: ") + std::strerror(errno);
    next_run_ = started_ + kInterval;
    return;
  }
  const char* argv[] = {"sh", "-c", script_.c_str(), nullptr};
  pid_ = ::fork();
  if (pid_ == 0) {    // only async-signal-safe calls from here: the launcher has threads
    ::setpgid(0, 0);  // killed as a group when it takes too long
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the launcher blocks the signals it reads from a signalfd
    ::dup2(fds[1], STDOUT_FILENO);
    ::execv("/bin/sh", const_cast<char**>(argv));
    ::_exit(127);
  }
  const int rc = pid_ < 0 ? errno : 0;
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    pid_ = -1;
    failure_ = std::string("cannot fork: ") + std::strerror(rc);
    next_run_ = started_ + kInterval;
    return;
  }
  out_fd_ = fds[0];
  ::fcntl(out_fd_, F_SETFL, ::fcntl(out_fd_, F_GETFL) | O_NONBLOCK);
}

void HostDiscovery::pump() {
  char buf[4096];
  while (out_fd_ >= 0) {
    const ssize_t n = ::read(out_fd_, buf, sizeof buf);
    if (n > 0) {
      output_.append(buf, size_t(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      ::close(out_fd_);
      out_fd_ = -1;
    } else if (errno == EAGAIN) {
      return;
    }
  }
}

bool HostDiscovery::reaped(pid_t pid, int status) {
  if (pid_ <= 0 || pid != pid_) return false;
  finish(status);
  return true;
}

void HostDiscovery::finish(int status) {
  pump();
  if (out_fd_ >= 0) ::close(out_fd_), out_fd_ = -1;  // a child it left holds the pipe: its output is cut here
  pid_ = -1;
  next_run_ = Clock::now() + kInterval;
  if (killed_) {
    failure_ = "'" + script_ + "' ran longer than " + std::to_string(kPatience.count()) + " s and was killed";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    failure_ = "'" + script_ + "' " +
               (WIFEXITED(status) ? "exited with " + std::to_string(WEXITSTATUS(status))
                                  : "was killed by signal " + std::to_string(WTERMSIG(status)));
  } else {
    try {
      answer_ = parse_hostfile(output_, "the output of '" + script_ + "'");
      failure_.clear();
    } catch (const std::invalid_argument& e) {
      failure_ = e.what();
    }
  }
}

void HostDiscovery::kill_if_overdue(Clock::time_point now) {
  if (pid_ <= 0 || killed_ || now - started_ <= kPatience) return;
  ::kill(-pid_, SIGKILL);
  killed_ = true;
}

std::string HostDiscovery::poll(Clock::time_point now) {
  kill_if_overdue(now);
  if (pid_ <= 0 && now >= next_run_) start();
  if (failure_.empty()) {
    failing_ = false;
    return "";
  }
  if (failing_) return "";
  failing_ = true;
  return "host discovery: " + failure_ + "; the hosts it offered before stand";
}

std::optional<std::vector<HostSlots>> HostDiscovery::take_answer() {
  auto out = std::move(answer_);
  answer_.reset();
  return out;
}

std::vector<HostSlots> HostDiscovery::ask_now() {
  start();
  while (pid_ > 0) {
    pollfd p{out_fd_, POLLIN, 0};
    ::poll(&p, out_fd_ >= 0 ? 1 : 0, 100);  // without its output open, a 100 ms sleep: it may still run
    pump();
    kill_if_overdue(Clock::now());
    int status = 0;
    const pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      finish(status);
    } else if (done < 0 && errno != EINTR) {
      pid_ = -1;
      failure_ = std::string("waiting for '") + script_ + "': " + std::strerror(errno);
    }
  }
  if (!failure_.empty()) throw std::runtime_error("--host-discovery-script: " + failure_);
  return take_answer().value_or(std::vector<HostSlots>{});
}

std::vector<HostSlots> discover_hosts(const std::string& script) { return HostDiscovery(script).ask_now(); }

}  // namespace tandem::launch
