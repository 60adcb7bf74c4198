// The launcher's signals: names for them, signalling a rank's process
// group, and the mask under which the supervision loop reads them.
#pragma once

#include <signal.h>

#include <string>

#include "spawn.h"

namespace tandem::launch {

std::string signal_name(int sig);
// "killed by signal SIGKILL", "exited with code 3".
std::string describe(int status);
// "2.5s".
std::string seconds_text(double s);

// Signals the rank's whole process group (the command and anything it
// started). Also used after the rank itself has exited while descendants
// still hold its pipes: the group lives as long as any member does.
void signal_rank(Rank& r, int sig);

// Blocks the signals the launcher handles (they arrive through a signalfd in
// the poll set) for the lifetime of the object; the store's I/O thread is
// created afterwards and so inherits the mask.
class SignalGuard {
 public:
  SignalGuard();
  ~SignalGuard();
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;
  int fd() const { return fd_; }

 private:
  sigset_t set_{}, old_mask_{};
  struct sigaction old_pipe_ {};
  int fd_ = -1;
};

}  // namespace tandem::launch
