// --elastic, --max-restarts and --host-discovery-script
// (tandem/launch/launch.h): which ranks are workers, when every other worker
// is done, and where a lost worker's replacement or a worker added on an
// offered slot runs and under what number. The supervisor acts on the answers.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "placement.h"
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

  // A process started after the first ones: a replacement or an added worker.
  struct Started {
    int number;  // in the job: after every process so far, never reused
    int slot;    // the first-generation rank whose placement a replacement takes; an added worker's own number
    Placement at;
  };
  // The replacement for `lost`, or nothing once --max-restarts are used up.
  std::optional<Started> replace(const Rank& lost, const std::vector<Placement>& first);
  int restarts() const { return restarts_; }
  // Workers to start on the slots `offered` (--host-discovery-script) beyond
  // the workers running on each host, up to elastic_max running and
  // elastic_max - nprocs added in the job; none once a worker has finished
  // (the job is ending). Hosts other than this one only
  // when `remote_ok`; else they are named in `refused`.
  std::vector<Started> add_offered(const std::vector<HostSlots>& offered, const std::vector<Rank>& ranks,
                                   const std::vector<Placement>& first, bool remote_ok,
                                   std::vector<std::string>& refused);
  // The most processes the job may start in all.
  int most_processes() const { return opts_.nprocs + opts_.servers + opts_.max_restarts + most_added(); }

  // Replacements still running (never admitted) kill_after_seconds after every
  // other worker finished: nobody will admit them. Empty until then.
  std::vector<Rank*> waiting_in_vain(std::vector<Rank>& ranks, const RecordedFailed& failed, Clock::time_point now);

 private:
  int most_added() const { return opts_.host_discovery_script.empty() ? 0 : opts_.elastic_max - opts_.nprocs; }
  const Placement& placement_of(int number, const std::vector<Placement>& first) const;
  int node_of(const std::string& host);
  Started& start_next(int slot, Placement at);

  const LaunchOptions& opts_;
  int restarts_ = 0, added_ = 0;
  std::vector<Started> later_;            // by number - (nprocs + servers)
  std::vector<std::string> other_hosts_;  // hosts first offered by discovery, after opts_.hosts
  std::optional<Clock::time_point> others_done_at_;
};

}  // namespace tandem::launch
