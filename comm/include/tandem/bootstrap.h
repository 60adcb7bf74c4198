// Reading who-am-I from the environment, once, into CommOptions.
//
// Order (the first launcher whose variables are present is read; the others
// are ignored): TANDEM_RANK / TANDEM_WORLD_SIZE / TANDEM_LOCAL_RANK /
// TANDEM_LOCAL_WORLD_SIZE / TANDEM_STORE_ADDR (set by `tandem launch`, which
// also sets torchrun's variables for torch), else torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE), else Open MPI (OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK, _LOCAL_SIZE), else MPICH's Hydra (PMI_RANK, PMI_SIZE,
// MPI_LOCALRANKID, MPI_LOCALNRANKS; read as Slurm when they equal SLURM_PROCID
// and SLURM_NTASKS, as srun --mpi=pmi2 sets them), else Slurm (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE).
// Outside `tandem launch`, rank 0 hosts the store: at TANDEM_STORE_ADDR, else
// at MASTER_ADDR on MASTER_PORT + 1 (MASTER_PORT is torch's TCPStore), else
// (a job of one node under Open MPI, Hydra with PMI_JOBID, or Slurm) on
// 127.0.0.1 at a port derived from the job id, else (multi-node Slurm) on the
// first node of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) at
// slurm_store_port(). Other jobs must set TANDEM_STORE_ADDR or MASTER_ADDR
// and MASTER_PORT; the errors say so. docs/running.md has the whole table.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tandem/communicator.h"

namespace tandem {

// The environment as a lookup, so tests can pass a map instead of setenv.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Throws InvalidArgument naming the variable and the fix when the environment
// is incomplete or contradictory (e.g. rank >= world size).
CommOptions comm_options_from_env(const EnvLookup& env = process_env());

// Only the tuning and interface knobs (TANDEM_TIMEOUT_MS, TANDEM_HEARTBEAT_MS,
// TANDEM_NETWORK_INTERFACE, ...; the tables of tandem/settings.h), for a communicator whose rank,
// size and store come from elsewhere (a framework's store, CommOptions::store).
// Throws InvalidArgument naming a malformed variable.
CommOptions tuning_from_env(const EnvLookup& env = process_env());

// The job secret: TANDEM_SECRET, else the contents of TANDEM_SECRET_FILE
// (mode 0600 or stricter), else "" (a store without a secret). Throws
// InvalidArgument for a short secret or a file others may read.
std::string read_secret(const EnvLookup& env = process_env());

// Rendezvous privacy, checked by comm_options_from_env: a store reachable from
// other hosts (a non-loopback TANDEM_STORE_ADDR or MASTER_ADDR) needs the job
// secret unless allow_no_secret (TANDEM_ALLOW_NO_SECRET=1), and rank 0 hosts
// the store on every address (0.0.0.0, ::) only with store_listen_all
// (TANDEM_STORE_LISTEN_ALL=1); both log a warning when allowed. Throws
// InvalidArgument naming the fix.
void check_store_privacy(const CommOptions& options);

// The interface override: TANDEM_NETWORK_INTERFACE, else DTRAIN_NETWORK_INTERFACE
// ("" when neither is set). Throws InvalidArgument when both are set and
// disagree, or for a syntax error (tandem/netif.h).
std::string network_interface_from_env(const EnvLookup& env = process_env());

// Which launcher the options came from: "tandem", "torchrun", "openmpi",
// "pmi" (MPICH's Hydra), "slurm", or "none".
std::string detect_launcher(const EnvLookup& env = process_env());

// Slurm's host list syntax, expanded in order: "node[01-04,07],gpu3" is
// node01 node02 node03 node04 node07 gpu3 (numbers as wide as the range's
// first; several brackets in one name multiply). Throws InvalidArgument
// naming the list for unbalanced or nested brackets, an empty name or range,
// a range that runs backwards, or more than 2^20 hosts.
std::vector<std::string> expand_slurm_hostlist(const std::string& list);

// The port of the store rank 0 hosts under srun without an address:
// 20000 + 4 * (SLURM_JOB_ID mod 10000) + SLURM_STEP_ID mod 4, in 20000..59999,
// so 10,000 consecutive jobs and 4 concurrent steps of one job never share it.
uint16_t slurm_store_port(uint64_t job_id, uint64_t step_id);

}  // namespace tandem
