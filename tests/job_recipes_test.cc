// The recipes of docs/running.md for batch systems and Kubernetes, checked
// by the environment each produces: two processes started here with exactly
// the variables `srun` in an `sbatch` script, a Kubeflow PyTorchJob's pods or
// an MPIJob's `mpirun` give a rank (and what the recipe adds), nothing of
// `tandem launch`'s. Each process prints what tandem read (`tandem info`) and
// runs a checked 2-rank all-reduce (`tandem bench -c 1`). None of Slurm or
// Kubernetes is installed here; mpirun (openmpi-bin) is, and runs for real.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "scratch_dir.h"

namespace {

using ::testing::HasSubstr;

std::string tandem_bin() {
  const char* bin = std::getenv("TANDEM_BIN");
  return bin ? bin : "";
}

std::string hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

// What every process gets besides its launcher's variables: a clean
// environment, as a pod or a Slurm task starts (no TANDEM_* of this process).
std::vector<std::string> base_environment() {
  std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"};
  if (const char* tmp = std::getenv("TMPDIR")) env.push_back(std::string("TMPDIR=") + tmp);
  return env;
}

// The job: info, then a checked all-reduce of 8 B to 64 KiB.
std::string rank_script() {
  return tandem_bin() + " info | grep 'job environment'; exec " + tandem_bin() +
         " bench allreduce -b 8 -e 64K -f 16 -n 2 -w 1 -c 1";
}

struct Process {
  int code = -1;
  std::string output;
};

// Runs `command` under sh once per environment, all at once, each stopped
// by `timeout` after 60 s; returns exit codes and output.
std::vector<Process> run_all(const std::vector<std::vector<std::string>>& environments, const std::string& command) {
  std::vector<pid_t> pids;
  std::vector<std::string> files;
  for (const auto& vars : environments) {
    std::string path = tandem::testing::scratch_template("job");
    const int fd = ::mkstemp(path.data());
    files.push_back(path);
    std::vector<char*> envp;
    for (const std::string& kv : vars) envp.push_back(const_cast<char*>(kv.c_str()));
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execle("/usr/bin/timeout", "timeout", "-k", "5", "60", "/bin/sh", "-c", command.c_str(),
               static_cast<char*>(nullptr), envp.data());
      ::_exit(127);
    }
    ::close(fd);
    pids.push_back(pid);
  }
  std::vector<Process> out(pids.size());
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    out[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream f(files[i]);
    out[i].output.assign(std::istreambuf_iterator<char>(f), {});
    std::remove(files[i].c_str());
  }
  return out;
}

void expect_checked_allreduce(const std::vector<Process>& ranks, const std::vector<std::string>& read_as) {
  ASSERT_EQ(ranks.size(), read_as.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].output;
    EXPECT_THAT(ranks[r].output, HasSubstr(read_as[r])) << "rank " << r;
  }
  EXPECT_THAT(ranks[0].output, HasSubstr("# Out of bounds values : 0 OK")) << ranks[0].output;
}

// Whether nothing listens on `port` now (a concurrent test's store may).
bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  const bool free = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) ::close(fd);
  return free;
}

// A port for rank 0's store that this test alone is likely to use: derived
// from the pid, and free now, with the one after it.
int test_port(int offset) {
  for (int i = 0;; i += 2) {
    const int port = 21000 + (::getpid() * 7 + offset + i) % 20000;
    if ((port_free(port) && port_free(port + 1)) || i > 40000) return port;
  }
}

// A Slurm job id whose store port (20000 + 4 x (job mod 10000)) is free now.
int slurm_job(int offset) {
  for (int i = 0;; ++i) {
    const int job = 100000 + (::getpid() + offset + i) % 10000;
    if (port_free(20000 + 4 * (job % 10000)) || i > 10000) return job;
  }
}

class JobRecipes : public ::testing::Test {
 protected:
  void SetUp() override {
    if (tandem_bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (ctest sets it to the built `tandem`)";
  }
};

// What srun gives task `rank` of a 2-task step of job `job` over `nodes`
// (one node: both tasks on it; two: one task each, `nodes` naming them).
std::vector<std::string> slurm_task(int job, int rank, const std::vector<std::string>& nodes) {
  const bool one_node = nodes.size() == 1;
  const std::string list = one_node ? nodes[0] : nodes[0] + "," + nodes[1];
  const std::string per_node = one_node ? "2" : "1";
  auto env = base_environment();
  for (const std::string& kv :
       {"SLURM_JOB_ID=" + std::to_string(job), "SLURM_JOBID=" + std::to_string(job), std::string("SLURM_STEP_ID=0"),
        "SLURM_PROCID=" + std::to_string(rank), std::string("SLURM_NTASKS=2"), std::string("SLURM_NPROCS=2"),
        "SLURM_LOCALID=" + std::to_string(one_node ? rank : 0), "SLURM_NODEID=" + std::to_string(one_node ? 0 : rank),
        "SLURM_NNODES=" + std::to_string(nodes.size()), "SLURM_JOB_NUM_NODES=" + std::to_string(nodes.size()),
        "SLURM_STEP_NODELIST=" + list, "SLURM_JOB_NODELIST=" + list, "SLURM_NODELIST=" + list,
        "SLURM_TASKS_PER_NODE=" + (one_node ? std::string("2") : std::string("1(x2)")),
        "SLURM_NTASKS_PER_NODE=" + per_node, std::string("SLURM_STEP_NUM_TASKS=2"),
        "SLURM_STEP_NUM_NODES=" + std::to_string(nodes.size()),
        "SLURMD_NODENAME=" + nodes[one_node ? 0 : size_t(rank)]})
    env.push_back(kv);
  return env;
}

// `srun` inside `sbatch -N 1 --ntasks-per-node=2`: rank 0 hosts the store on
// 127.0.0.1 at the port derived from the job and step ids (20000 + 4 x (job
// mod 10000) + step mod 4).
TEST_F(JobRecipes, SlurmSrunOnOneNode) {
  const int job = slurm_job(0);
  std::vector<std::vector<std::string>> tasks = {slurm_task(job, 0, {hostname()}), slurm_task(job, 1, {hostname()})};
  const std::string store = "store 127.0.0.1:" + std::to_string(20000 + 4 * (job % 10000));
  expect_checked_allreduce(run_all(tasks, rank_script()),
                           {"job environment (slurm): rank 0 of 2, local rank 0 of 2, " + store + " (hosted by rank 0)",
                            "job environment (slurm): rank 1 of 2, local rank 1 of 2, " + store});
}

// `sbatch -N 2 --ntasks-per-node=1`: rank 0 hosts the store on the step's
// first node (this host's name; `localhost` stands for the second node, and
// TANDEM_HOST_ID makes each task a host of its own), which needs the job
// secret: the recipe's TANDEM_SECRET_FILE, mode 0600.
TEST_F(JobRecipes, SlurmSrunOnTwoNodesWithTheSecretFile) {
  const int job = slurm_job(1);
  std::string secret = tandem::testing::scratch_template("secret");
  ::close(::mkstemp(secret.data()));  // mode 0600
  std::ofstream(secret) << std::string(64, 's') << "\n";
  const std::vector<std::string> nodes = {hostname(), "localhost"};
  std::vector<std::vector<std::string>> tasks;
  for (int r = 0; r < 2; ++r) {
    tasks.push_back(slurm_task(job, r, nodes));
    tasks.back().insert(tasks.back().end(),
                        {"TANDEM_SECRET_FILE=" + secret, "TANDEM_HOST_ID=node" + std::to_string(r)});
  }
  const std::string store = "store " + hostname() + ":" + std::to_string(20000 + 4 * (job % 10000));
  expect_checked_allreduce(run_all(tasks, rank_script()),
                           {"job environment (slurm): rank 0 of 2, local rank 0 of 1, " + store + " (hosted by rank 0)",
                            "job environment (slurm): rank 1 of 2, local rank 0 of 1, " + store});
  std::remove(secret.c_str());
}

// A Kubeflow PyTorchJob (one Master, one Worker replica, one process per
// pod): the training operator sets MASTER_PORT, WORLD_SIZE and RANK, and
// MASTER_ADDR: `localhost` in the master's pod, the master's service name in
// the workers' (this host's name stands for it here); no local rank. Rank 0
// would host tandem's store on MASTER_ADDR, loopback there, so the recipe
// gives the Master TANDEM_STORE_ADDR=0.0.0.0:<MASTER_PORT+1> with
// TANDEM_STORE_LISTEN_ALL=1, and every pod the job secret from a Kubernetes
// Secret; the workers reach the store at MASTER_ADDR on MASTER_PORT + 1.
TEST_F(JobRecipes, KubeflowPyTorchJob) {
  const int master_port = test_port(0);
  const std::string store_port = std::to_string(master_port + 1);
  std::vector<std::vector<std::string>> pods;
  for (int r = 0; r < 2; ++r) {
    auto env = base_environment();
    for (const std::string& kv :
         {"MASTER_ADDR=" + (r == 0 ? std::string("localhost") : hostname()),
          "MASTER_PORT=" + std::to_string(master_port), std::string("WORLD_SIZE=2"), "RANK=" + std::to_string(r),
          std::string("PYTHONUNBUFFERED=0"), "TANDEM_SECRET=" + std::string(64, 'k')})
      env.push_back(kv);
    if (r == 0) env.insert(env.end(), {"TANDEM_STORE_ADDR=0.0.0.0:" + store_port, "TANDEM_STORE_LISTEN_ALL=1"});
    pods.push_back(env);
  }
  expect_checked_allreduce(
      run_all(pods, rank_script()),
      {"job environment (torchrun): rank 0 of 2, local rank -1 of -1, store 0.0.0.0:" + store_port +
           " (hosted by rank 0)",
       "job environment (torchrun): rank 1 of 2, local rank -1 of -1, store " + hostname() + ":" + store_port + "\n"});
}

// An MPIJob (Kubeflow's mpi-operator, Open MPI): the launcher runs mpirun
// with the operator's host file in OMPI_MCA_orte_default_hostfile; the
// recipe points every rank at a store on the host file's first host (where
// rank 0 runs) and passes the secret with -x. mpirun runs for real here, so
// the OMPI_* variables are its own.
TEST_F(JobRecipes, KubeflowMpiJob) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not found (openmpi-bin)";
  std::string hostfile = tandem::testing::scratch_template("hostfile");
  ::close(::mkstemp(hostfile.data()));
  std::ofstream(hostfile) << "localhost slots=2\n";
  auto env = base_environment();
  for (const std::string& kv : {"OMPI_MCA_orte_default_hostfile=" + hostfile, std::string("OMPI_ALLOW_RUN_AS_ROOT=1"),
                                std::string("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"), std::string("OMPI_MCA_btl=self,tcp"),
                                std::string("OMPI_MCA_oob_tcp_if_include=lo"), "TANDEM_SECRET=" + std::string(64, 'm')})
    env.push_back(kv);
  // The recipe's launcher command, as docs/running.md gives it.
  const std::string port = std::to_string(test_port(1));
  const std::string launcher =
      "STORE_HOST=$(awk '!/^#/ && NF {print $1; exit}' $OMPI_MCA_orte_default_hostfile); "
      "mpirun -n 2 -x TANDEM_STORE_ADDR=$STORE_HOST:" +
      port + " -x TANDEM_SECRET sh -c \"" + rank_script() + "\"";
  const std::vector<Process> run = run_all({env}, launcher);
  ASSERT_EQ(run[0].code, 0) << run[0].output;
  const std::string store = "store localhost:" + port;
  EXPECT_THAT(run[0].output,
              HasSubstr("job environment (openmpi): rank 0 of 2, local rank 0 of 2, " + store + " (hosted by rank 0)"));
  EXPECT_THAT(run[0].output, HasSubstr("job environment (openmpi): rank 1 of 2, local rank 1 of 2, " + store));
  EXPECT_THAT(run[0].output, HasSubstr("# Out of bounds values : 0 OK")) << run[0].output;
  std::remove(hostfile.c_str());
}

}  // namespace
