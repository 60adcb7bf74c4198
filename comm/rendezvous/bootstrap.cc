// Who-am-I from the environment: tandem launch, then torchrun, then Open MPI,
// then MPICH's Hydra (PMI), then Slurm.
//
// Choices the header leaves open:
// - `tandem launch` runs the store itself, so host_store stays false there.
//   Under torchrun/mpirun/mpiexec/srun there is no such process, so rank 0
//   hosts the store (host_store = true on rank 0) whatever address was chosen for it.
// - TANDEM_LOCAL_RANK/_LOCAL_WORLD_SIZE default to the global rank/size (one node);
//   the other launchers' local rank and size are unknown (-1) when not given.
// - MASTER_ADDR/MASTER_PORT name torch's TCPStore, which rank 0 hosts on
//   MASTER_PORT; tandem's store goes next to it, on MASTER_PORT + 1.
// - detect_launcher() returns "none" when no launcher is recognised.
// - TANDEM_HOST_STORE=1 makes rank 0 host the store at TANDEM_STORE_ADDR under
//   any launcher (ranks in separate hosts or network namespaces, no `tandem launch`).
#include "tandem/bootstrap.h"

#include <cstdlib>
#include <functional>
#include <sstream>
#include <string_view>
#include <vector>

#include "job_secret.h"
#include "store_ports.h"
#include "tandem/errors.h"
#include "tandem/netif.h"
#include "tandem/reduce.h"
#include "tandem/settings.h"
#include "tandem/store.h"

namespace tandem {
namespace {

constexpr const char* kLaunchHint =
    "run under `tandem launch -n N`, torchrun, mpirun/mpiexec (Open MPI, MPICH) or srun, or set TANDEM_RANK, "
    "TANDEM_WORLD_SIZE and TANDEM_STORE_ADDR";

// Strict non-negative integer: digits only, fits in int.
int parse_count(const std::string& var, const std::string& value, const std::string& fix) {
  bool digits = !value.empty() && value.size() <= 9;
  for (char c : value) digits = digits && c >= '0' && c <= '9';
  if (!digits) throw InvalidArgument("tandem: " + var + "='" + value + "' is not a non-negative integer; " + fix);
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

// Strict unsigned id of up to 19 digits (Slurm's job and step ids).
uint64_t parse_id(const std::string& var, const std::string& value) {
  if (value.empty() || value.size() > 19 || value.find_first_not_of("0123456789") != std::string::npos)
    throw InvalidArgument("tandem: " + var + "='" + value + "' is not a non-negative integer; it comes from srun");
  return std::stoull(value);
}

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
  if (o.size < 1) throw InvalidArgument("tandem: " + size_var + "='" + std::to_string(o.size) + "' must be at least 1");
  if (o.rank >= o.size)
    throw InvalidArgument("tandem: " + rank_var + "='" + std::to_string(o.rank) + "' must be below " + size_var + "=" +
                          std::to_string(o.size) + "; ranks are 0.." + std::to_string(o.size - 1));
  if (o.local_rank >= o.size)
    throw InvalidArgument("tandem: " + local_rank_var + "='" + std::to_string(o.local_rank) + "' must be below " +
                          size_var + "=" + std::to_string(o.size));
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
      throw InvalidArgument(
          "tandem: TANDEM_HOST_STORE=1 needs TANDEM_STORE_ADDR=<rank 0 address>:<port> on every rank");
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

// A launcher's local rank and size, each optional: unknown (-1) when absent
// (0 and 1 in a one-rank job); a size without a rank contradicts itself.
void read_local(const EnvLookup& env, CommOptions& o, const std::string& rank_var, const std::string& size_var,
                const std::string& fix) {
  o.local_rank = optional_int(env, rank_var, fix).value_or(o.size == 1 ? 0 : -1);
  o.local_size = optional_int(env, size_var, fix).value_or(o.size == 1 ? 1 : -1);
  if (o.local_size != -1 && o.local_rank == -1)
    throw InvalidArgument("tandem: " + size_var + " is set but " + rank_var + " is not");
}

// MASTER_ADDR and MASTER_PORT + 1: torch's TCPStore (env://) holds MASTER_PORT
// on rank 0, so tandem's store, which rank 0 hosts too, takes the next port.
std::optional<std::string> store_beside_master(const EnvLookup& env) {
  auto host = env("MASTER_ADDR");
  auto port = env("MASTER_PORT");
  if (!host && !port) return std::nullopt;
  if (!host) throw InvalidArgument("tandem: MASTER_PORT is set but MASTER_ADDR is not; set both, or TANDEM_STORE_ADDR");
  if (!port) throw InvalidArgument("tandem: MASTER_ADDR is set but MASTER_PORT is not; set both, or TANDEM_STORE_ADDR");
  const int p = parse_count("MASTER_PORT", *port,
                            "set it to the port of rank 0's torch store (tandem's store takes the next one), or set "
                            "TANDEM_STORE_ADDR");
  if (p < 1 || p > 65534)
    throw InvalidArgument("tandem: MASTER_PORT='" + *port +
                          "' leaves no port for tandem's store, which goes on MASTER_PORT+1; use a port in 1..65534, "
                          "or set TANDEM_STORE_ADDR");
  const bool v6 = host->find(':') != std::string::npos && host->front() != '[';
  const std::string addr = (v6 ? "[" + *host + "]" : *host) + ":" + std::to_string(p + 1);
  check_store_address("MASTER_ADDR/MASTER_PORT", addr);
  return addr;
}

// Store placement for every launcher but tandem launch (which runs its own):
// TANDEM_STORE_ADDR, else MASTER_ADDR at MASTER_PORT + 1, else none for a
// single rank, else the launcher's own `derive` (which throws naming what is
// missing). Rank 0 hosts the store.
void choose_store(const EnvLookup& env, CommOptions& o, const std::function<std::string()>& derive) {
  if (auto addr = env("TANDEM_STORE_ADDR")) {
    check_store_address("TANDEM_STORE_ADDR", *addr);
    o.store_address = *addr;
  } else if (auto beside = store_beside_master(env)) {
    o.store_address = *beside;
  } else if (o.size == 1) {
    return;  // a single rank needs no store
  } else {
    o.store_address = derive();
  }
  o.host_store = o.rank == 0;
}

// Open MPI and Hydra without an address: rank 0 on 127.0.0.1 at a port derived
// from the job id, which works when the whole job is on one node.
std::string loopback_store(bool single_node, const std::optional<std::string>& job_id, const std::string& launcher,
                           const std::string& job_id_vars) {
  if (!single_node)
    throw InvalidArgument("tandem: this " + launcher +
                          " job spans several nodes, so rank 0 cannot host the store on loopback; set "
                          "TANDEM_STORE_ADDR=<rank 0 host>:<port> (or MASTER_ADDR and MASTER_PORT) for every rank");
  if (!job_id)
    throw InvalidArgument("tandem: cannot derive a store port under " + launcher + ": none of " + job_id_vars +
                          " is set; set TANDEM_STORE_ADDR=127.0.0.1:<port> (or MASTER_ADDR and MASTER_PORT) for "
                          "every rank");
  return "127.0.0.1:" + std::to_string(port_from_job_id(*job_id));
}

// The four rank variables of a launcher that sets them together.
struct RankVariables {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

CommOptions read_ranks(const EnvLookup& env, const RankVariables& v, const std::string& fix) {
  CommOptions o;
  o.rank = require_int(env, v.rank, fix);
  o.size = require_int(env, v.size, fix);
  read_local(env, o, v.local_rank, v.local_size, fix);
  validate_ranks(o, v.rank, v.size, v.local_rank, v.local_size);
  return o;
}

// torchrun, and whatever follows torch's env:// convention (Kubeflow's
// PyTorchJob, variables set by hand): MASTER_ADDR and MASTER_PORT place the store.
CommOptions from_torchrun(const EnvLookup& env) {
  CommOptions o = read_ranks(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
                             "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE together");
  choose_store(env, o, [&]() -> std::string {
    throw InvalidArgument("tandem: RANK and WORLD_SIZE=" + std::to_string(o.size) +
                          " are set (torchrun's variables) but MASTER_ADDR and MASTER_PORT are not; set both "
                          "(tandem's store then listens at MASTER_ADDR on MASTER_PORT+1), or TANDEM_STORE_ADDR");
  });
  return o;
}

CommOptions from_openmpi(const EnvLookup& env) {
  CommOptions o = read_ranks(
      env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
      "this variable comes from mpirun; do not override it");
  std::optional<std::string> job_id;
  for (const char* var : {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri"}) {
    if ((job_id = env(var))) break;
  }
  choose_store(env, o, [&] {
    return loopback_store(o.local_size == o.size, job_id ? std::optional("openmpi:" + *job_id) : std::nullopt, "mpirun",
                          "OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, OMPI_MCA_orte_hnp_uri");
  });
  return o;
}

// MPICH's Hydra (mpiexec; Intel MPI's and MVAPICH's too) sets PMI_RANK,
// PMI_SIZE, MPI_LOCALRANKID and MPI_LOCALNRANKS but no job id: a one-node job
// derives its store port from PMI_JOBID only where a process manager sets it.
CommOptions from_pmi(const EnvLookup& env) {
  CommOptions o = read_ranks(env, {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
                             "this variable comes from mpiexec; do not override it");
  const auto job_id = env("PMI_JOBID");
  choose_store(env, o, [&] {
    return loopback_store(o.local_size == o.size, job_id ? std::optional("pmi:" + *job_id) : std::nullopt, "mpiexec",
                          "PMI_JOBID");
  });
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

// Under srun without an address, rank 0 hosts the store at slurm_store_port():
// on 127.0.0.1 when the step runs on one node, else on the first node of the
// step's node list, where Slurm starts task 0.
std::string slurm_store(const EnvLookup& env, int rank, bool single_node) {
  auto job = env("SLURM_JOB_ID");
  if (!job)
    throw InvalidArgument(
        "tandem: cannot derive a store port under srun: SLURM_JOB_ID is not set; set "
        "TANDEM_STORE_ADDR=<rank 0 host>:<port> (or MASTER_ADDR and MASTER_PORT) for every rank");
  const std::string port = std::to_string(
      slurm_store_port(parse_id("SLURM_JOB_ID", *job), parse_id("SLURM_STEP_ID", env("SLURM_STEP_ID").value_or("0"))));
  if (single_node) return "127.0.0.1:" + port;
  const char* var = nullptr;
  std::optional<std::string> list;
  for (const char* v : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if ((list = env(var = v))) break;
  }
  if (!list)
    throw InvalidArgument(
        "tandem: this srun job spans several nodes but none of SLURM_STEP_NODELIST, "
        "SLURM_JOB_NODELIST, SLURM_NODELIST names them; set TANDEM_STORE_ADDR=<rank 0 host>:<port> "
        "(or MASTER_ADDR and MASTER_PORT) for every rank");
  std::string first;
  try {
    first = expand_slurm_hostlist(*list).front();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("tandem: ") + var + "='" + *list + "' is not a Slurm host list (" + e.what() +
                          "); set TANDEM_STORE_ADDR=<rank 0 host>:<port> for every rank");
  }
  auto here = env("SLURMD_NODENAME");
  if (rank == 0 && here && *here != first)
    throw InvalidArgument("tandem: rank 0 runs on SLURMD_NODENAME='" + *here + "', not on '" + first +
                          "', the first node of " + var +
                          ", where the other ranks look for its store; set "
                          "TANDEM_STORE_ADDR=" +
                          *here + ":" + port + " for every rank");
  const std::string address = (first.find(':') != std::string::npos ? "[" + first + "]" : first) + ":" + port;
  check_store_address(var, address);
  return address;
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
  choose_store(env, o, [&] { return slurm_store(env, o.rank, single_node); });
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
  // RANK, not WORLD_SIZE: batch scripts export WORLD_SIZE for every task.
  if (has_any(env, {"RANK"})) return "torchrun";
  if (has_any(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})) return "openmpi";
  if (has_any(env, {"PMI_RANK", "PMI_SIZE"})) {
    // srun --mpi=pmi2 sets them too, equal to Slurm's own, which say more
    // (nodes, job id). Hydra under Slurm runs one proxy task per node, so
    // there SLURM_PROCID is the node's and PMI_RANK wins.
    const bool srun_pmi =
        env("SLURM_PROCID") && env("PMI_RANK") == env("SLURM_PROCID") && env("PMI_SIZE") == env("SLURM_NTASKS");
    return srun_pmi ? "slurm" : "pmi";
  }
  if (has_any(env, {"SLURM_PROCID"})) return "slurm";
  return "none";
}

std::vector<std::string> expand_slurm_hostlist(const std::string& list) {
  constexpr size_t kMaxHosts = size_t(1) << 20;
  auto bad = [&](const std::string& why) {
    return InvalidArgument("host list '" + list + "' " + why + "; Slurm writes one like node[01-04,07],gpu3");
  };
  // "01-04,07" -> 01 02 03 04 07: each number as wide as the range's first (Slurm keeps leading zeros).
  auto ranges = [&](const std::string& inside) {
    std::vector<std::string> out;
    std::istringstream in(inside);
    for (std::string r; std::getline(in, r, ',');) {
      const size_t dash = r.find('-');
      const std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
      for (const std::string& n : {lo, hi})
        if (n.empty() || n.size() > 18 || n.find_first_not_of("0123456789") != std::string::npos)
          throw bad("has '" + r + "' in brackets, which is not a number or a range like 01-04");
      const uint64_t a = std::stoull(lo), b = std::stoull(hi);
      if (b < a) throw bad("has the range '" + r + "', which runs backwards");
      if (b - a >= kMaxHosts - out.size()) throw bad("names more than " + std::to_string(kMaxHosts) + " hosts");
      for (uint64_t v = a; v <= b; ++v) {
        std::string digits = std::to_string(v);
        out.push_back(std::string(lo.size() > digits.size() ? lo.size() - digits.size() : 0, '0') + digits);
      }
    }
    if (out.empty() || inside.back() == ',') throw bad("has an empty range in '[" + inside + "]'");
    return out;
  };
  std::vector<std::string> hosts;
  for (size_t pos = 0;;) {
    std::vector<std::string> names{""};  // one entry, up to a comma outside brackets
    size_t i = pos;
    for (; i < list.size() && list[i] != ','; ++i) {
      if (list[i] == ']') throw bad("has a ']' without its '['");
      if (list[i] != '[') {
        for (std::string& n : names) n += list[i];
        continue;
      }
      const size_t close = list.find(']', i);
      if (close == std::string::npos) throw bad("has a '[' without its ']'");
      const std::string inside = list.substr(i + 1, close - i - 1);
      if (inside.find('[') != std::string::npos) throw bad("nests brackets");
      const std::vector<std::string> alternatives = ranges(inside);
      if (names.size() * alternatives.size() > kMaxHosts - hosts.size())
        throw bad("names more than " + std::to_string(kMaxHosts) + " hosts");
      std::vector<std::string> product;
      for (const std::string& n : names)
        for (const std::string& a : alternatives) product.push_back(n + a);
      names = std::move(product);
      i = close;
    }
    if (i == pos) throw bad("has an empty host name");
    hosts.insert(hosts.end(), names.begin(), names.end());
    if (i == list.size()) return hosts;
    pos = i + 1;
  }
}

CommOptions tuning_from_env(const EnvLookup& env) {
  CommOptions o;
  read_tuning(env, o);
  read_network(env, o);
  o.host_store = false;
  return o;
}

CommOptions comm_options_from_env(const EnvLookup& env) {
  const std::string launcher = detect_launcher(env);
  CommOptions o;
  if (launcher == "tandem") {
    o = from_tandem(env);
  } else if (launcher == "torchrun") {
    o = from_torchrun(env);
  } else if (launcher == "openmpi") {
    o = from_openmpi(env);
  } else if (launcher == "pmi") {
    o = from_pmi(env);
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

}  // namespace tandem
