// The C API and the installed package, each exercised from outside the C++ code:
// the C99 check program under tandem launch, and an out-of-tree consumer built
// against `cmake --install` output (find_package and pkg-config).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/wait.h>

namespace {

struct Output {
  int status = -1;
  std::string text;
};

// A shell command under a hard wall-clock limit.
Output run(const std::string& command, int limit_seconds) {
  Output o;
  const std::string guarded = "timeout -s KILL " + std::to_string(limit_seconds) + " sh -c '" + command + "' 2>&1";
  FILE* p = popen(guarded.c_str(), "r");
  if (!p) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.text.append(buf, n);
  const int status = pclose(p);
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class CApi : public ::testing::TestWithParam<std::pair<int, std::string>> {};

TEST_P(CApi, EveryEntryPointAndItsErrors) {
  const auto [ranks, extra_env] = GetParam();
  ASSERT_FALSE(env("TANDEM_C_API_CHECK").empty()) << "run through ctest";
  const Output out =
      run(extra_env + " " + env("TANDEM_BIN") + " launch -n " + std::to_string(ranks) + " -- " + env("TANDEM_C_API_CHECK"),
          240);
  EXPECT_EQ(out.status, 0) << out.text;
  EXPECT_EQ(count(out.text, "checks passed"), ranks) << out.text;
  EXPECT_EQ(count(out.text, "failed"), 0) << out.text;
}

INSTANTIATE_TEST_SUITE_P(Worlds, CApi,
                         ::testing::Values(std::pair{1, std::string()}, std::pair{2, std::string()},
                                           std::pair{3, std::string()}, std::pair{2, std::string("TANDEM_SHM=0")}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "_ranks" +
                                  (info.param.second.empty() ? "" : "_ucx_only");
                         });

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

  out = run("cmake -S " + env("TANDEM_SOURCE_DIR") + "/tests/capi/consumer -B " + build + " -G Ninja -DCMAKE_PREFIX_PATH=" +
                prefix + " && ninja -C " + build,
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
                "/tests/capi/consumer/consumer.c -o " + tmp + "/consumer_pc $(PKG_CONFIG_PATH=" + prefix +
                "/lib/pkgconfig pkg-config --cflags --libs tandem) -Wl,-rpath," + prefix + "/lib && " +
                prefix + "/bin/tandem launch -n 2 -- " + tmp + "/consumer_pc",
            180);
  EXPECT_EQ(out.status, 0) << out.text;
  EXPECT_EQ(count(out.text, "wrong 0"), 2) << out.text;
  run("rm -rf " + tmp, 60);
}

}  // namespace
