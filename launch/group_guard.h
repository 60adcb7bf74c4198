// The group guard: kills every rank's process group when the launcher itself
// is SIGKILLed, so nothing the ranks started outlives it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <vector>

namespace tandem::launch {

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

}  // namespace tandem::launch
