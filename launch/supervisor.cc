// Supervision of a launch (tandem/launch/launch.h): the Launcher starts the
// ranks, relays their output, stops them after a failure or a signal, and
// turns how they ended into the job's exit status.

// Terms used below:
//   rank    one child process started by the launcher (its pid is also its
//           process-group id, so signals reach whatever it started too);
//   stream  the read end of one rank's stdout or stderr pipe;
//   phase   where shutdown stands: running -> grace (a rank failed; the
//           others may still exit on their own) -> terminating (SIGTERM
//           sent) -> killing (SIGKILL sent).
// Every wait is bounded: poll() wakes at least every kTick, and each phase
// has a deadline after which the next, harsher one starts.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
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
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "discovery.h"
#include "elastic.h"
#include "job_end.h"
#include "job_store.h"
#include "placement.h"
#include "remote_shell.h"
#include "signals.h"
#include "spawn.h"
#include "streams.h"
#include "tandem/launch/launch.h"
#include "tandem/store.h"

namespace tandem::launch {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kTick = 100ms;   // longest poll() sleep
constexpr auto kLinger = 1s;    // for pipes held open by a rank's descendants
constexpr auto kKillWait = 5s;  // after SIGKILL; only a stuck kernel exceeds it

enum class Phase { running, grace, terminating, killing };

class Launcher {
 public:
  explicit Launcher(const LaunchOptions& o) : opts_(o) {}

  int run() {
    const std::vector<Placement> placement = place_ranks(opts_);
    const bool any_remote =
        std::any_of(placement.begin(), placement.end(), [](const Placement& p) { return p.remote(); });
    const bool any_local =
        !any_remote || std::any_of(placement.begin(), placement.end(), [](const Placement& p) { return !p.remote(); });
    // Looked up here, so a missing command or remote shell fails before any rank starts.
    Programs programs;
    if (!opts_.host_discovery_script.empty()) discovery_.emplace(opts_.host_discovery_script);
    if (const int failed =
            resolve_programs(opts_, any_local || discovery_, any_remote, discovery_.has_value(), programs))
      return failed;
    const bool reach_other_hosts = any_remote || (discovery_ && !opts_.store_address.empty());
    const rlimit child_files = raise_file_limit();
    SignalGuard signals;  // before the store, whose thread must inherit the mask
    if (signals.fd() < 0) {
      say(std::string("signalfd: ") + std::strerror(errno));
      return 1;
    }
    std::unique_ptr<StoreServer> store = start_store(reach_other_hosts);
    if (!store) return 1;
    store_ = store.get();
    // torchrun's variables for the workers: rank 0 hosts torch's store on its host.
    TorchJob torch;
    const std::string rank0_host = placement[0].remote() ? placement[0].host : store_host_;
    if (std::string why = plan_torch_job(placement, opts_.nprocs, rank0_host, store->port(),
                                         environment_with(opts_.environment), torch);
        !why.empty()) {
      say(why);
      return 2;
    }
    // Orphaned descendants of the ranks become our children, not init's, so
    // they are reaped even in containers whose init never reaps.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    start_ = Clock::now();
    GroupGuard guard;
    if (!guard.start(size_t(elastic_.most_processes())))
      say(std::string("cannot start the group guard (") + std::strerror(errno) +
          "); if the launcher is killed, what the ranks started may outlive it");
    spawn_ = {&placement, &programs, &torch, child_files, &guard, allowed_cpus()};
    ranks_.reserve(size_t(elastic_.most_processes()));  // Rank pointers stay valid
    remote_ok_ = reach_other_hosts && programs.rsh;
    spawn_all();
    loop(signals.fd());
    guard.stop();
    reap_orphans();
    store_ = nullptr;
    return finish();
  }

  int interrupt_signal() const { return interrupt_signal_; }

 private:
  // The bootstrap store (job_store.h). Null (said why) on failure.
  std::unique_ptr<StoreServer> start_store(bool reach_other_hosts) {
    try {
      JobStore js = start_job_store(opts_, reach_other_hosts);
      secret_ = js.secret, store_address_ = js.address, store_host_ = js.host;
      return std::move(js.server);
    } catch (const std::exception& e) {
      say(std::string("cannot start the bootstrap store: ") + e.what());
      return nullptr;
    }
  }

  // Starts every rank (parameter-server ranks run server_command, already a
  // path: `tandem ps serve`); after a failed start, kills those running.
  void spawn_all() {
    const int world = opts_.nprocs + opts_.servers;
    ranks_.resize(static_cast<size_t>(world));
    for (int i = 0; i < world; ++i) {
      if (!spawn_one(ranks_[size_t(i)], i, world, (*spawn_.placement)[size_t(i)], {})) break;
    }
  }

  // Starts rank r as process `number` of a job of `world` at `at`, with
  // `extra` job variables; false (and every rank killed) if it cannot start.
  bool spawn_one(Rank& r, int number, int world, const Placement& at, const std::vector<std::string>& extra) {
    const bool server = number >= opts_.nprocs && number < opts_.nprocs + opts_.servers;
    const std::vector<std::string>& serve = opts_.server_command;
    r.rank = number;
    std::vector<std::string> job = job_variables(number, world, at, store_address_, opts_.servers, *spawn_.torch);
    job.insert(job.end(), extra.begin(), extra.end());
    const std::optional<cpu_set_t> cpus = opts_.bind == "auto" && !at.remote()
                                              ? cpu_share(spawn_.launcher_cpus, at.local_rank, at.local_size)
                                              : std::nullopt;
    std::string error;
    const int rc = at.remote()
                       ? spawn_rank(r, *spawn_.programs->rsh,
                                    remote_command(opts_.rsh, at.host, job, opts_.command, opts_.environment),
                                    rank_environment({}, "", opts_.environment), secret_, spawn_.child_files, nullptr,
                                    error, *spawn_.guard)
                       : spawn_rank(r, server ? serve[0] : *spawn_.programs->command, server ? serve : opts_.command,
                                    rank_environment(job, secret_, opts_.environment), "", spawn_.child_files,
                                    cpus ? &*cpus : nullptr, error, *spawn_.guard);
    if (rc == 0) return true;
    say("rank " + std::to_string(number) + ": " + error);
    spawn_failure_ = rc;
    // The ranks already running would wait for the missing one forever.
    enter(Phase::killing, SIGKILL, kKillWait);
    return false;
  }

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
      if (discovery_ && discovery_->fd() >= 0) fds.push_back({discovery_->fd(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), poll_timeout_ms(linger_until));

      if (fds[0].revents & POLLIN) handle_signals(signal_fd);
      if (discovery_) discovery_->pump();
      for (size_t i = 1; i <= streams.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) streams[i - 1]->pump();
      }
      reap();
      stop_left_out();
      replace_silent();
      add_offered_workers();
      end_grace_for_replacements();
      check_deadlines();
      if (opts_.on_tick) opts_.on_tick();
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
      if (discovery_ && discovery_->reaped(pid, status)) continue;
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
      if (goes_on_without(*it)) continue;
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

  // --elastic: a worker lost while enough others run is recorded (the others
  // shrink past it), replaced while --max-restarts are left, and the job goes
  // on. One that exits after the others finished, which the store recorded as
  // failed before (a stopped worker left out that woke), was lost then: the
  // job's outcome stands.
  bool goes_on_without(Rank& lost) {
    if (!elastic_.on() || first_failure_ || stopping() || spawn_failure_ != 0 || !elastic_.is_worker(lost))
      return false;
    const long workers = elastic_.workers_running(ranks_);
    if (workers == 0 && elastic_.others_finished(ranks_, &lost, false, failed_fn()) && recorded_failed(lost.rank)) {
      ++lost_workers_;
      say("rank " + std::to_string(lost.rank) + " was recorded as failed before; the job went on without it");
      return true;
    }
    if (workers < opts_.elastic_min) return false;
    ++lost_workers_;
    record_failure_in_store(lost.rank, describe(lost.status));
    say("the job goes on with " + std::to_string(workers) + " worker(s) (--elastic " +
        std::to_string(opts_.elastic_min) + ":" + std::to_string(opts_.elastic_max) + ")");
    replace(lost);
    return true;
  }

  // Starts the replacement of `lost`, once, while --max-restarts are left.
  void replace(Rank& lost) {
    if (std::exchange(lost.replaced, true)) return;
    const auto next = elastic_.replace(lost, *spawn_.placement);
    if (!next) return;
    say("starting rank " + std::to_string(next->number) + " on rank " + std::to_string(next->slot) +
        "'s slot to join the job (restart " + std::to_string(elastic_.restarts()) + " of " +
        std::to_string(opts_.max_restarts) + ", --max-restarts)");
    ranks_.emplace_back();  // within the capacity reserved: Rank pointers stay valid
    spawn_one(ranks_.back(), next->number, next->number + 1, next->at, {"TANDEM_JOIN=1"});
  }

  // --elastic: a worker the store records as failed while it still runs
  // (silent: stopped or hung; the others went on without it) is replaced at
  // once, not when it exits. It is fenced (its writes are refused) and is
  // stopped once the others finish.
  void replace_silent() {
    if (!elastic_.on() || first_failure_ || stopping() || !store_ || opts_.max_restarts == 0) return;
    for (size_t i = 0; i < ranks_.size(); ++i) {  // replace() appends
      Rank& r = ranks_[i];
      if (!elastic_.is_worker(r) || !r.running || r.replaced || !recorded_failed(r.rank)) continue;
      say("rank " + std::to_string(r.rank) + " is recorded as failed but still runs (silent); the job went on " +
          "without it");
      replace(r);
    }
  }

  // --elastic: once every other worker has finished, a worker the store
  // records as failed (left out while stopped or silent) is stopped too; it
  // could never finish, nor rejoin. So is a replacement never admitted.
  void stop_left_out() {
    if (!elastic_.on() || first_failure_ || stopping() || !store_) return;
    const auto left_out = [&](const Rank& r) {
      return elastic_.is_worker(r) && r.running && !r.signalled_by_us && recorded_failed(r.rank);
    };
    const bool only_left_out = std::all_of(ranks_.begin(), ranks_.end(), [&](const Rank& r) {
      return !elastic_.is_worker(r) || left_out(r) || !r.running;
    });
    for (Rank& r : ranks_) {
      if (!only_left_out || !left_out(r)) continue;
      say("rank " + std::to_string(r.rank) + " was left out of the job (the store records it as failed) and is still " +
          "running after the others finished; stopping it");
      signal_rank(r, SIGKILL);
      ++lost_workers_;
    }
    for (Rank* r : elastic_.waiting_in_vain(ranks_, failed_fn(), Clock::now())) {
      say("rank " + std::to_string(r->rank) +
          ", a replacement, was not admitted before the others finished; stopping it");
      signal_rank(*r, SIGTERM);
    }
  }

  // --host-discovery-script: a worker that joins the job on each slot offered beyond those running.
  void add_offered_workers() {
    if (!discovery_ || first_failure_ || stopping() || spawn_failure_ != 0) return;
    if (const std::string failed = discovery_->poll(Clock::now()); !failed.empty()) say(failed);
    const auto offered = discovery_->take_answer();
    if (!offered) return;
    std::vector<std::string> refused;
    for (const Elastic::Started& add : elastic_.add_offered(*offered, ranks_, *spawn_.placement, remote_ok_, refused)) {
      say("starting rank " + std::to_string(add.number) + " on a slot of " +
          (add.at.remote() ? add.at.host : "this host") + " offered by --host-discovery-script, to join the job");
      ranks_.emplace_back();  // within the capacity reserved: Rank pointers stay valid
      const int world = std::max(add.number + 1, add.at.local_size);  // a joiner's own comes from the members
      if (!spawn_one(ranks_.back(), add.number, world, add.at, {"TANDEM_JOIN=1"})) return;
    }
    for (const std::string& host : refused)
      if (said_refused_.insert(host).second)
        say("--host-discovery-script offers " + host + ", but the job's store listens on this host only (every " +
            "starting rank is here): give --store-addr with an address " + host + " reaches to let it join");
  }

  // A failing job whose other workers all exited: replacements still running wait to join a job that is over.
  void end_grace_for_replacements() {
    if (phase_ != Phase::grace || !elastic_.only_replacements_running(ranks_)) return;
    say("only replacements are left in the failed job; stopping them");
    enter(Phase::terminating, SIGTERM, seconds(opts_.kill_after_seconds));
  }

  Elastic::RecordedFailed failed_fn() const {
    return [this](int rank) { return recorded_failed(rank); };
  }

  bool recorded_failed(int rank) const { return store_ && store_records_failed(*store_, rank); }
  // Lets ranks blocked in a collective fail fast with PeerFailure naming the
  // rank, instead of waiting for their timeout.
  void record_failure_in_store(int rank, const std::string& how) {
    if (store_) record_failure(*store_, rank, how);
  }

  void check_deadlines() {
    auto now = Clock::now();
    auto running = [&] { return std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }); };
    if (!timed_out_ && job_deadline() && now >= *job_deadline() && !first_failure_ && interrupt_signal_ == 0 &&
        running() > 0) {
      timed_out_ = true;
      say("timeout: the job exceeded --timeout " + seconds_text(opts_.timeout_seconds) + "; terminating all ranks");
      enter(Phase::terminating, SIGTERM, seconds(opts_.kill_after_seconds));
      return;
    }
    if (!phase_deadline_ || now < *phase_deadline_) return;
    switch (phase_) {
      case Phase::running: break;
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
          if (r.running)
            say("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") did not die; giving up on it");
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
    return report_job_end(
        {failed_, stopped_by_us_, spawn_failure_, first_failure_, timed_out_, interrupt_signal_, lost_workers_}, opts_);
  }

  const LaunchOptions& opts_;
  std::vector<Rank> ranks_;
  StoreServer* store_ = nullptr;
  std::string secret_;                    // the job secret the store admits
  std::string store_address_;             // host:port, as the ranks reach it
  std::string store_host_ = "127.0.0.1";  // where the ranks reach this host
  Clock::time_point start_{};
  Phase phase_ = Phase::running;
  std::optional<Clock::time_point> phase_deadline_;
  const Rank* first_failure_ = nullptr;
  int spawn_failure_ = 0;
  bool timed_out_ = false;
  int interrupt_signal_ = 0;
  int failed_ = 0;
  int lost_workers_ = 0;  // --elastic: failed workers the job went on without
  Elastic elastic_{opts_};
  std::optional<HostDiscovery> discovery_;  // --host-discovery-script
  bool remote_ok_ = false;                  // other hosts can run ranks that reach the store
  std::set<std::string> said_refused_;      // offered hosts refused, said once each
  SpawnContext spawn_;
  int stopped_by_us_ = 0;
};

}  // namespace

LaunchResult launch(const LaunchOptions& options) {
  LaunchOptions o = options;
  if (o.nprocs == -1 && !o.hosts.empty()) {
    o.nprocs = 0;
    for (const HostSlots& h : o.hosts) o.nprocs += h.slots;
    if (o.elastic_max > 0) o.nprocs = std::min(o.nprocs, o.elastic_max);  // more slots: room to replace or grow
  }
  if (std::string error = validate(o); !error.empty()) {
    say(error);
    return {2, 0};
  }
  Launcher launcher(o);
  const int code = launcher.run();
  return {code, launcher.interrupt_signal()};
}

int run_launch(const LaunchOptions& options) { return launch(options).exit_code; }

}  // namespace tandem::launch
