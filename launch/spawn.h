// Starting one rank: its environment (the job variables), PATH resolution of
// the command, and fork/exec into its own process group with its output piped.
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "group_guard.h"
#include "placement.h"
#include "streams.h"
#include "tandem/bootstrap.h"

namespace tandem::launch {

struct Rank {
  int rank = 0;
  pid_t pid = -1;  // also the process-group id
  bool running = false;
  bool signalled_by_us = false;
  bool replaced = false;  // --elastic: its replacement was asked for (started, or none left)
  int status = 0;         // wait status once reaped
  Stream out, err;

  bool streams_open() const { return out.fd >= 0 || err.fd >= 0; }
};

// What the launcher sets per rank: never inherited from its own environment.
inline constexpr const char* kOwnedVariables[] = {
    "TANDEM_RANK=",   "TANDEM_WORLD_SIZE=",  "TANDEM_LOCAL_RANK=", "TANDEM_LOCAL_WORLD_SIZE=", "TANDEM_STORE_ADDR=",
    "TANDEM_SECRET=", "TANDEM_SECRET_FILE=", "TANDEM_JOB_ID=",     "TANDEM_SERVERS=",          "TANDEM_JOIN="};

// Whether `kv` (NAME=value) names a variable that one of `settings` (NAME=value each) sets.
bool set_by(std::string_view kv, const std::vector<std::string>& settings);

// Why `settings` (LaunchOptions::environment) cannot go to the ranks: an entry
// not NAME=value, a bad name, a variable the launcher sets per rank, or one
// given twice; "" when they can.
std::string check_environment(const std::vector<std::string>& settings);

// This process's environment with `settings` (NAME=value each) in front.
EnvLookup environment_with(const std::vector<std::string>& settings);

// Shell convention: the exit code, or 128 + signal number.
int exit_code_of(int status);

// PATH lookup done once in the launcher, so a missing command is reported
// before any rank starts. Returns the path or sets exit_code to 127 / 126.
std::optional<std::string> resolve_command(const std::string& name, const EnvLookup& env, int& exit_code,
                                           std::string& error);

// What torch.distributed's env:// rendezvous reads, as torchrun sets it, for
// the workers (ranks 0..workers-1; parameter servers get none of it): rank 0
// hosts torch's TCPStore at MASTER_ADDR:MASTER_PORT, a port apart from tandem's store.
struct TorchJob {
  std::string master_addr, master_port;
  int workers = 0;
  std::vector<int> workers_on_node;  // by Placement::node: LOCAL_WORLD_SIZE
};

// MASTER_ADDR and MASTER_PORT as the user exported them (`env`: the
// launcher's environment with its settings), else `rank0_host` and a port
// free on this host that is not `store_port`. Returns "" or, when the user's
// MASTER_PORT is the port of the store on the same host, the usage error.
std::string plan_torch_job(const std::vector<Placement>& placement, int workers, const std::string& rank0_host,
                           uint16_t store_port, const EnvLookup& env, TorchJob& torch);

// The job variables of one rank, NAME=value: tandem's (TANDEM_RANK, ...) and,
// for a worker, torchrun's (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, MASTER_ADDR, MASTER_PORT).
std::vector<std::string> job_variables(int rank, int world, const Placement& at, const std::string& store_addr,
                                       int servers, const TorchJob& torch);

// The parent's environment minus stale TANDEM_* job variables and what
// `settings` or `job` replaces, plus `settings` and this rank's job variables.
// The job secret travels in the environment (readable by this user only), never on a command line.
std::vector<std::string> rank_environment(const std::vector<std::string>& job, const std::string& secret,
                                          const std::vector<std::string>& settings);

// Starts one rank. Returns 0, or the launcher exit code with `error` set.
// A local rank runs `command` with the job variables in its environment; a
// remote one runs `command` (already the remote shell's argv) and gets the
// secret on its standard input. `cpus`: the local rank's CPUs (null: unbound).
int spawn_rank(Rank& r, const std::string& path, const std::vector<std::string>& command,
               const std::vector<std::string>& env, const std::string& remote_secret, const rlimit& child_files,
               const cpu_set_t* cpus, std::string& error, GroupGuard& guard);

// Where the ranks' programs are: the command (local ranks) and the remote shell.
struct Programs {
  std::optional<std::string> command, rsh;
};

// The command (`need_command`) and the remote shell (`need_rsh`; with
// `want_rsh`, looked up without failing); 0, or the exit status after saying why.
int resolve_programs(const LaunchOptions& o, bool need_command, bool need_rsh, bool want_rsh, Programs& programs);

// What starting a rank needs, kept by the launcher for replacements.
struct SpawnContext {
  const std::vector<Placement>* placement = nullptr;
  const Programs* programs = nullptr;
  const TorchJob* torch = nullptr;
  rlimit child_files{};
  GroupGuard* guard = nullptr;
  std::vector<int> launcher_cpus;
};

// Each rank costs the launcher two pipes and a store connection; the default
// soft limit of 1024 descriptors would not last to -n 1024. Raises it to the
// hard limit; returns the limit the ranks inherit (as it was).
rlimit raise_file_limit();

// As child subreaper the launcher inherits what the ranks left behind; reaps
// those (already killed with their process group) so none stays a zombie.
void reap_orphans();

}  // namespace tandem::launch
