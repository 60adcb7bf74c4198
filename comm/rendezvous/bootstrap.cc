// Who-am-I from the environment: tandem launch, then Open MPI, then Slurm.
//
// Choices the header leaves open:
// - `tandem launch` runs the store itself, so host_store stays false there.
//   Under mpirun/srun there is no such process, so rank 0 hosts the store
//   (host_store = true on rank 0) whatever address was chosen for it.
// - TANDEM_LOCAL_RANK/_LOCAL_WORLD_SIZE default to the global rank/size (one node).
// - detect_launcher() returns "none" when no launcher is recognised.
// - TANDEM_HOST_STORE=1 makes rank 0 host the store at TANDEM_STORE_ADDR under
//   any launcher (ranks in separate hosts or network namespaces, no `tandem launch`).
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

#include "job_secret.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/netif.h"
#include "tandem/reduce.h"
#include "tandem/settings.h"
#include "tandem/store.h"

namespace tandem {
namespace {

constexpr const char* kLaunchHint =
    "run under `tandem launch -n N`, mpirun or srun, or set TANDEM_RANK, TANDEM_WORLD_SIZE and TANDEM_STORE_ADDR";

// Strict non-negative integer: digits only, fits in int.
int parse_count(const std::string& var, const std::string& value, const std::string& fix) {
  bool digits = !value.empty() && value.size() <= 9;
  for (char c : value) digits = digits && c >= '0' && c <= '9';
  if (!digits)
    throw InvalidArgument("tandem: " + var + "='" + value + "' is not a non-negative integer; " + fix);
  return std::stoi(value);
}

int require_int(const EnvLookup& env, const std::string& var, const std::string& fix) {
  auto v = env(var);
  if (!v) throw InvalidArgument("tandem: " + var + " is not set; " + fix);
  return parse_count(var, *v, fix);
}

std::optional<int> optional_int(const EnvLookup& env, const std::string& var, const std::string& fix) {
  auto v = env(var);
  if (!v) return std::nullopt;
  return parse_count(var, *v, fix);
}

// FNV-1a: stable across platforms and releases, unlike std::hash.
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint16_t port_from_job_id(std::string_view job_id) { return static_cast<uint16_t>(20000 + fnv1a(job_id) % 40000); }

void check_store_address(const std::string& var, const std::string& value) {
  try {
    parse_host_port(value);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("tandem: " + var + "='" + value + "' is not a valid host:port (" + e.what() +
                          "); set it like 10.0.0.1:29500 or [fe80::1]:29500");
  }
}

void validate_ranks(CommOptions& o, const std::string& rank_var, const std::string& size_var,
                    const std::string& local_rank_var, const std::string& local_size_var) {
  if (o.size < 1)
    throw InvalidArgument("tandem: " + size_var + "='" + std::to_string(o.size) + "' must be at least 1");
  if (o.rank >= o.size)
    throw InvalidArgument("tandem: " + rank_var + "='" + std::to_string(o.rank) + "' must be below " + size_var +
                          "=" + std::to_string(o.size) + "; ranks are 0.." + std::to_string(o.size - 1));
  if (o.local_size == -1) return;  // unknown (multi-node Slurm without a per-node count)
  if (o.local_size < 1 || o.local_size > o.size)
    throw InvalidArgument("tandem: " + local_size_var + "='" + std::to_string(o.local_size) + "' must be in 1.." +
                          size_var + " (" + std::to_string(o.size) + ")");
  if (o.local_rank >= o.local_size)
    throw InvalidArgument("tandem: " + local_rank_var + "='" + std::to_string(o.local_rank) + "' must be below " +
                          local_size_var + "=" + std::to_string(o.local_size));
}

// Timeouts, liveness, transport and kernel knobs, each read once here
// through its table (tandem/settings.h).
void read_tuning(const EnvLookup& env, CommOptions& o) {
  read_settings(comm_settings(), env, o);
  read_settings(transport_settings(), env, o);
  read_settings(reduce_settings(), env, o);
  if (!o.reduce_isa.empty()) use_reduce_isa(o.reduce_isa);
}

// Interface selection and store placement across hosts, each read once here.
void read_network(const EnvLookup& env, CommOptions& o) {
  o.network_interface = network_interface_from_env(env);
  // Rank 0 hosts the store at TANDEM_STORE_ADDR (binding that address): jobs
  // whose ranks sit in different hosts or network namespaces without a launcher.
  if (env("TANDEM_HOST_STORE")) {  // parsed into host_store by read_tuning
    if (o.host_store && o.store_address.empty() && o.size > 1)
      throw InvalidArgument("tandem: TANDEM_HOST_STORE=1 needs TANDEM_STORE_ADDR=<rank 0 address>:<port> on every rank");
    o.host_store = o.host_store && o.rank == 0;
  }
}

CommOptions from_tandem(const EnvLookup& env) {
  CommOptions o;
  const std::string fix = "`tandem launch` sets TANDEM_RANK and TANDEM_WORLD_SIZE together";
  o.rank = require_int(env, "TANDEM_RANK", fix);
  o.size = require_int(env, "TANDEM_WORLD_SIZE", fix);
  o.local_rank = optional_int(env, "TANDEM_LOCAL_RANK", "set it to the rank on this node").value_or(o.rank);
  o.local_size = optional_int(env, "TANDEM_LOCAL_WORLD_SIZE", "set it to the ranks on this node").value_or(o.size);
  validate_ranks(o, "TANDEM_RANK", "TANDEM_WORLD_SIZE", "TANDEM_LOCAL_RANK", "TANDEM_LOCAL_WORLD_SIZE");
  if (auto addr = env("TANDEM_STORE_ADDR")) {
    check_store_address("TANDEM_STORE_ADDR", *addr);
    o.store_address = *addr;
  } else if (o.size > 1) {
    throw InvalidArgument("tandem: TANDEM_STORE_ADDR is not set but TANDEM_WORLD_SIZE=" + std::to_string(o.size) +
                          "; set it to the store's host:port (`tandem launch` does this)");
  }
  return o;
}

// Store placement shared by Open MPI and Slurm: explicit address, MASTER_ADDR/PORT,
// or (single node only) a port derived from the job id on loopback.
void choose_store(const EnvLookup& env, CommOptions& o, bool single_node, const std::optional<std::string>& job_id,
                  const std::string& launcher, const std::string& job_id_vars) {
  if (auto addr = env("TANDEM_STORE_ADDR")) {
    check_store_address("TANDEM_STORE_ADDR", *addr);
    o.store_address = *addr;
  } else if (env("MASTER_ADDR") || env("MASTER_PORT")) {
    auto host = env("MASTER_ADDR");
    auto port = env("MASTER_PORT");
    if (!host) throw InvalidArgument("tandem: MASTER_PORT is set but MASTER_ADDR is not; set both, or TANDEM_STORE_ADDR");
    if (!port) throw InvalidArgument("tandem: MASTER_ADDR is set but MASTER_PORT is not; set both, or TANDEM_STORE_ADDR");
    std::string addr = host->find(':') != std::string::npos ? "[" + *host + "]:" + *port : *host + ":" + *port;
    check_store_address("MASTER_ADDR/MASTER_PORT", addr);
    o.store_address = addr;
  } else if (o.size == 1) {
    return;  // a single rank needs no store
  } else if (single_node) {
    if (!job_id)
      throw InvalidArgument("tandem: cannot derive a store port under " + launcher + ": none of " + job_id_vars +
                            " is set; set TANDEM_STORE_ADDR=127.0.0.1:<port>");
    o.store_address = "127.0.0.1:" + std::to_string(port_from_job_id(*job_id));
  } else {
    throw InvalidArgument("tandem: this " + launcher +
                          " job spans several nodes, so rank 0 cannot host the store on loopback; set "
                          "TANDEM_STORE_ADDR=<rank 0 host>:<port> (or MASTER_ADDR and MASTER_PORT) for every rank");
  }
  o.host_store = o.rank == 0;
}

CommOptions from_openmpi(const EnvLookup& env) {
  CommOptions o;
  const std::string fix = "this variable comes from mpirun; do not override it";
  o.rank = require_int(env, "OMPI_COMM_WORLD_RANK", fix);
  o.size = require_int(env, "OMPI_COMM_WORLD_SIZE", fix);
  o.local_rank = optional_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", fix).value_or(o.size == 1 ? 0 : -1);
  o.local_size = optional_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", fix).value_or(o.size == 1 ? 1 : -1);
  if (o.local_size != -1 && o.local_rank == -1)
    throw InvalidArgument("tandem: OMPI_COMM_WORLD_LOCAL_SIZE is set but OMPI_COMM_WORLD_LOCAL_RANK is not");
  validate_ranks(o, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE");
  std::optional<std::string> job_id;
  for (const char* var : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri"}) {
    if ((job_id = env(var))) break;
  }
  choose_store(env, o, o.local_size == o.size, job_id ? std::optional("openmpi:" + *job_id) : std::nullopt,
               "mpirun", "OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, OMPI_MCA_orte_hnp_uri");
  return o;
}

// Slurm's SLURM_TASKS_PER_NODE looks like "2(x3),1": tasks on each node in node-id order.
std::optional<int> slurm_tasks_on_node(const std::string& spec, int node_id) {
  size_t pos = 0;
  int node = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    std::string item = spec.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    int count = 0, repeat = 1;
    if (std::sscanf(item.c_str(), "%d(x%d)", &count, &repeat) < 1) return std::nullopt;
    if (node_id < node + repeat) return count;
    node += repeat;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return std::nullopt;
}

CommOptions from_slurm(const EnvLookup& env) {
  CommOptions o;
  const std::string fix = "this variable comes from srun; do not override it";
  o.rank = require_int(env, "SLURM_PROCID", fix);
  o.size = require_int(env, "SLURM_NTASKS", "launch with srun -n N (SLURM_NTASKS is not set)");
  o.local_rank = optional_int(env, "SLURM_LOCALID", fix).value_or(o.size == 1 ? 0 : -1);
  auto nodes = optional_int(env, "SLURM_NNODES", fix);
  if (!nodes) nodes = optional_int(env, "SLURM_JOB_NUM_NODES", fix);
  const bool single_node = nodes ? *nodes == 1 : o.size == 1;
  if (single_node) {
    o.local_size = o.size;
  } else if (auto per_node = env("SLURM_NTASKS_PER_NODE");
             per_node && per_node->find_first_not_of("0123456789") == std::string::npos) {
    o.local_size = parse_count("SLURM_NTASKS_PER_NODE", *per_node, fix);
  } else if (auto spec = env("SLURM_TASKS_PER_NODE")) {
    auto node_id = optional_int(env, "SLURM_NODEID", fix);
    auto count = node_id ? slurm_tasks_on_node(*spec, *node_id) : std::nullopt;
    o.local_size = count.value_or(-1);
  }
  if (o.local_rank == -1) o.local_size = -1;
  validate_ranks(o, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE");
  std::optional<std::string> job_id;
  if (auto job = env("SLURM_JOB_ID")) job_id = "slurm:" + *job + "." + env("SLURM_STEP_ID").value_or("0");
  choose_store(env, o, single_node, job_id, "srun", "SLURM_JOB_ID");
  return o;
}

bool has_any(const EnvLookup& env, std::initializer_list<const char*> vars) {
  for (const char* v : vars)
    if (env(v)) return true;
  return false;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

std::string network_interface_from_env(const EnvLookup& env) {
  auto tandem_if = env("TANDEM_NETWORK_INTERFACE");
  auto dtrain_if = env("DTRAIN_NETWORK_INTERFACE");  // Determined's dtrain_network_interface
  if (tandem_if && dtrain_if && *tandem_if != *dtrain_if)
    throw InvalidArgument("tandem: TANDEM_NETWORK_INTERFACE='" + *tandem_if + "' and DTRAIN_NETWORK_INTERFACE='" +
                          *dtrain_if + "' disagree; set only one");
  CommOptions o;
  read_settings(netif_settings(), env, o);
  return o.network_interface;
}

std::string detect_launcher(const EnvLookup& env) {
  if (has_any(env, {"TANDEM_RANK", "TANDEM_WORLD_SIZE"})) return "tandem";
  if (has_any(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})) return "openmpi";
  if (has_any(env, {"SLURM_PROCID"})) return "slurm";
  return "none";
}

// TANDEM_SECRET, else the file TANDEM_SECRET_FILE names (readable by its owner
// only, like an ssh key), else none.
std::string read_secret(const EnvLookup& env) {
  std::string secret, source = "TANDEM_SECRET";
  if (auto v = env("TANDEM_SECRET")) {
    secret = *v;
  } else if (auto path = env("TANDEM_SECRET_FILE")) {
    source = "TANDEM_SECRET_FILE='" + *path + "'";
    struct stat st{};
    if (::stat(path->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw InvalidArgument("tandem: " + source + " is not a readable file; point it at a file holding the job secret");
    }
    if (st.st_mode & 077) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
      throw InvalidArgument("tandem: " + source + " has mode " + mode +
                            ": others may read the job secret; chmod 600 it");
    }
    std::ifstream f(*path);
    std::stringstream text;
    text << f.rdbuf();
    secret = text.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  } else {
    return {};
  }
  if (secret.size() < kMinSecretChars) {
    throw InvalidArgument("tandem: the job secret in " + source + " has " + std::to_string(secret.size()) +
                          " characters; use at least " + std::to_string(kMinSecretChars) +
                          " (e.g. the output of `openssl rand -hex 32`)");
  }
  return secret;
}

CommOptions tuning_from_env(const EnvLookup& env) {
  CommOptions o;
  read_tuning(env, o);
  read_network(env, o);
  o.host_store = false;
  return o;
}

CommOptions options_from_env(const EnvLookup& env) {
  const std::string launcher = detect_launcher(env);
  CommOptions o;
  if (launcher == "tandem") {
    o = from_tandem(env);
  } else if (launcher == "openmpi") {
    o = from_openmpi(env);
  } else if (launcher == "slurm") {
    o = from_slurm(env);
  } else {
    throw InvalidArgument(std::string("tandem: cannot tell this process's rank and world size; ") + kLaunchHint);
  }
  read_tuning(env, o);
  read_network(env, o);
  o.secret = read_secret(env);
  if (auto job = env("TANDEM_JOB_ID")) {
    o.job_id = *job;
  } else if (auto slurm = env("SLURM_JOB_ID")) {
    o.job_id = "slurm:" + *slurm + "." + env("SLURM_STEP_ID").value_or("0");
  }
  // A job on one host keeps UCX's TCP transport on loopback unless the user
  // chose devices; multi-host selection belongs to interface discovery.
  if (o.local_size == o.size && !o.ucx_net_devices_pinned) o.ucx_net_devices = "lo";
  check_store_privacy(o);
  return o;
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1") return true;
  return host.rfind("127.", 0) == 0;
}

void check_store_privacy(const CommOptions& o) {
  if (o.size < 2 || o.store_address.empty()) return;
  const std::string host = parse_host_port(o.store_address).first;
  if (o.host_store && (host == "0.0.0.0" || host == "::")) {
    if (!o.store_listen_all) {
      throw InvalidArgument("tandem: rank 0 would host the store on every address (" + o.store_address +
                            "); give TANDEM_STORE_ADDR the address of rank 0's interface the other ranks reach, or "
                            "set TANDEM_STORE_LISTEN_ALL=1 to listen on all of them");
    }
    spdlog::warn("tandem: the store listens on every address ({}; TANDEM_STORE_LISTEN_ALL=1)", o.store_address);
  }
  if (is_loopback_host(host) || !o.secret.empty()) return;
  if (!o.allow_no_secret) {
    throw InvalidArgument("tandem: the store at " + o.store_address +
                          " is reachable from other hosts but the job has no secret, so anyone who reaches it could "
                          "read and write the job's keys; give every rank the same TANDEM_SECRET (or "
                          "TANDEM_SECRET_FILE), e.g. from `openssl rand -hex 32`, or set TANDEM_ALLOW_NO_SECRET=1 on "
                          "a trusted network");
  }
  if (o.rank == 0)
    spdlog::warn("tandem: the store at {} has no secret (TANDEM_ALLOW_NO_SECRET=1): anyone who reaches it can read "
                 "and write the job's keys",
                 o.store_address);
}

}  // namespace tandem
