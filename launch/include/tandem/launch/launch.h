// Runs N ranks of a command around a bootstrap store, on this host or, with a
// host list, across hosts (through ssh or another remote shell, as
// horovodrun -H and mpirun do): what `tandem launch` and `tandem train` use.

// The launcher hosts a StoreServer (on 127.0.0.1 when every rank is local;
// on every address, behind the job secret, when some are not), starts every rank in its own
// process group with TANDEM_RANK / TANDEM_WORLD_SIZE / TANDEM_LOCAL_RANK /
// TANDEM_LOCAL_WORLD_SIZE / TANDEM_STORE_ADDR set (and, for the workers,
// torchrun's RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE / GROUP_RANK /
// MASTER_ADDR / MASTER_PORT, for torch.distributed's env://), and relays each rank's
// stdout and stderr line by line with a "[rank] " prefix. The first rank to
// fail (non-zero exit or signal) is recorded in the store so the others fail
// fast; after a grace period the rest are terminated, then killed.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "tandem/bootstrap.h"
#include "tandem/settings.h"

namespace tandem::launch {

// One entry of a host list: "name:slots" ("name" alone: one slot).
struct HostSlots {
  std::string host;
  int slots = 1;
  int max_slots = 0;  // a host file's max_slots: the most ranks --oversubscribe puts there (0: no cap)
};

struct LaunchOptions {
  int nprocs = -1;                // -1 (not given): every slot of `hosts`
  double timeout_seconds = 0;     // whole job; 0 = no limit
  double grace_seconds = 10;      // after the first failure, before SIGTERM
  double kill_after_seconds = 3;  // after SIGTERM, before SIGKILL
  // --elastic MIN:MAX (torchrun's --nnodes MIN:MAX, in workers): a worker
  // that fails is recorded in the store (the others shrink past it) and the
  // job goes on while at least elastic_min workers run; 0: the first failure
  // stops the job. elastic_max bounds -n (its default); workers are added
  // beyond the ones started only on slots a host_discovery_script offers.
  int elastic_min = 0, elastic_max = 0;
  // --max-restarts (torchrun's name): with --elastic, a lost worker is
  // replaced, up to this many times in the job, by a new process on its slot
  // that joins the running job (TANDEM_JOIN=1; the others admit it with
  // Communicator::grow()), numbered after every earlier process
  // (TANDEM_RANK). A replacement still waiting to join when every other
  // worker has finished is stopped after kill_after_seconds.
  int max_restarts = 0;
  // --host-discovery-script (horovodrun's): with --elastic, a shell command
  // printing the hosts and slots on offer ("host:slots" lines, or a host
  // file's), run about every second. Without -H it gives the starting hosts
  // (its first answer; -n then defaults to its slots, at most MAX). Where it
  // offers more slots than workers run, new workers start there with
  // TANDEM_JOIN=1 and join the job, up to MAX running, at most MAX - nprocs
  // such additions in the job. Slots it stops offering take no new workers;
  // workers already there run on.
  std::string host_discovery_script;
  std::vector<std::string> command;  // argv of every rank; command[0] is looked up in PATH
  // Parameter-server ranks started after the nprocs workers (ranks nprocs..nprocs+servers-1),
  // each running `server_command` (`tandem ps serve`); every rank gets TANDEM_SERVERS.
  int servers = 0;
  std::vector<std::string> server_command;
  // Across hosts: ranks fill each host's slots in order (host-major: the
  // ranks of one host are consecutive, local ranks 0..slots-1). A host named
  // localhost, 127.0.0.1 or this machine's hostname runs its ranks directly;
  // the others through `rsh`.
  std::vector<HostSlots> hosts;
  // More ranks than slots (mpirun's --oversubscribe): the extra ones go one
  // per host in turn, never past a host's max_slots.
  bool oversubscribe = false;
  // How to run a command line on another host: these words, then the host
  // (or the host in place of "{host}"), then one argument holding a shell
  // command line, as ssh takes it. E.g. "ip netns exec {host} sh -c".
  std::string rsh = "ssh -o BatchMode=yes";
  // Where ranks on other hosts reach the launcher's store: "host" or
  // "host:port" (default: this machine's hostname, any free port).
  std::string store_address;
  // "auto": each rank on this host runs on its own share of the launcher's
  // CPUs when there are at least as many CPUs as ranks here (as mpirun binds
  // to cores); left to the scheduler, two ranks can share one core for
  // seconds while the other idles. "none": never.
  std::string bind = "auto";
  // NAME=value settings every rank gets on top of this process's environment
  // (remote ranks too), e.g. TANDEM_NETWORK_INTERFACE.
  std::vector<std::string> environment;
  // Called from the supervision loop at least every 100 ms while ranks run
  // (e.g. to redraw a progress line); must not throw.
  std::function<void()> on_tick;
};

// "MIN:MAX" (or "N": N:N) -> o.elastic_min/max, and -n MAX when not given; throws std::invalid_argument.
void parse_elastic(const std::string& text, LaunchOptions& o);

// "a:2,b:2" or "a,b" -> host list; throws std::invalid_argument naming the bad entry.
std::vector<HostSlots> parse_hosts(const std::string& text);

// A host file, one host a line: `host`, `host slots=N [max_slots=M]` (Open
// MPI's and Horovod's) or `host:N` (MPICH's); `#` starts a comment. A bare host
// has one slot; a host listed again adds its slots to its first line's.
// Throws std::invalid_argument naming `name` and the line.
std::vector<HostSlots> parse_hostfile(const std::string& text, const std::string& name);
// parse_hostfile on the file at `path`.
std::vector<HostSlots> read_hostfile(const std::string& path);
// Runs a host discovery script once (at most 10 s) and parses what it
// printed as a host file; throws std::runtime_error saying what went wrong.
std::vector<HostSlots> discover_hosts(const std::string& script);

inline constexpr int kMaxLocalRanks = 1024;

// The CPUs this process may run on (sched_getaffinity), ascending; empty if unknown.
std::vector<int> allowed_cpus();

// The launcher's settings table: TANDEM_BIND into LaunchOptions::bind.
const SettingTable<LaunchOptions>& launch_settings();
// TANDEM_BIND, read through launch_settings() (a bad value is an InvalidArgument naming it).
std::string default_bind(const EnvLookup& env = process_env());

struct LaunchResult {
  int exit_code = 0;  // as run_launch returns it
  // SIGINT/SIGTERM/SIGHUP the launcher received and forwarded to the ranks; 0: none.
  int interrupt_signal = 0;
};

// Exit status of the launcher process, shell-style: 0 when every rank
// succeeded; the first failing rank's exit code (128 + signal when killed);
// 124 on --timeout; 126/127 when the command cannot be run / is not found;
// 2 for invalid options.
int run_launch(const LaunchOptions& options);
LaunchResult launch(const LaunchOptions& options);

// Returns an error message naming the bad flag, or "" when the options are valid.
std::string validate(const LaunchOptions& options);

// Runs one command in this process group and waits for it, calling `on_tick`
// every `tick_period` meanwhile. argv[0] is looked up in PATH as execvp does.
// Returns its shell-style exit status (128 + signal when killed), or 127
// (not found) / 126 with `error` set when it could not be started.
int run_and_wait(const std::vector<std::string>& argv, const std::function<void()>& on_tick,
                 std::chrono::milliseconds tick_period, std::string& error);

}  // namespace tandem::launch
