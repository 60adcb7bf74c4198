// Fuzz target: the text that reaches tandem from outside the process. The
// input is cut at NUL bytes into fields: the environment a rank starts with
// (the TANDEM_*, torchrun, Open MPI, Hydra and Slurm variables comm_options_from_env
// reads; a field "-" leaves its variable unset), then a store address, an
// interface override, a shared-memory segment locator (which a peer
// publishes through the store), a Slurm host list and shared-memory path
// rows (TANDEM_SHM_PATHS). Only tandem::Error may come out, a locator that
// parses prints back to the same text, and a path table that parses prints.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/netif.h"
#include "tandem/ring/shm_paths.h"
#include "tandem/store.h"
#include "transport/shared_segments.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

// Every variable comm_options_from_env may read, except the *_FILE ones (they name files to open).
const char* const kVariables[] = {"TANDEM_RANK",
                                  "TANDEM_WORLD_SIZE",
                                  "TANDEM_LOCAL_RANK",
                                  "TANDEM_LOCAL_WORLD_SIZE",
                                  "TANDEM_STORE_ADDR",
                                  "TANDEM_TIMEOUT_MS",
                                  "TANDEM_CONNECT_TIMEOUT_MS",
                                  "TANDEM_HEARTBEAT_MS",
                                  "TANDEM_JOB_ID",
                                  "TANDEM_SECRET",
                                  "TANDEM_SHM",
                                  "TANDEM_SHM_CHUNK_BYTES",
                                  "TANDEM_SEGMENT_BYTES",
                                  "TANDEM_SEGMENTS_IN_FLIGHT",
                                  "TANDEM_ALGO",
                                  "TANDEM_SMALL_MESSAGE_BYTES",
                                  "TANDEM_UCX_PEER_ERRORS",
                                  "TANDEM_HOST_STORE",
                                  "MASTER_ADDR",
                                  "MASTER_PORT",
                                  "OMPI_COMM_WORLD_RANK",
                                  "OMPI_COMM_WORLD_SIZE",
                                  "OMPI_COMM_WORLD_LOCAL_RANK",
                                  "OMPI_COMM_WORLD_LOCAL_SIZE",
                                  "SLURM_PROCID",
                                  "SLURM_NTASKS",
                                  "SLURM_LOCALID",
                                  "SLURM_NTASKS_PER_NODE",
                                  "SLURM_TASKS_PER_NODE",
                                  "SLURM_JOB_ID",
                                  "SLURM_STEP_ID",
                                  "TANDEM_NETWORK_INTERFACE",
                                  "DTRAIN_NETWORK_INTERFACE",
                                  "UCX_NET_DEVICES",
                                  "TANDEM_SHM_SPLIT_MIN_RANKS",
                                  "TANDEM_SHM_CMA_MAX_BYTES",
                                  "TANDEM_SHM_ALLREDUCE_CMA",
                                  "TANDEM_SHM_FAR_HANDOFF_NS",
                                  "RANK",
                                  "WORLD_SIZE",
                                  "LOCAL_RANK",
                                  "LOCAL_WORLD_SIZE",
                                  "PMI_RANK",
                                  "PMI_SIZE",
                                  "MPI_LOCALRANKID",
                                  "MPI_LOCALNRANKS",
                                  "PMI_JOBID",
                                  "SLURM_NNODES",
                                  "SLURM_NODEID",
                                  "SLURM_STEP_NODELIST",
                                  "SLURM_JOB_NODELIST",
                                  "SLURM_NODELIST",
                                  "SLURMD_NODENAME"};
constexpr size_t kVariableCount = std::size(kVariables);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> fields;
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      fields.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(char(data[i]));
    }
  }
  fields.push_back(std::move(current));
  auto field = [&](size_t i) -> std::optional<std::string> {
    if (i >= fields.size() || fields[i] == "-") return std::nullopt;
    return fields[i];
  };

  tandem::EnvLookup env = [&](const std::string& name) -> std::optional<std::string> {
    for (size_t i = 0; i < kVariableCount; ++i)
      if (name == kVariables[i]) return field(i);
    return std::nullopt;
  };
  try {
    tandem::comm_options_from_env(env);
  } catch (const tandem::Error&) {
  }
  try {
    tandem::read_secret(env);
  } catch (const tandem::Error&) {
  }
  tandem::detect_launcher(env);

  const std::string address = field(kVariableCount).value_or("");
  try {
    auto [host, port] = tandem::parse_host_port(address);
    check(!host.empty() && port > 0);
  } catch (const tandem::Error&) {
  }
  try {
    tandem::parse_interface_override(field(kVariableCount + 1).value_or(""));
  } catch (const tandem::Error&) {
  }
  const std::string locator = field(kVariableCount + 2).value_or("");
  if (auto l = tandem::parse_locator(locator)) {
    check(l->pid > 0 && l->fd >= 0);
  }
  try {
    const auto hosts = tandem::expand_slurm_hostlist(field(kVariableCount + 3).value_or(""));
    check(!hosts.empty());
    for (const auto& h : hosts) check(!h.empty());
  } catch (const tandem::Error&) {
  }
  try {
    const tandem::ring::ShmPathTable table(field(kVariableCount + 4).value_or(""));
    check(!tandem::ring::describe_shm_paths(table, "").empty());
  } catch (const tandem::Error&) {
  }
  return 0;
}
