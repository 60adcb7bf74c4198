// The C API and the installed package, each exercised from outside the C++ code:
// the C99 check program under tandem launch, and an out-of-tree consumer built
// against `cmake --install` output (find_package and pkg-config).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "command.h"

namespace {

using tandem::testing::env;
using tandem::testing::Output;
using tandem::testing::run;

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The worlds both the C and the Python checks run in: ranks, and extra environment.
using World = std::pair<int, std::string>;
const auto kWorlds = ::testing::Values(World{1, ""}, World{2, ""}, World{3, ""}, World{2, "TANDEM_SHM=0"});
std::string world_name(const ::testing::TestParamInfo<World>& info) {
  return std::to_string(info.param.first) + "_ranks" + (info.param.second.empty() ? "" : "_ucx_only");
}

class CApi : public ::testing::TestWithParam<World> {};

TEST_P(CApi, EveryEntryPointAndItsErrors) {
  const auto [ranks, extra_env] = GetParam();
  ASSERT_FALSE(env("TANDEM_C_API_CHECK").empty()) << "run through ctest";
  const Output out = run(
      extra_env + " " + env("TANDEM_BIN") + " launch -n " + std::to_string(ranks) + " -- " + env("TANDEM_C_API_CHECK"),
      240);
  EXPECT_EQ(out.status, 0) << out.text;
  EXPECT_EQ(count(out.text, "checks passed"), ranks) << out.text;
  EXPECT_EQ(count(out.text, "failed"), 0) << out.text;
}

INSTANTIATE_TEST_SUITE_P(Worlds, CApi, kWorlds, world_name);

class Python : public ::testing::TestWithParam<World> {
 protected:
  // tests/python/<script> under tandem launch in this world: every rank must print "checks passed".
  void run_check(const std::string& script) {
    if (env("TANDEM_PYTHONPATH").empty())
      GTEST_SKIP() << "the Python package was not built (needs pybind11-dev, python3-dev)";
    if (run("/usr/bin/python3 -c \"import numpy\"", 60).status != 0)
      GTEST_SKIP() << "/usr/bin/python3 has no numpy (python3-numpy)";
    const auto [ranks, extra_env] = GetParam();
    const Output out =
        run(extra_env + " PYTHONPATH=" + env("TANDEM_PYTHONPATH") + " " + env("TANDEM_BIN") + " launch -n " +
                std::to_string(ranks) + " -- /usr/bin/python3 " + env("TANDEM_SOURCE_DIR") + "/tests/python/" + script,
            300);
    EXPECT_EQ(out.status, 0) << out.text;
    EXPECT_EQ(count(out.text, "checks passed"), ranks) << out.text;
  }
};

TEST_P(Python, CollectivesGradientSyncAndErrorsFromNumpyAndTorch) { run_check("check_bindings.py"); }

// All-to-all, rooted and variable-size collectives, send/recv/group and split, against closed forms.
TEST_P(Python, MoreCollectivesPointToPointAndSplit) { run_check("check_more_collectives.py"); }

INSTANTIATE_TEST_SUITE_P(Worlds, Python, kWorlds, world_name);

// torch.distributed's "tandem" backend (tandem.c10d, a C++ ProcessGroup) from Python.
std::string c10d_skip_reason() {
  if (env("TANDEM_PYTHONPATH").empty()) return "the Python package was not built (needs pybind11-dev, python3-dev)";
  if (run("test -e " + env("TANDEM_PYTHONPATH") + "/tandem/_c10d*.so", 10).status != 0)
    return "the torch backend was not built (needs libtorch-dev)";
  if (run("/usr/bin/python3 -c \"import torch\"", 120).status != 0)
    return "/usr/bin/python3 has no torch (python3-torch)";
  return "";
}

class C10d : public ::testing::TestWithParam<World> {};

// Under tandem launch, the group rendezvouses through a file:// init method.
TEST_P(C10d, EveryCollectiveAgainstClosedForms) {
  if (auto why = c10d_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const auto [ranks, extra_env] = GetParam();
  const std::string file =
      ::testing::TempDir() + "tandem-c10d-" + std::to_string(getpid()) + "-" + std::to_string(ranks);
  run("rm -f " + file, 10);
  const Output out = run(extra_env + " TANDEM_C10D_FILE=" + file + " PYTHONPATH=" + env("TANDEM_PYTHONPATH") + " " +
                             env("TANDEM_BIN") + " launch -n " + std::to_string(ranks) + " -- /usr/bin/python3 " +
                             env("TANDEM_SOURCE_DIR") + "/tests/python/check_c10d.py",
                         300);
  EXPECT_EQ(out.status, 0) << out.text;
  EXPECT_EQ(count(out.text, "file:// c10d checks passed"), ranks) << out.text;
  run("rm -f " + file, 10);
}

INSTANTIATE_TEST_SUITE_P(Worlds, C10d, kWorlds, world_name);

// torchrun's contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; env://),
// with the ranks started by hand: Debian's torchrun 1.13 fails on Python 3.11 before starting any.
TEST(C10dEnv, TorchrunVariablesJustWork) {
  if (auto why = c10d_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string port = std::to_string(20000 + getpid() % 20000);
  std::string ranks;
  for (int r = 0; r < 2; ++r) {
    ranks += "RANK=" + std::to_string(r) + " LOCAL_RANK=" + std::to_string(r) +
             " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + port + " PYTHONPATH=" + env("TANDEM_PYTHONPATH") +
             " /usr/bin/python3 " + env("TANDEM_SOURCE_DIR") + "/tests/python/check_c10d.py & ";
  }
  const Output out = run(ranks + "wait", 240);
  EXPECT_EQ(count(out.text, "env:// c10d checks passed"), 2) << out.text;
}

// One rank of three stops (SIGSTOP) mid-run; c10d's FileStore is the only
// store (no tandem store, no launcher), so the ranks watch each other's
// heartbeats through it. Every survivor must fail within three heartbeat
// intervals of the stop, naming the stopped rank, its host and the call.
TEST(C10dLiveness, AStoppedRankIsNamedWithinThreeHeartbeats) {
  if (auto why = c10d_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  constexpr int kHeartbeatMs = 1000;
  const std::string file = ::testing::TempDir() + "tandem-c10d-liveness-" + std::to_string(getpid());
  run("rm -f " + file, 10);
  std::string script;
  for (int r = 0; r < 3; ++r) {
    script += "RANK=" + std::to_string(r) +
              " WORLD_SIZE=3 VICTIM=1 TANDEM_FLIGHT_ENTRIES=0 TANDEM_HEARTBEAT_MS=" + std::to_string(kHeartbeatMs) +
              " TANDEM_C10D_FILE=" + file + " PYTHONPATH=" + env("TANDEM_PYTHONPATH") +
              " TANDEM_PYTHONPATH=" + env("TANDEM_PYTHONPATH") + " /usr/bin/python3 " + env("TANDEM_SOURCE_DIR") +
              "/tests/python/check_c10d_liveness.py & p" + std::to_string(r) + "=$!; ";
  }
  // A guard kills every rank should the survivors hang (its sleep ends with it); the stopped rank is killed at the end.
  script +=
      "(trap 'kill $! 2>/dev/null; exit' TERM; sleep 150 & wait $!; kill -9 $p0 $p1 $p2) >/dev/null 2>&1 & g=$!; "
      "wait $p0; wait $p2; kill -9 $p1; kill $g; wait $p1";
  const Output out = run(script, 180);
  run("rm -f " + file, 10);
  int survivors = 0;
  for (size_t at = out.text.find(" s after rank 1 stopped: "); at != std::string::npos;
       at = out.text.find(" s after rank 1 stopped: ", at + 1)) {
    ++survivors;
    const size_t line = out.text.rfind("failed ", at);
    const double took = std::atof(out.text.c_str() + line + 7);
    const std::string error = out.text.substr(at, out.text.find('\n', at) - at);
    std::printf("  survivor failed %.2f s after the stop\n", took);
    EXPECT_LE(took, 3.0 * kHeartbeatMs / 1000) << error;
    EXPECT_NE(error.find("rank 1 (host "), std::string::npos) << error;
    EXPECT_NE(error.find("no heartbeat for"), std::string::npos) << error;
    EXPECT_NE(error.find("during allreduce #"), std::string::npos) << error;
  }
  EXPECT_EQ(survivors, 2) << out.text;
}

// DDP on tandem's backend and with its buckets through tandem (the comm hook),
// each against DDP over gloo: same seed, data and model (the Fashion-MNIST
// convnet), 10 steps, parameters compared.
TEST(PythonDdp, BucketsThroughTandemGiveGloosParameters) {
  if (env("TANDEM_PYTHONPATH").empty())
    GTEST_SKIP() << "the Python package was not built (needs pybind11-dev, python3-dev)";
  if (run("/usr/bin/python3 -c \"import torch, numpy\"", 120).status != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no torch (python3-torch)";
  if (run("test -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", 10).status != 0)
    GTEST_SKIP() << "no Fashion-MNIST (dataset-fashion-mnist)";
  const std::string tmp = ::testing::TempDir() + "tandem-ddp-" + std::to_string(getpid());
  const bool backend = c10d_skip_reason().empty();
  std::vector<std::string> modes = {"gloo", "tandem"};
  if (backend) modes.push_back("backend");
  for (const std::string& allreduce : modes) {
    const Output out =
        run("PYTHONPATH=" + env("TANDEM_PYTHONPATH") + " " + env("TANDEM_BIN") + " launch -n 2 -- /usr/bin/python3 " +
                env("TANDEM_SOURCE_DIR") + "/examples/ddp_fashion_mnist.py --steps 10 --allreduce " + allreduce +
                " --dump " + tmp + "-" + allreduce + ".npy",
            300);
    ASSERT_EQ(out.status, 0) << out.text;
    EXPECT_NE(out.text.find("\"allreduce\": \"" + allreduce + "\""), std::string::npos) << out.text;
  }
  for (size_t m = 1; m < modes.size(); ++m) {
    const Output cmp =
        run("/usr/bin/python3 -c \"import numpy as np; a = np.load(\\\"" + tmp + "-gloo.npy\\\"); b = np.load(\\\"" +
                tmp + "-" + modes[m] + ".npy\\\"); print(a.size, float(np.abs(a - b).max()))\"",
            60);
    ASSERT_EQ(cmp.status, 0) << cmp.text;
    size_t n = 0;
    double diff = 1;
    ASSERT_EQ(std::sscanf(cmp.text.c_str(), "%zu %lf", &n, &diff), 2) << cmp.text;
    EXPECT_EQ(n, 3274634u);  // the convnet's parameters
    EXPECT_LE(diff, 1e-5) << "largest parameter difference after 10 steps, " << modes[m] << " against gloo";
  }
  for (const auto& m : modes) run("rm -f " + tmp + "-" + m + ".npy", 10);
}

TEST(InstalledPackage, AnOutOfTreeConsumerBuildsAndRuns) {
  ASSERT_FALSE(env("TANDEM_BUILD_DIR").empty()) << "run through ctest";
  const std::string tmp = ::testing::TempDir() + "tandem-install-" + std::to_string(getpid());
  const std::string prefix = tmp + "/prefix", build = tmp + "/consumer";
  Output out = run("cmake --install " + env("TANDEM_BUILD_DIR") + " --prefix " + prefix, 120);
  ASSERT_EQ(out.status, 0) << out.text;
  out = run("ls " + prefix + "/lib/libtandem.so.0 " + prefix + "/lib/cmake/tandem/tandemConfig.cmake " + prefix +
                "/lib/pkgconfig/tandem.pc " + prefix + "/include/tandem/c_api.h " + prefix +
                "/include/tandem/fusion/gradient_sync.h " + prefix + "/bin/tandem",
            30);
  ASSERT_EQ(out.status, 0) << out.text;

  out = run("cmake -S " + env("TANDEM_SOURCE_DIR") + "/tests/capi/consumer -B " + build +
                " -G Ninja -DCMAKE_PREFIX_PATH=" + prefix + " && ninja -C " + build,
            300);
  ASSERT_EQ(out.status, 0) << out.text;
  for (const char* program : {"consumer_c", "consumer_cpp"}) {
    out = run(prefix + "/bin/tandem launch -n 2 -- " + build + "/" + program, 120);
    EXPECT_EQ(out.status, 0) << out.text;
    EXPECT_EQ(count(out.text, "wrong 0"), 2) << out.text;
  }
  EXPECT_NE(out.text.find("avg 1.5"), std::string::npos) << out.text;

  // pkg-config alone, without CMake.
  out = run("PKG_CONFIG_PATH=" + prefix + "/lib/pkgconfig cc -std=c99 " + env("TANDEM_SOURCE_DIR") +
                "/examples/allreduce.c -o " + tmp + "/consumer_pc $(PKG_CONFIG_PATH=" + prefix +
                "/lib/pkgconfig pkg-config --cflags --libs tandem) -Wl,-rpath," + prefix + "/lib && " + prefix +
                "/bin/tandem launch -n 2 -- " + tmp + "/consumer_pc",
            180);
  EXPECT_EQ(out.status, 0) << out.text;
  EXPECT_EQ(count(out.text, "wrong 0"), 2) << out.text;

  // The installed Python package, in the directory the interpreter searches for this prefix
  // (<prefix>/lib/python3.X/dist-packages on Debian: /usr/local's is on its default path),
  // imported with a clean environment; `python3 -m tandem.launch` runs the prefix's tandem.
  if (!env("TANDEM_PYTHONPATH").empty()) {
    const std::string python = "env -i PATH=/usr/bin:/bin /usr/bin/python3";
    out = run(python + " " + env("TANDEM_SOURCE_DIR") + "/capi/python/site_dir.py", 30);
    ASSERT_EQ(out.status, 0) << out.text;
    const std::string site = prefix + "/" + out.text.substr(0, out.text.find('\n'));
    out = run(
        python + " -c \"import sys; print('/usr/local/' + '" + site.substr(prefix.size() + 1) + "' in sys.path)\"", 30);
    EXPECT_EQ(out.text, "True\n") << "the site directory is not on the interpreter's path for /usr/local";
    out = run(python + " -c \"import site; site.addsitedir('" + site +
                  "'); import tandem, tandem.c10d; print(tandem.__file__, tandem.__version__)\"",
              60);
    EXPECT_EQ(out.status, 0) << out.text;
    EXPECT_NE(out.text.find(site + "/tandem/__init__.py"), std::string::npos) << out.text;
    out = run(
        "env -i PATH=/usr/bin:/bin PYTHONPATH=" + site + " /usr/bin/python3 -m tandem.launch -n 2 -- echo rank-up", 60);
    EXPECT_EQ(out.status, 0) << out.text;
    EXPECT_EQ(count(out.text, "rank-up"), 2) << out.text;

    // pip install . (offline, packaging this build), imported and launched with a clean environment.
    const std::string target = tmp + "/pip";
    out = run("cd " + env("TANDEM_SOURCE_DIR") + " && TANDEM_BUILD_DIR=" + env("TANDEM_BUILD_DIR") +
                  " /usr/bin/python3 -m pip install --no-build-isolation --no-deps --no-index --quiet --target " +
                  target + " .",
              300);
    ASSERT_EQ(out.status, 0) << out.text;
    out = run("env -i PATH=/usr/bin:/bin PYTHONPATH=" + target + " /usr/bin/python3 -m tandem.launch -n 2 -- " +
                  "/usr/bin/python3 -c \"import tandem, tandem.c10d, numpy as n; c = tandem.init(); x = n.ones(3); " +
                  "c.allreduce(x); print('sum', x.sum(), tandem.__file__)\"",
              120);
    EXPECT_EQ(out.status, 0) << out.text;
    EXPECT_EQ(count(out.text, "sum 6.0 " + target + "/tandem/__init__.py"), 2) << out.text;
  }
  run("rm -rf " + tmp, 60);
}

}  // namespace
