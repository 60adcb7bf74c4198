// Environment detection: table-driven over fake environments (no setenv), one
// table for what must parse and one for what must fail, with the variable the
// error message has to name.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>

#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/store.h"

#include "fake_env.h"

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
  return {{"SLURM_PROCID", std::to_string(rank)}, {"SLURM_NTASKS", std::to_string(size)},
          {"SLURM_LOCALID", std::to_string(local_id)}, {"SLURM_NNODES", std::to_string(nodes)},
          {"SLURM_JOB_ID", "4242"}, {"SLURM_STEP_ID", "0"}};
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
  CommOptions o = options_from_env(lookup(with(c.env, {{"TANDEM_SECRET", std::string(64, 's')}})));
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
  } else {
    EXPECT_EQ(o.store_address, c.store);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Bootstrap, GoodEnv,
    ::testing::Values(
        GoodCase{"tandem_full",
                 {{"TANDEM_RANK", "2"}, {"TANDEM_WORLD_SIZE", "4"}, {"TANDEM_LOCAL_RANK", "0"},
                  {"TANDEM_LOCAL_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "10.0.0.1:29500"}},
                 "tandem", 2, 4, 0, 2, "10.0.0.1:29500", false},
        GoodCase{"tandem_local_defaults_to_global",
                 {{"TANDEM_RANK", "1"}, {"TANDEM_WORLD_SIZE", "2"}, {"TANDEM_STORE_ADDR", "[::1]:7000"}},
                 "tandem", 1, 2, 1, 2, "[::1]:7000", false},
        GoodCase{"tandem_single_rank_needs_no_store", {{"TANDEM_RANK", "0"}, {"TANDEM_WORLD_SIZE", "1"}}, "tandem", 0,
                 1, 0, 1, "", false},
        // tandem launch wins over the launcher underneath it.
        GoodCase{"tandem_beats_openmpi_and_slurm",
                 with(with(openmpi(1, 2, 1, 2), slurm(0, 8, 0, 2)),
                      {{"TANDEM_RANK", "3"}, {"TANDEM_WORLD_SIZE", "5"}, {"TANDEM_STORE_ADDR", "h:1"}}),
                 "tandem", 3, 5, 3, 5, "h:1", false},
        GoodCase{"openmpi_single_node_rank0_hosts", openmpi(0, 2, 0, 2), "openmpi", 0, 2, 0, 2, "derived", true},
        GoodCase{"openmpi_single_node_rank1_connects", openmpi(1, 2, 1, 2), "openmpi", 1, 2, 1, 2, "derived",
                 false},
        GoodCase{"openmpi_pmix_namespace_only",
                 without(openmpi(0, 2, 0, 2), {"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_hnp_uri"}), "openmpi", 0, 2,
                 0, 2, "derived", true},
        GoodCase{"openmpi_hnp_uri_only",
                 without(openmpi(0, 2, 0, 2), {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"}), "openmpi", 0, 2, 0, 2,
                 "derived", true},
        GoodCase{"openmpi_explicit_store_multi_node",
                 with(openmpi(3, 4, 1, 2), {{"TANDEM_STORE_ADDR", "node0:29500"}}), "openmpi", 3, 4, 1, 2,
                 "node0:29500", false},
        GoodCase{"openmpi_master_addr_port",
                 with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}}), "openmpi", 0, 4, 0,
                 2, "node0:29400", true},
        GoodCase{"openmpi_tandem_store_beats_master",
                 with(openmpi(1, 4, 1, 2),
                      {{"TANDEM_STORE_ADDR", "a:1"}, {"MASTER_ADDR", "b"}, {"MASTER_PORT", "2"}}),
                 "openmpi", 1, 4, 1, 2, "a:1", false},
        GoodCase{"openmpi_single_rank_no_store", openmpi(0, 1, 0, 1), "openmpi", 0, 1, 0, 1, "", false},
        GoodCase{"openmpi_beats_slurm", with(slurm(5, 8, 1, 2), openmpi(1, 2, 1, 2)), "openmpi", 1, 2, 1, 2,
                 "derived", false},
        GoodCase{"slurm_single_node", slurm(0, 4, 0, 1), "slurm", 0, 4, 0, 4, "derived", true},
        GoodCase{"slurm_multi_node_explicit",
                 with(slurm(5, 8, 1, 2), {{"SLURM_NTASKS_PER_NODE", "4"}, {"TANDEM_STORE_ADDR", "n0:9"}}), "slurm",
                 5, 8, 1, 4, "n0:9", false},
        GoodCase{"slurm_tasks_per_node_spec",
                 with(slurm(6, 7, 0, 3),
                      {{"SLURM_TASKS_PER_NODE", "3(x2),1"}, {"SLURM_NODEID", "2"}, {"TANDEM_STORE_ADDR", "n0:9"}}),
                 "slurm", 6, 7, 0, 1, "n0:9", false}),
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
    CommOptions o = options_from_env(lookup(c.env));
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
        BadCase{"tandem_store_malformed", with(kTandem2, {{"TANDEM_STORE_ADDR", "nohostport"}}),
                {"TANDEM_STORE_ADDR", "'nohostport'"}},
        BadCase{"tandem_local_rank_too_big", with(kTandem2, {{"TANDEM_LOCAL_RANK", "2"}, {"TANDEM_LOCAL_WORLD_SIZE", "2"}}),
                {"TANDEM_LOCAL_RANK", "'2'"}},
        BadCase{"tandem_local_size_above_size", with(kTandem2, {{"TANDEM_LOCAL_WORLD_SIZE", "3"}}),
                {"TANDEM_LOCAL_WORLD_SIZE", "'3'"}},
        BadCase{"timeout_not_integer", with(kTandem2, {{"TANDEM_TIMEOUT_MS", "5s"}}), {"TANDEM_TIMEOUT_MS", "'5s'"}},
        BadCase{"timeout_zero", with(kTandem2, {{"TANDEM_TIMEOUT_MS", "0"}}), {"TANDEM_TIMEOUT_MS", "'0'"}},
        BadCase{"connect_timeout_negative", with(kTandem2, {{"TANDEM_CONNECT_TIMEOUT_MS", "-5"}}),
                {"TANDEM_CONNECT_TIMEOUT_MS", "'-5'"}},
        BadCase{"heartbeat_too_short", with(kTandem2, {{"TANDEM_HEARTBEAT_MS", "50"}}),
                {"TANDEM_HEARTBEAT_MS", "'50'", "at least 100"}},
        BadCase{"reduce_isa_unknown", with(kTandem2, {{"TANDEM_REDUCE_ISA", "sse4"}}),
                {"TANDEM_REDUCE_ISA", "'sse4'", "scalar, avx2 or avx512"}},
        BadCase{"interfaces_disagree",
                with(kTandem2, {{"TANDEM_NETWORK_INTERFACE", "eth0"}, {"DTRAIN_NETWORK_INTERFACE", "eth1"}}),
                {"TANDEM_NETWORK_INTERFACE='eth0'", "DTRAIN_NETWORK_INTERFACE='eth1'", "disagree"}},
        BadCase{"host_store_not_a_switch", with(kTandem2, {{"TANDEM_HOST_STORE", "yes"}}),
                {"TANDEM_HOST_STORE", "'yes'", "set it to 1 (rank 0 hosts the store) or 0"}},
        BadCase{"allow_no_secret_not_a_switch",
                with(kTandem2, {{"TANDEM_STORE_ADDR", "10.0.0.1:29500"}, {"TANDEM_ALLOW_NO_SECRET", "yes"}}),
                {"TANDEM_ALLOW_NO_SECRET", "'yes'", "0 or 1"}},
        BadCase{"openmpi_rank_not_integer", with(openmpi(0, 2, 0, 2), {{"OMPI_COMM_WORLD_RANK", "x"}}),
                {"OMPI_COMM_WORLD_RANK", "'x'"}},
        BadCase{"openmpi_rank_too_big", openmpi(2, 2, 0, 2), {"OMPI_COMM_WORLD_RANK", "'2'"}},
        BadCase{"openmpi_size_missing", without(openmpi(0, 2, 0, 2), {"OMPI_COMM_WORLD_SIZE"}),
                {"OMPI_COMM_WORLD_SIZE"}},
        BadCase{"openmpi_multi_node_needs_store", openmpi(0, 4, 0, 2),
                {"TANDEM_STORE_ADDR", "MASTER_ADDR", "several nodes"}},
        BadCase{"openmpi_no_job_id",
                without(openmpi(0, 2, 0, 2), {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri"}),
                {"OMPI_MCA_ess_base_jobid", "TANDEM_STORE_ADDR"}},
        BadCase{"openmpi_master_port_missing", with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "node0"}}),
                {"MASTER_PORT"}},
        BadCase{"openmpi_master_addr_missing", with(openmpi(0, 4, 0, 2), {{"MASTER_PORT", "29500"}}),
                {"MASTER_ADDR"}},
        BadCase{"openmpi_master_port_bad", with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "n"}, {"MASTER_PORT", "http"}}),
                {"MASTER_PORT", "'n:http'"}},
        BadCase{"openmpi_bad_tandem_store", with(openmpi(0, 2, 0, 2), {{"TANDEM_STORE_ADDR", "h:99999"}}),
                {"TANDEM_STORE_ADDR", "'h:99999'"}},
        BadCase{"slurm_procid_negative", with(slurm(0, 4, 0, 1), {{"SLURM_PROCID", "-3"}}), {"SLURM_PROCID", "'-3'"}},
        BadCase{"slurm_procid_too_big", slurm(4, 4, 0, 1), {"SLURM_PROCID", "'4'"}},
        BadCase{"slurm_ntasks_missing", without(slurm(0, 4, 0, 1), {"SLURM_NTASKS"}), {"SLURM_NTASKS", "srun -n"}},
        BadCase{"slurm_multi_node_needs_store", slurm(0, 8, 0, 2), {"TANDEM_STORE_ADDR", "srun"}},
        BadCase{"slurm_no_job_id", without(slurm(0, 4, 0, 1), {"SLURM_JOB_ID"}), {"SLURM_JOB_ID", "TANDEM_STORE_ADDR"}},
        // Rendezvous privacy: a store other hosts can reach needs the secret; all addresses need a flag.
        BadCase{"remote_store_without_secret", with(kTandem2, {{"TANDEM_STORE_ADDR", "10.0.0.1:29500"}}),
                {"10.0.0.1:29500", "no secret", "TANDEM_SECRET", "TANDEM_ALLOW_NO_SECRET=1"}},
        BadCase{"master_addr_without_secret",
                with(openmpi(0, 4, 0, 2), {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}}),
                {"node0:29400", "TANDEM_SECRET"}},
        BadCase{"store_on_every_address",
                with(kTandem2, {{"TANDEM_STORE_ADDR", "0.0.0.0:29500"}, {"TANDEM_HOST_STORE", "1"},
                                {"TANDEM_SECRET", std::string(64, 's')}}),
                {"every address", "TANDEM_STORE_LISTEN_ALL=1"}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Bootstrap, StorePrivacy) {
  const Env remote = with(kTandem2, {{"TANDEM_STORE_ADDR", "10.0.0.1:29500"}});
  EXPECT_EQ(options_from_env(lookup(with(remote, {{"TANDEM_ALLOW_NO_SECRET", "1"}}))).secret, "");
  EXPECT_EQ(options_from_env(lookup(with(remote, {{"TANDEM_SECRET", std::string(40, 'x')}}))).secret,
            std::string(40, 'x'));
  for (const char* loopback : {"127.0.0.1:1", "localhost:1", "[::1]:1", "127.1.2.3:1"})
    EXPECT_NO_THROW(options_from_env(lookup(with(kTandem2, {{"TANDEM_STORE_ADDR", loopback}})))) << loopback;
  const CommOptions all = options_from_env(lookup(
      with(remote, {{"TANDEM_STORE_ADDR", "0.0.0.0:29500"}, {"TANDEM_HOST_STORE", "1"},
                    {"TANDEM_STORE_LISTEN_ALL", "1"}, {"TANDEM_SECRET", std::string(64, 's')}})));
  EXPECT_TRUE(all.host_store);
}

TEST(Bootstrap, DetectLauncherWithoutAnyIsNone) { EXPECT_EQ(detect_launcher(lookup({})), "none"); }

TEST(Bootstrap, TimeoutsAreRead) {
  CommOptions o = options_from_env(lookup(with(kTandem2, {{"TANDEM_TIMEOUT_MS", "1500"},
                                                          {"TANDEM_CONNECT_TIMEOUT_MS", "250"}})));
  EXPECT_EQ(o.timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(o.connect_timeout, std::chrono::milliseconds(250));
  CommOptions defaults = options_from_env(lookup(kTandem2));
  EXPECT_EQ(defaults.timeout, CommOptions{}.timeout);
  EXPECT_EQ(defaults.connect_timeout, CommOptions{}.connect_timeout);
}

// The ring's variables are the ring's (ring::options_from_env): comm's reader leaves them alone.
TEST(Bootstrap, RingVariablesAreNotCommsToRead) {
  EXPECT_NO_THROW(options_from_env(lookup(with(kTandem2, {{"TANDEM_ALGO", "tree"}, {"TANDEM_SHM", "maybe"}}))));
}

// UCX's own variables are read only to learn the user set them.
TEST(Bootstrap, UcxVariablesArePinnedNotParsed) {
  const CommOptions o = options_from_env(
      lookup(with(kTandem2, {{"UCX_NET_DEVICES", "mlx5_0:1"}, {"UCX_KEEPALIVE_INTERVAL", "1s"}})));
  EXPECT_TRUE(o.ucx_net_devices_pinned);
  EXPECT_TRUE(o.ucx_keepalive_pinned);
  EXPECT_EQ(o.ucx_net_devices, "");  // not forced onto loopback
  const CommOptions plain = options_from_env(lookup(kTandem2));
  EXPECT_FALSE(plain.ucx_net_devices_pinned);
  EXPECT_FALSE(plain.ucx_keepalive_pinned);
  EXPECT_EQ(plain.ucx_net_devices, "lo");
}

TEST(Bootstrap, DerivedPortIsDeterministicPerJob) {
  auto port = [](const Env& env) { return port_of(options_from_env(lookup(env)).store_address); };
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
  char path[] = "/tmp/tandem_secret_XXXXXX";
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
