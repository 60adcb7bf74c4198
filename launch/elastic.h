// --elastic and --max-restarts (tandem/launch/launch.h): which ranks are
// workers, when every other worker is done, and where a lost worker's
// replacement runs and under what number. The supervisor acts on the answers.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "spawn.h"
#include "tandem/launch/launch.h"

namespace tandem::launch {

class Elastic {
 public:
  using Clock = std::chrono::steady_clock;
  using RecordedFailed = std::function<bool(int rank)>;  // the store records the rank as failed

  explicit Elastic(const LaunchOptions& o) : opts_(o) {}

  bool on() const { return opts_.elastic_min > 0; }
  // Workers: the first nprocs ranks and their replacements (parameter servers come between).
  bool is_worker(const Rank& r) const { return r.rank < opts_.nprocs || is_replacement(r); }
  bool is_replacement(const Rank& r) const { return r.rank >= opts_.nprocs + opts_.servers; }
  long workers_running(const std::vector<Rank>& ranks) const;
  // Every worker but `except` (and the replacements, with `but_replacements`) finished or was lost.
  bool others_finished(const std::vector<Rank>& ranks, const Rank* except, bool but_replacements,
                       const RecordedFailed& failed) const;

  // Some rank runs, and every one running is a replacement.
  bool only_replacements_running(const std::vector<Rank>& ranks) const;

  struct Replacement {
    int number;  // in the job: after every process so far, never reused
    int slot;    // the first-generation rank whose placement it takes
  };
  // The replacement for `lost`, or nothing once --max-restarts are used up.
  std::optional<Replacement> replace(const Rank& lost);
  int restarts() const { return restarts_; }

  // Replacements still running (never admitted) kill_after_seconds after every
  // other worker finished: nobody will admit them. Empty until then.
  std::vector<Rank*> waiting_in_vain(std::vector<Rank>& ranks, const RecordedFailed& failed, Clock::time_point now);

 private:
  const LaunchOptions& opts_;
  int restarts_ = 0;
  std::vector<int> slot_of_;  // by number: the slot a replacement runs on
  std::optional<Clock::time_point> others_done_at_;
};

}  // namespace tandem::launch
