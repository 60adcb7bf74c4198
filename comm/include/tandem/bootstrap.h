// Reading who-am-I from the environment, once, into CommOptions.
//
// Order: TANDEM_RANK / TANDEM_WORLD_SIZE / TANDEM_LOCAL_RANK /
// TANDEM_LOCAL_WORLD_SIZE / TANDEM_STORE_ADDR (set by `tandem launch`), else
// Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE), else Slurm
// (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE).
// Under Open MPI or Slurm without TANDEM_STORE_ADDR, rank 0 hosts the store on
// 127.0.0.1 at a port derived from the job id when the whole job is on one
// node; multi-node jobs must set TANDEM_STORE_ADDR (or MASTER_ADDR/MASTER_PORT).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "tandem/communicator.h"

namespace tandem {

// The environment as a lookup, so tests can pass a map instead of setenv.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Throws InvalidArgument naming the variable and the fix when the environment
// is incomplete or contradictory (e.g. rank >= world size).
CommOptions options_from_env(const EnvLookup& env = process_env());

// Only the tuning and interface knobs (TANDEM_TIMEOUT_MS, TANDEM_HEARTBEAT_MS,
// TANDEM_NETWORK_INTERFACE, ...; the tables of tandem/settings.h), for a communicator whose rank,
// size and store come from elsewhere (a framework's store, CommOptions::store).
// Throws InvalidArgument naming a malformed variable.
CommOptions tuning_from_env(const EnvLookup& env = process_env());

// The job secret: TANDEM_SECRET, else the contents of TANDEM_SECRET_FILE
// (mode 0600 or stricter), else "" (a store without a secret). Throws
// InvalidArgument for a short secret or a file others may read.
std::string read_secret(const EnvLookup& env = process_env());

// Rendezvous privacy, checked by options_from_env: a store reachable from
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

// Which launcher the options came from: "tandem", "openmpi", "slurm".
std::string detect_launcher(const EnvLookup& env = process_env());

}  // namespace tandem
