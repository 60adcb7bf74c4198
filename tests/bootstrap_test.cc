// Environment detection: table-driven over fake environments (no setenv), one
// table for what must parse and one for what must fail, with the variable the
// error message has to name.
#include "tandem/bootstrap.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "fake_env.h"
#include "scratch_dir.h"
#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem {
namespace {

// What Open MPI 4.1 sets on this machine for `mpirun -n 2` (trimmed to what we read).
Env openmpi(int rank, int size, int local_rank, int local_size) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", std::to_string(size)},
          {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(local_rank)},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", std::to_string(local_size)},
          {"OMPI_MCA_ess_base_jobid", "1664286721"},
          {"PMIX_NAMESPACE", "1664286721"},
          {"OMPI_MCA_orte_hnp_uri", "1664286720.0;tcp://192.0.2.2:45417"}};
}

Env slurm(int rank, int size, int local_id, int nodes) {
  return {{"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", std::to_string(size)},
          {"SLURM_LOCALID", std::to_string(local_id)},
          {"SLURM_NNODES", std::to_string(nodes)},
          {"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "0"}};
}

// What torchrun sets for a worker (trimmed to what we read, with GROUP_RANK).
Env torchrun(int rank, int size, int local_rank, int local_size) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(size)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(local_size)},
          {"GROUP_RANK", std::to_string(rank / local_size)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

// What MPICH's Hydra sets for `mpiexec -n N` (it sets no job id).
Env hydra(int rank, int size, int local_rank, int local_size) {
  return {{"PMI_RANK", std::to_string(rank)},
          {"PMI_SIZE", std::to_string(size)},
          {"MPI_LOCALRANKID", std::to_string(local_rank)},
          {"MPI_LOCALNRANKS", std::to_string(local_size)},
          {"PMI_FD", "6"}};
}

Env with(Env base, const Env& extra) {
  for (const auto& [k, v] : extra) base[k] = v;
  return base;
}

Env without(Env base, std::initializer_list<const char*> names) {
  for (const char* n : names) base.erase(n);
  return base;
}

uint16_t port_of(const std::string& address) { return parse_host_port(address).second; }

struct GoodCase {
  const char* name;
  Env env;
  const char* launcher;
  int rank, size, local_rank, local_size;
  const char* store;  // exact address, or "derived" for a 127.0.0.1 job-id port
  bool host_store;
};

class GoodEnv : public ::testing::TestWithParam<GoodCase> {};

TEST_P(GoodEnv, Parses) {
  const auto& c = GetParam();
  EXPECT_EQ(detect_launcher(lookup(c.env)), c.launcher);
  // With the secret a store beyond loopback needs (see Bootstrap.StorePrivacy).
  CommOptions o = comm_options_from_env(lookup(with(c.env, {{"TANDEM_SECRET", std::string(64, 's')}})));
  EXPECT_EQ(o.rank, c.rank);
  EXPECT_EQ(o.size, c.size);
  EXPECT_EQ(o.local_rank, c.local_rank);
  EXPECT_EQ(o.local_size, c.local_size);
  EXPECT_EQ(o.host_store, c.host_store);
  if (std::string(c.store) == "derived") {
    auto [host, port] = parse_host_port(o.store_address);
    EXPECT_EQ(host, "127.0.0.1");
    EXPECT_GE(port, 20000);
    EXPECT_LE(port, 59999);
    // A job id's port (not Slurm's, which may span nodes): below the host's
    // ephemeral range, where outgoing connections take their ports.
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    unsigned low = 0;
    if (std::string(c.launcher) != "slurm" && range >> low && low > 21000) {
      EXPECT_LT(port, low);
    }
  } else {
    EXPECT_EQ(o.store_address, c.store);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Bootstrap, GoodEnv,
    ::testing::Values(
        GoodCase{"tandem_full",
                 {{"TANDEM_RANK", "2"},
                  {"TANDEM_WORLD_SIZE", "4"},
                  {"TANDEM_LOCAL_RANK", "0"},
                  {"TANDEM_LOCAL_WORLD_SIZE", "2"},
                  {"TANDEM_STORE_ADDR", "10.0.0.1:29500"}},
                 "tandem",
                 2,
                 4,
                 0,
                 2,
                 "10.0.0.1:29500",
                 false},
        GoodCase{"tandem_local_defaults_to_global",
                 {{"TANDEM_RANK", "1"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "[::1]:7000"}},
                 "tandem",
                 1,
                 2,
                 1,
                 2,
                 "[::1]:7000",
                 false},
        GoodCase{"tandem_single_rank_needs_no_store",
                 {{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "1"}},
                 "tandem",
                 0,
                 1,
                 0,
                 1,
                 "",
                 false},
        // tandem launch wins over the launcher underneath it.
        GoodCase{"tandem_beats_openmpi_and_slurm",
                 with(with(openmpi(1, 2, 1, 2), slurm(0, 8, 0, 2)),
                      {{"TANDEM_RANK", "3"}, {"TANDEM_WORLD_SIZE", "5"}, {"TANDEM_STORE_ADDR", "h:1"}}),
                 "tandem", 3, 5, 3, 5, "h:1", false},
        GoodCase{"openmpi_single_node_rank0_hosts", openmpi(0, 2, 0, 2), "openmpi", 0, 2, 0, 2, "derived", true},
        GoodCase{"openmpi_single_node_rank1_connects", openmpi(1, 2, 1, 2), "openmpi", 1, 2, 1, 2, "derived", false},
        GoodCase{"openmpi_pmix_namespace_only",
                 without(openmpi(0, 2, 0, 2), {"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri"}), "openmpi", 0, 2, 0,
                 2, "derived", true},
        GoodCase{"openmpi_hnp_uri_only", without(openmpi(0, 2, 0, 2), {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}),
                 "openmpi", 0, 2, 0, 2, "derived", true},
        GoodCase{"openmpi_explicit_store_multi_node", with(openmpi(3, 4, 1, 2), {{"TANDEM_STORE_ADDR", "node0:29500"}}),
                 "openmpi", 3, 4, 1, 2, "node0:29500", false},
        GoodCase{"openmpi_master_addr_port",
                 with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}}), "openmpi", 0, 4, 0, 2,
                 "node0:29401", true},
        GoodCase{"openmpi_tandem_store_beats_master",
                 with(openmpi(1, 4, 1, 2), {{"TANDEM_STORE_ADDR", "a:1"}, {"MASTER_ADDR", "b"}, {"MASTER_PORT", "2"}}),
                 "openmpi", 1, 4, 1, 2, "a:1", false},
        GoodCase{"openmpi_single_rank_no_store", openmpi(0, 1, 0, 1), "openmpi", 0, 1, 0, 1, "", false},
        GoodCase{"openmpi_beats_slurm", with(slurm(5, 8, 1, 2), openmpi(1, 2, 1, 2)), "openmpi", 1, 2, 1, 2, "derived",
                 false},
        GoodCase{"slurm_single_node", slurm(0, 4, 0, 1), "slurm", 0, 4, 0, 4, "derived", true},
        GoodCase{"slurm_multi_node_explicit",
                 with(slurm(5, 8, 1, 2), {{"SLURM_NTASKS_PER_NODE", "4"}, {"TANDEM_STORE_ADDR", "n0:9"}}), "slurm", 5,
                 8, 1, 4, "n0:9", false},
        GoodCase{"slurm_tasks_per_node_spec",
                 with(slurm(6, 7, 0, 3),
                      {{"SLURM_TASKS_PER_NODE", "3(x2),1"}, {"SLURM_NODEID", "2"}, {"TANDEM_STORE_ADDR", "n0:9"}}),
                 "slurm", 6, 7, 0, 1, "n0:9", false},
        // Across nodes the store is on the first node of the step, at 20000 + 4 * (4242 mod 10000) + step.
        GoodCase{"slurm_multi_node_step_nodelist",
                 with(slurm(5, 8, 1, 2), {{"SLURM_NTASKS_PER_NODE", "4"},
                                          {"SLURM_STEP_NODELIST", "node[07-08]"},
                                          {"SLURM_JOB_NODELIST", "node[01-08]"}}),
                 "slurm", 5, 8, 1, 4, "node07:36968", false},
        GoodCase{"slurm_multi_node_rank0_hosts_on_first_node",
                 with(slurm(0, 8, 0, 2),
                      {{"SLURM_JOB_NODELIST", "gpu[3-4],cpu1"}, {"SLURMD_NODENAME", "gpu3"}, {"SLURM_STEP_ID", "2"}}),
                 "slurm", 0, 8, 0, -1, "gpu3:36970", true},
        GoodCase{"slurm_multi_node_old_nodelist_name", with(slurm(1, 4, 1, 2), {{"SLURM_NODELIST", "a1,a2"}}), "slurm",
                 1, 4, 1, -1, "a1:36968", false},
        GoodCase{"slurm_master_beats_nodelist",
                 with(slurm(3, 8, 1, 2),
                      {{"SLURM_JOB_NODELIST", "n[1-2]"}, {"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29500"}}),
                 "slurm", 3, 8, 1, -1, "n1:29501", false},
        GoodCase{"slurm_world_size_exported_alone", with(slurm(1, 4, 1, 1), {{"WORLD_SIZE", "4"}}), "slurm", 1, 4, 1, 4,
                 "derived", false},
        // torchrun: MASTER_PORT is torch's TCPStore; tandem's store goes on the next port, rank 0 hosts it.
        GoodCase{"torchrun_rank0_hosts_beside_master", torchrun(0, 2, 0, 2), "torchrun", 0, 2, 0, 2, "127.0.0.1:29501",
                 true},
        GoodCase{"torchrun_multi_node", with(torchrun(3, 4, 1, 2), {{"MASTER_ADDR", "10.0.0.1"}}), "torchrun", 3, 4, 1,
                 2, "10.0.0.1:29501", false},
        GoodCase{"torchrun_ipv6_master", with(torchrun(1, 2, 1, 2), {{"MASTER_ADDR", "fe80::1"}}), "torchrun", 1, 2, 1,
                 2, "[fe80::1]:29501", false},
        GoodCase{"torchrun_tandem_store_beats_master", with(torchrun(0, 2, 0, 2), {{"TANDEM_STORE_ADDR", "h:7"}}),
                 "torchrun", 0, 2, 0, 2, "h:7", true},
        GoodCase{"torchrun_by_hand_local_size_unknown",
                 without(torchrun(1, 2, 1, 2), {"LOCAL_WORLD_SIZE", "GROUP_RANK"}), "torchrun", 1, 2, 1, -1,
                 "127.0.0.1:29501", false},
        GoodCase{"torchrun_single_rank_needs_no_store", without(torchrun(0, 1, 0, 1), {"MASTER_ADDR", "MASTER_PORT"}),
                 "torchrun", 0, 1, 0, 1, "", false},
        // tandem launch sets both sets of variables; its own win (they agree anyway).
        GoodCase{"tandem_beats_torchrun",
                 with(torchrun(1, 2, 1, 2),
                      {{"TANDEM_RANK", "1"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "127.0.0.1:41000"}}),
                 "tandem", 1, 2, 1, 2, "127.0.0.1:41000", false},
        // torchrun started by srun or mpirun: the workers are torchrun's.
        GoodCase{"torchrun_beats_slurm", with(slurm(1, 2, 0, 2), torchrun(5, 8, 1, 4)), "torchrun", 5, 8, 1, 4,
                 "127.0.0.1:29501", false},
        GoodCase{"torchrun_beats_openmpi", with(openmpi(0, 2, 0, 2), torchrun(6, 8, 2, 4)), "torchrun", 6, 8, 2, 4,
                 "127.0.0.1:29501", false},
        // MPICH's Hydra: no job id, so an address or PMI_JOBID.
        GoodCase{"hydra_single_node_pmi_jobid", with(hydra(0, 2, 0, 2), {{"PMI_JOBID", "77"}}), "pmi", 0, 2, 0, 2,
                 "derived", true},
        GoodCase{"hydra_multi_node_explicit", with(hydra(3, 4, 1, 2), {{"TANDEM_STORE_ADDR", "n0:9"}}), "pmi", 3, 4, 1,
                 2, "n0:9", false},
        GoodCase{"hydra_master_addr_port", with(hydra(0, 4, 0, 2), {{"MASTER_ADDR", "n0"}, {"MASTER_PORT", "29500"}}),
                 "pmi", 0, 4, 0, 2, "n0:29501", true},
        GoodCase{"hydra_single_rank", without(hydra(0, 1, 0, 1), {"MPI_LOCALRANKID", "MPI_LOCALNRANKS"}), "pmi", 0, 1,
                 0, 1, "", false},
        // Hydra under Slurm: its proxies are the srun tasks, one per node; the ranks are PMI's.
        GoodCase{"hydra_under_slurm_reads_pmi",
                 with(slurm(1, 2, 0, 2), with(hydra(5, 8, 1, 4), {{"TANDEM_STORE_ADDR", "n0:9"}})), "pmi", 5, 8, 1, 4,
                 "n0:9", false},
        // srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE equal to Slurm's: Slurm's variables are read.
        GoodCase{"srun_pmi2_reads_slurm",
                 with(slurm(1, 4, 1, 1), {{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}, {"PMI_JOBID", "4242.0"}}), "slurm", 1,
                 4, 1, 4, "derived", false},
        GoodCase{"openmpi_beats_hydra", with(hydra(5, 8, 1, 4), openmpi(1, 2, 1, 2)), "openmpi", 1, 2, 1, 2, "derived",
                 false}),
    [](const auto& info) { return std::string(info.param.name); });

struct BadCase {
  const char* name;
  Env env;
  std::vector<std::string> message_has;  // every string must appear in what()
};

class BadEnv : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadEnv, ThrowsNamingTheVariable) {
  const auto& c = GetParam();
  try {
    CommOptions o = comm_options_from_env(lookup(c.env));
    ADD_FAILURE() << "accepted; rank=" << o.rank << " size=" << o.size << " store=" << o.store_address;
  } catch (const InvalidArgument& e) {
    for (const auto& s : c.message_has) EXPECT_NE(std::string(e.what()).find(s), std::string::npos) << e.what();
  }
}

const Env kTandem2 = {{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "127.0.0.1:29500"}};

INSTANTIATE_TEST_SUITE_P(
    Bootstrap, BadEnv,
    ::testing::Values(
        BadCase{"nothing_set", {}, {"tandem launch -n N", "mpirun", "srun", "TANDEM_RANK", "TANDEM_STORE_ADDR"}},
        BadCase{"tandem_rank_not_integer", with(kTandem2, {{"TANDEM_RANK", "zero"}}), {"TANDEM_RANK", "'zero'"}},
        BadCase{"tandem_rank_negative", with(kTandem2, {{"TANDEM_RANK", "-1"}}), {"TANDEM_RANK", "'-1'"}},
        BadCase{"tandem_rank_trailing_junk", with(kTandem2, {{"TANDEM_RANK", "1x"}}), {"TANDEM_RANK", "'1x'"}},
        BadCase{"tandem_rank_too_big", with(kTandem2, {{"TANDEM_RANK", "2"}}), {"TANDEM_RANK", "'2'", "0..1"}},
        BadCase{"tandem_size_zero", with(kTandem2, {{"TANDEM_WORLD_SIZE", "0"}}), {"TANDEM_WORLD_SIZE", "'0'"}},
        BadCase{"tandem_size_missing", without(kTandem2, {"TANDEM_WORLD_SIZE"}), {"TANDEM_WORLD_SIZE"}},
        BadCase{"tandem_rank_missing", without(kTandem2, {"TANDEM_RANK"}), {"TANDEM_RANK"}},
        BadCase{"tandem_store_missing", without(kTandem2, {"TANDEM_STORE_ADDR"}), {"TANDEM_STORE_ADDR"}},
        BadCase{"tandem_store_malformed",
                with(kTandem2, {{"TANDEM_STORE_ADDR", "nohostport"}}),
                {"TANDEM_STORE_ADDR", "'nohostport'"}},
        BadCase{"tandem_local_rank_too_big",
                with(kTandem2, {{"TANDEM_LOCAL_RANK", "2"}, {"TANDEM_LOCAL_WORLD_SIZE", "2"}}),
                {"TANDEM_LOCAL_RANK", "'2'"}},
        BadCase{"tandem_local_size_above_size",
                with(kTandem2, {{"TANDEM_LOCAL_WORLD_SIZE", "3"}}),
                {"TANDEM_LOCAL_WORLD_SIZE", "'3'"}},
        BadCase{"timeout_not_integer", with(kTandem2, {{"TANDEM_TIMEOUT_MS", "5s"}}), {"TANDEM_TIMEOUT_MS", "'5s'"}},
        BadCase{"timeout_zero", with(kTandem2, {{"TANDEM_TIMEOUT_MS", "0"}}), {"TANDEM_TIMEOUT_MS", "'0'"}},
        BadCase{"connect_timeout_negative",
                with(kTandem2, {{"TANDEM_CONNECT_TIMEOUT_MS", "-5"}}),
                {"TANDEM_CONNECT_TIMEOUT_MS", "'-5'"}},
        BadCase{"heartbeat_too_short",
                with(kTandem2, {{"TANDEM_HEARTBEAT_MS", "50"}}),
                {"TANDEM_HEARTBEAT_MS", "'50'", "at least 100"}},
        BadCase{"reduce_isa_unknown",
                with(kTandem2, {{"TANDEM_REDUCE_ISA", "sse4"}}),
                {"TANDEM_REDUCE_ISA", "'sse4'", "scalar, avx2 or avx512"}},
        BadCase{"interfaces_disagree",
                with(kTandem2, {{"TANDEM_NETWORK_INTERFACE", "eth0"}, {"DTRAIN_NETWORK_INTERFACE", "eth1"}}),
                {"TANDEM_NETWORK_INTERFACE='eth0'", "DTRAIN_NETWORK_INTERFACE='eth1'", "disagree"}},
        BadCase{"host_store_not_a_switch",
                with(kTandem2, {{"TANDEM_HOST_STORE", "yes"}}),
                {"TANDEM_HOST_STORE", "'yes'", "set it to 1 (rank 0 hosts the store) or 0"}},
        BadCase{"allow_no_secret_not_a_switch",
                with(kTandem2, {{"TANDEM_STORE_ADDR", "10.0.0.1:29500"}, {"TANDEM_ALLOW_NO_SECRET", "yes"}}),
                {"TANDEM_ALLOW_NO_SECRET", "'yes'", "0 or 1"}},
        BadCase{"openmpi_rank_not_integer",
                with(openmpi(0, 2, 0, 2), {{"OMPI_COMM_WORLD_RANK", "x"}}),
                {"OMPI_COMM_WORLD_RANK", "'x'"}},
        BadCase{"openmpi_rank_too_big", openmpi(2, 2, 0, 2), {"OMPI_COMM_WORLD_RANK", "'2'"}},
        BadCase{
            "openmpi_size_missing", without(openmpi(0, 2, 0, 2), {"OMPI_COMM_WORLD_SIZE"}), {"OMPI_COMM_WORLD_SIZE"}},
        BadCase{"openmpi_multi_node_needs_store",
                openmpi(0, 4, 0, 2),
                {"TANDEM_STORE_ADDR", "MASTER_ADDR", "several nodes"}},
        BadCase{"openmpi_no_job_id",
                without(openmpi(0, 2, 0, 2), {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri"}),
                {"OMPI_MCA_ess_base_jobid", "TANDEM_STORE_ADDR"}},
        BadCase{"openmpi_master_port_missing", with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "node0"}}), {"MASTER_PORT"}},
        BadCase{"openmpi_master_addr_missing", with(openmpi(0, 4, 0, 2), {{"MASTER_PORT", "29500"}}), {"MASTER_ADDR"}},
        BadCase{"openmpi_master_port_bad",
                with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "n"}, {"MASTER_PORT", "http"}}),
                {"MASTER_PORT='http'", "not a non-negative integer"}},
        BadCase{"openmpi_master_addr_bad",
                with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", ""}, {"MASTER_PORT", "1"}}),
                {"MASTER_ADDR/MASTER_PORT", "':2'", "empty host"}},
        BadCase{"openmpi_bad_tandem_store",
                with(openmpi(0, 2, 0, 2), {{"TANDEM_STORE_ADDR", "h:99999"}}),
                {"TANDEM_STORE_ADDR", "'h:99999'"}},
        BadCase{"slurm_procid_negative", with(slurm(0, 4, 0, 1), {{"SLURM_PROCID", "-3"}}), {"SLURM_PROCID", "'-3'"}},
        BadCase{"slurm_procid_too_big", slurm(4, 4, 0, 1), {"SLURM_PROCID", "'4'"}},
        BadCase{"slurm_ntasks_missing", without(slurm(0, 4, 0, 1), {"SLURM_NTASKS"}), {"SLURM_NTASKS", "srun -n"}},
        BadCase{"slurm_multi_node_needs_store", slurm(0, 8, 0, 2), {"TANDEM_STORE_ADDR", "srun"}},
        BadCase{"slurm_no_job_id", without(slurm(0, 4, 0, 1), {"SLURM_JOB_ID"}), {"SLURM_JOB_ID", "TANDEM_STORE_ADDR"}},
        BadCase{"slurm_job_id_not_a_number", with(slurm(0, 4, 0, 1), {{"SLURM_JOB_ID", "x1"}}), {"SLURM_JOB_ID='x1'"}},
        BadCase{"slurm_step_id_not_a_number",
                with(slurm(0, 4, 0, 1), {{"SLURM_STEP_ID", "batch"}}),
                {"SLURM_STEP_ID='batch'"}},
        BadCase{"slurm_multi_node_no_nodelist",
                slurm(1, 8, 1, 2),
                {"several nodes", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "TANDEM_STORE_ADDR"}},
        BadCase{"slurm_bad_nodelist",
                with(slurm(1, 8, 1, 2), {{"SLURM_STEP_NODELIST", "node[01-"}}),
                {"SLURM_STEP_NODELIST='node[01-'", "is not a Slurm host list", "without its ']'"}},
        BadCase{"slurm_rank0_not_on_first_node",
                with(slurm(0, 8, 0, 2), {{"SLURM_STEP_NODELIST", "a[1-2]"}, {"SLURMD_NODENAME", "a2"}}),
                {"SLURMD_NODENAME='a2'", "not on 'a1'", "SLURM_STEP_NODELIST", "TANDEM_STORE_ADDR=a2:36968"}},
        BadCase{"torchrun_world_size_missing",
                without(torchrun(0, 2, 0, 2), {"WORLD_SIZE"}),
                {"WORLD_SIZE is not set", "torchrun"}},
        BadCase{"torchrun_rank_not_integer", with(torchrun(0, 2, 0, 2), {{"RANK", "one"}}), {"RANK='one'"}},
        BadCase{"torchrun_rank_too_big", torchrun(4, 4, 0, 2), {"RANK='4'", "WORLD_SIZE=4", "0..3"}},
        BadCase{"torchrun_local_rank_too_big", torchrun(1, 4, 2, 2), {"LOCAL_RANK='2'", "LOCAL_WORLD_SIZE=2"}},
        BadCase{"torchrun_local_rank_beyond_world",
                without(torchrun(1, 2, 5, 2), {"LOCAL_WORLD_SIZE"}),
                {"LOCAL_RANK='5'", "WORLD_SIZE=2"}},
        BadCase{"torchrun_local_size_above_size", torchrun(1, 2, 1, 3), {"LOCAL_WORLD_SIZE='3'", "WORLD_SIZE (2)"}},
        BadCase{"torchrun_local_size_without_rank",
                without(torchrun(1, 4, 1, 2), {"LOCAL_RANK"}),
                {"LOCAL_WORLD_SIZE is set but LOCAL_RANK is not"}},
        BadCase{"torchrun_no_master",
                without(torchrun(0, 2, 0, 2), {"MASTER_ADDR", "MASTER_PORT"}),
                {"RANK and WORLD_SIZE=2", "torchrun", "MASTER_ADDR and MASTER_PORT are not", "TANDEM_STORE_ADDR"}},
        BadCase{"torchrun_master_port_missing",
                without(torchrun(0, 2, 0, 2), {"MASTER_PORT"}),
                {"MASTER_ADDR is set but MASTER_PORT is not"}},
        BadCase{"torchrun_master_port_leaves_none",
                with(torchrun(0, 2, 0, 2), {{"MASTER_PORT", "65535"}}),
                {"MASTER_PORT='65535'", "MASTER_PORT+1", "1..65534"}},
        BadCase{"torchrun_master_port_zero", with(torchrun(0, 2, 0, 2), {{"MASTER_PORT", "0"}}), {"MASTER_PORT='0'"}},
        BadCase{"hydra_size_missing", without(hydra(0, 2, 0, 2), {"PMI_SIZE"}), {"PMI_SIZE is not set", "mpiexec"}},
        BadCase{"hydra_rank_too_big", hydra(2, 2, 0, 2), {"PMI_RANK='2'", "PMI_SIZE=2"}},
        BadCase{"hydra_local_rank_too_big", hydra(1, 4, 3, 2), {"MPI_LOCALRANKID='3'", "MPI_LOCALNRANKS=2"}},
        BadCase{"hydra_local_size_without_rank",
                without(hydra(1, 4, 1, 2), {"MPI_LOCALRANKID"}),
                {"MPI_LOCALNRANKS is set but MPI_LOCALRANKID is not"}},
        BadCase{"hydra_no_job_id", hydra(0, 2, 0, 2), {"mpiexec", "PMI_JOBID", "TANDEM_STORE_ADDR=127.0.0.1:<port>"}},
        BadCase{"hydra_multi_node_needs_store",
                with(hydra(0, 4, 0, 2), {{"PMI_JOBID", "7"}}),
                {"mpiexec", "several nodes", "TANDEM_STORE_ADDR"}},
        // Rendezvous privacy: a store other hosts can reach needs the secret; all addresses need a flag.
        BadCase{"remote_store_without_secret",
                with(kTandem2, {{"TANDEM_STORE_ADDR", "10.0.0.1:29500"}}),
                {"10.0.0.1:29500", "no secret", "TANDEM_SECRET", "TANDEM_ALLOW_NO_SECRET=1"}},
        BadCase{"master_addr_without_secret",
                with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}}),
                {"node0:29401", "TANDEM_SECRET"}},
        BadCase{"slurm_nodelist_store_without_secret",
                with(slurm(1, 8, 1, 2), {{"SLURM_JOB_NODELIST", "n[1-2]"}}),
                {"n1:36968", "no secret", "TANDEM_SECRET"}},
        BadCase{"store_on_every_address",
                with(kTandem2, {{"TANDEM_STORE_ADDR", "0.0.0.0:29500"},
                                {"TANDEM_HOST_STORE", "1"},
                                {"TANDEM_SECRET", std::string(64, 's')}}),
                {"every address", "TANDEM_STORE_LISTEN_ALL=1"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Bootstrap, StorePrivacy) {
  const Env remote = with(kTandem2, {{"TANDEM_STORE_ADDR", "10.0.0.1:29500"}});
  EXPECT_EQ(comm_options_from_env(lookup(with(remote, {{"TANDEM_ALLOW_NO_SECRET", "1"}}))).secret, "");
  EXPECT_EQ(comm_options_from_env(lookup(with(remote, {{"TANDEM_SECRET", std::string(40, 'x')}}))).secret,
            std::string(40, 'x'));
  for (const char* loopback : {"127.0.0.1:1", "localhost:1", "[::1]:1", "127.1.2.3:1"})
    EXPECT_NO_THROW(comm_options_from_env(lookup(with(kTandem2, {{"TANDEM_STORE_ADDR", loopback}})))) << loopback;
  const CommOptions all = comm_options_from_env(lookup(with(remote, {{"TANDEM_STORE_ADDR", "0.0.0.0:29500"},
                                                                     {"TANDEM_HOST_STORE", "1"},
                                                                     {"TANDEM_STORE_LISTEN_ALL", "1"},
                                                                     {"TANDEM_SECRET", std::string(64, 's')}})));
  EXPECT_TRUE(all.host_store);
}

TEST(Bootstrap, DetectLauncherWithoutAnyIsNone) { EXPECT_EQ(detect_launcher(lookup({})), "none"); }

// Slurm's host list syntax, as SLURM_JOB_NODELIST and SLURM_STEP_NODELIST write it.
TEST(Bootstrap, SlurmHostListsExpandInOrder) {
  using Hosts = std::vector<std::string>;
  for (const auto& [list, hosts] : std::vector<std::pair<std::string, Hosts>>{
           {"gpu3", {"gpu3"}},
           {"node[01-04,07],gpu3", {"node01", "node02", "node03", "node04", "node07", "gpu3"}},
           {"n[8-10]", {"n8", "n9", "n10"}},
           {"n[08-10]", {"n08", "n09", "n10"}},
           {"x[000-001]", {"x000", "x001"}},
           {"n[5]", {"n5"}},
           {"a,b[2],c", {"a", "b2", "c"}},
           {"rack[1-2]-n[1,3]", {"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"}},
           {"[1-2]x", {"1x", "2x"}},
           {"node-1.example.org,node-2.example.org", {"node-1.example.org", "node-2.example.org"}},
       }) {
    EXPECT_EQ(expand_slurm_hostlist(list), hosts) << list;
  }
  EXPECT_EQ(expand_slurm_hostlist("c[0-4095]").size(), 4096u);
  EXPECT_EQ(expand_slurm_hostlist("c[0-4095]").back(), "c4095");
}

TEST(Bootstrap, MalformedSlurmHostListsNameTheirFault) {
  for (const auto& [list, fault] : std::vector<std::pair<std::string, std::string>>{
           {"", "an empty host name"},
           {"a,,b", "an empty host name"},
           {"a,", "an empty host name"},
           {",a", "an empty host name"},
           {"n[1-", "a '[' without its ']'"},
           {"n]1", "a ']' without its '['"},
           {"n[]", "an empty range in '[]'"},
           {"n[1,]", "an empty range in '[1,]'"},
           {"n[1,,2]", "has '' in brackets"},
           {"n[3-1]", "the range '3-1', which runs backwards"},
           {"n[a-b]", "'a-b' in brackets, which is not a number"},
           {"n[1-2-3]", "'1-2-3' in brackets"},
           {"n[-1]", "'-1' in brackets"},
           {"n[[1]]", "nests brackets"},
           {"n[0-99999999]", "more than 1048576 hosts"},
           {"a[0-1023]b[0-1023]c[0-1]", "more than 1048576 hosts"},
           {"n[1234567890123456789]", "not a number"},
       }) {
    try {
      const auto hosts = expand_slurm_hostlist(list);
      ADD_FAILURE() << "'" << list << "' gave " << hosts.size() << " hosts";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("host list '" + list + "' "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(fault), std::string::npos) << e.what();
    }
  }
}

// 20000 + 4 * (job mod 10000) + step mod 4: consecutive jobs and concurrent steps differ.
TEST(Bootstrap, SlurmStorePortFromJobAndStep) {
  EXPECT_EQ(slurm_store_port(0, 0), 20000);
  EXPECT_EQ(slurm_store_port(4242, 0), 36968);
  EXPECT_EQ(slurm_store_port(4242, 1), 36969);
  EXPECT_EQ(slurm_store_port(14242, 0), 36968);  // 10,000 jobs later it comes round
  EXPECT_EQ(slurm_store_port(9999, 3), 59999);
  EXPECT_EQ(slurm_store_port(9999, 4294967294ull), 59998);  // the batch step's id
  EXPECT_NE(slurm_store_port(4243, 0), slurm_store_port(4242, 3));
  // A one-node step uses it on loopback.
  EXPECT_EQ(comm_options_from_env(lookup(slurm(0, 4, 0, 1))).store_address, "127.0.0.1:36968");
}

TEST(Bootstrap, TimeoutsAreRead) {
  CommOptions o = comm_options_from_env(
      lookup(with(kTandem2, {{"TANDEM_TIMEOUT_MS", "1500"}, {"TANDEM_CONNECT_TIMEOUT_MS", "250"}})));
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.connect_timeout, std::chrono::milliseconds(250));
  CommOptions defaults = comm_options_from_env(lookup(kTandem2));
  EXPECT_EQ(defaults.timeout, CommOptions{}.timeout);
  EXPECT_EQ(defaults.connect_timeout, CommOptions{}.connect_timeout);
}

// The ring's variables are the ring's (ring::ring_options_from_env): comm's reader leaves them alone.
TEST(Bootstrap, RingVariablesAreNotCommsToRead) {
  EXPECT_NO_THROW(comm_options_from_env(lookup(with(kTandem2, {{"TANDEM_ALGO", "tree"}, {"TANDEM_SHM", "maybe"}}))));
}

// UCX's own variables are read only to learn the user set them.
TEST(Bootstrap, UcxVariablesArePinnedNotParsed) {
  const CommOptions o = comm_options_from_env(
      lookup(with(kTandem2, {{"UCX_NET_DEVICES", "mlx5_0:1"}, {"UCX_KEEPALIVE_INTERVAL", "1s"}})));
  EXPECT_TRUE(o.ucx_net_devices_pinned);
  EXPECT_TRUE(o.ucx_keepalive_pinned);
  EXPECT_EQ(o.ucx_net_devices, "");  // not forced onto loopback
  const CommOptions plain = comm_options_from_env(lookup(kTandem2));
  EXPECT_FALSE(plain.ucx_net_devices_pinned);
  EXPECT_FALSE(plain.ucx_keepalive_pinned);
  EXPECT_EQ(plain.ucx_net_devices, "lo");
}

TEST(Bootstrap, DerivedPortIsDeterministicPerJob) {
  auto port = [](const Env& env) { return port_of(comm_options_from_env(lookup(env)).store_address); };
  // Every rank of one job agrees on the port...
  EXPECT_EQ(port(openmpi(0, 4, 0, 4)), port(openmpi(3, 4, 3, 4)));
  EXPECT_EQ(port(slurm(0, 4, 0, 1)), port(slurm(2, 4, 2, 1)));
  // ...and different jobs (or steps) very likely differ.
  EXPECT_NE(port(openmpi(0, 2, 0, 2)),
            port(with(openmpi(0, 2, 0, 2), {{"OMPI_MCA_ess_base_jobid", "99"}, {"PMIX_NAMESPACE", "99"}})));
  EXPECT_NE(port(slurm(0, 4, 0, 1)), port(with(slurm(0, 4, 0, 1), {{"SLURM_STEP_ID", "1"}})));
}

TEST(Bootstrap, ProcessEnvReadsRealEnvironment) {
  ::setenv("TANDEM_BOOTSTRAP_TEST_VAR", "hello", 1);
  auto env = process_env();
  EXPECT_EQ(env("TANDEM_BOOTSTRAP_TEST_VAR"), std::optional<std::string>("hello"));
  EXPECT_EQ(env("TANDEM_BOOTSTRAP_TEST_VAR_UNSET_XYZ"), std::nullopt);
  ::unsetenv("TANDEM_BOOTSTRAP_TEST_VAR");
}

// The job secret: from the variable, or a file only its owner may read.
TEST(Bootstrap, SecretFromVariableOrPrivateFile) {
  const std::string secret(40, 's');
  EXPECT_EQ(read_secret(lookup({})), "");
  EXPECT_EQ(read_secret(lookup({{"TANDEM_SECRET", secret}})), secret);
  try {
    read_secret(lookup({{"TANDEM_SECRET", "short"}}));
    ADD_FAILURE() << "a 5-character secret was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the job secret in TANDEM_SECRET has 5 characters; use at least 32"),
              std::string::npos)
        << e.what();
  }
  std::string path_template = testing::scratch_template("tandem_secret");
  char* path = path_template.data();
  const int fd = ::mkstemp(path);  // mode 0600
  ASSERT_GE(fd, 0);
  const std::string text = secret + "\n";
  ASSERT_EQ(::write(fd, text.data(), text.size()), ssize_t(text.size()));
  ::close(fd);
  EXPECT_EQ(read_secret(lookup({{"TANDEM_SECRET_FILE", path}})), secret);
  ::chmod(path, 0644);
  try {
    read_secret(lookup({{"TANDEM_SECRET_FILE", path}}));
    ADD_FAILURE() << "a world-readable secret file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("has mode 0644: others may read the job secret; chmod 600 it"),
              std::string::npos)
        << e.what();
  }
  ::unlink(path);
  EXPECT_THROW(read_secret(lookup({{"TANDEM_SECRET_FILE", path}})), InvalidArgument);
}

}  // namespace
}  // namespace tandem
