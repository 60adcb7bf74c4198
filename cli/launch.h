// `tandem launch`: runs N local ranks of a command around a bootstrap store.
//
// The launcher hosts a StoreServer on 127.0.0.1, starts every rank in its own
// process group with TANDEM_RANK / TANDEM_WORLD_SIZE / TANDEM_LOCAL_RANK /
// TANDEM_LOCAL_WORLD_SIZE / TANDEM_STORE_ADDR set, and relays each rank's
// stdout and stderr line by line with a "[rank] " prefix. The first rank to
// fail (non-zero exit or signal) is recorded in the store so the others fail
// fast; after a grace period the rest are terminated, then killed.
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

struct LaunchOptions {
  int nprocs = 1;
  double timeout_seconds = 0;  // whole job; 0 = no limit
  double grace_seconds = 10;   // after the first failure, before SIGTERM
  double kill_after_seconds = 3;  // after SIGTERM, before SIGKILL
  std::vector<std::string> command;  // argv of every rank; command[0] is looked up in PATH
  // Parameter-server ranks started after the nprocs workers (ranks nprocs..nprocs+servers-1),
  // each running `tandem ps serve` from this executable; every rank gets TANDEM_SERVERS.
  int servers = 0;
};

inline constexpr int kMaxLocalRanks = 1024;

// Exit status of the launcher process, shell-style: 0 when every rank
// succeeded; the first failing rank's exit code (128 + signal when killed);
// 124 on --timeout; 126/127 when the command cannot be run / is not found;
// 2 for invalid options.
int run_launch(const LaunchOptions& options);

// Returns an error message naming the bad flag, or "" when the options are valid.
std::string validate(const LaunchOptions& options);

}  // namespace tandem::cli
