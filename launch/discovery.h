// --host-discovery-script (horovodrun's): a command that prints the hosts
// and slots on offer now, one a line ("host:slots", or a host file's lines).
// The launcher runs it about every second without blocking its supervision
// loop; an elastic job grows onto slots it offers beyond the workers running.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "tandem/launch/launch.h"

namespace tandem::launch {

class HostDiscovery {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kInterval = std::chrono::seconds(1);   // from one answer to the next run
  static constexpr auto kPatience = std::chrono::seconds(10);  // a run past this is killed

  explicit HostDiscovery(std::string script) : script_(std::move(script)) {}
  ~HostDiscovery();
  HostDiscovery(const HostDiscovery&) = delete;
  HostDiscovery& operator=(const HostDiscovery&) = delete;

  // Runs the script once and waits for its answer (at the start, before any rank).
  // Throws std::runtime_error saying what went wrong.
  std::vector<HostSlots> ask_now();

  // From the supervision loop: starts a run when one is due, kills one past
  // kPatience. Returns a line to say when a run failed after one succeeded
  // (once per failing streak), else "".
  std::string poll(Clock::time_point now);
  int fd() const { return out_fd_; }  // the running script's stdout, else -1
  void pump();                        // reads what is there to read
  // From the launcher's reaping: true when `pid` was the script (its answer is taken).
  bool reaped(pid_t pid, int status);
  // A new answer since the last call, or nothing.
  std::optional<std::vector<HostSlots>> take_answer();

 private:
  void start();
  void finish(int status);
  void kill_if_overdue(Clock::time_point now);  // a run past kPatience, with what it started

  std::string script_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string output_;
  Clock::time_point started_{}, next_run_{};
  std::optional<std::vector<HostSlots>> answer_;
  std::string failure_;   // the last run's, "" when it succeeded
  bool failing_ = false;  // said once per streak
  bool killed_ = false;
};

}  // namespace tandem::launch
