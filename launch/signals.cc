// The launcher's signals (signals.h).
#include "signals.h"

#include <pthread.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace tandem::launch {

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
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

void signal_rank(Rank& r, int sig) {
  if (r.pid <= 0) return;
  if (::killpg(r.pid, sig) != 0 && r.running) ::kill(r.pid, sig);
  if (r.running) r.signalled_by_us = true;
}

SignalGuard::SignalGuard() {
  sigemptyset(&set_);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set_, sig);
  ::pthread_sigmask(SIG_BLOCK, &set_, &old_mask_);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, &old_pipe_);
  fd_ = ::signalfd(-1, &set_, SFD_NONBLOCK | SFD_CLOEXEC);
}

SignalGuard::~SignalGuard() {
  if (fd_ >= 0) ::close(fd_);
  ::sigaction(SIGPIPE, &old_pipe_, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

}  // namespace tandem::launch
