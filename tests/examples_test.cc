// The C++ examples (examples/*.cc) end to end under `tandem launch`: each run
// exits 0 and every rank prints the example's max abs difference from its
// single-process reference, within 1e-5. Every run is killed at a hard
// wall-clock limit (command.h), so a hang fails the test instead of stalling it.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "command.h"

namespace {

using tandem::testing::env;
using tandem::testing::Output;
using tandem::testing::run;

constexpr int kLimitSeconds = 30;  // per run; a run normally takes about a second

// `tandem launch -n <ranks> [launch_flags]` of `binary`, bounded by kLimitSeconds (and by the launcher's own
// --timeout).
Output launch(int ranks, const std::string& binary, const std::string& launch_flags = "") {
  return run(env("TANDEM_BIN") + " launch -n " + std::to_string(ranks) + " --timeout " +
                 std::to_string(kLimitSeconds - 5) + " " + launch_flags + " -- " + binary,
             kLimitSeconds);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The values of "<what> max abs difference: <x>" in the output, one per rank line.
std::vector<double> differences(const std::string& text, const std::string& what) {
  std::vector<double> found;
  const std::regex line(what + " max abs difference: ([-+0-9.eE]+|nan|inf)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) {
    found.push_back(std::stod((*it)[1]));
  }
  return found;
}

void expect_every_rank_within(const Output& o, const std::string& what, int ranks) {
  const std::vector<double> diffs = differences(o.text, what);
  ASSERT_EQ(diffs.size(), size_t(ranks)) << "one line per rank expected:\n" << o.text;
  for (double d : diffs) {
    EXPECT_GE(d, 0.0) << o.text;
    EXPECT_LE(d, 1e-5) << o.text;
  }
}

TEST(Examples, PipelineSendRecvTwoRanks) {
  const std::string bin = env("TANDEM_BIN"), example = env("TANDEM_EXAMPLE_PIPELINE");
  if (bin.empty() || example.empty())
    GTEST_SKIP() << "TANDEM_BIN or TANDEM_EXAMPLE_PIPELINE is not set (run under ctest)";
  const Output o = launch(2, example);
  ASSERT_EQ(o.status, 0) << o.text;
  expect_every_rank_within(o, "pipeline", 2);
  // Training did something: the last step's loss is below the first's.
  std::smatch loss;
  ASSERT_TRUE(std::regex_search(o.text, loss, std::regex("loss: step 0 ([0-9.]+), step [0-9]+ ([0-9.]+)"))) << o.text;
  EXPECT_LT(std::stod(loss[2]), std::stod(loss[1])) << o.text;
}

TEST(Examples, PipelineSendRecvRefusesThreeRanks) {
  const std::string bin = env("TANDEM_BIN"), example = env("TANDEM_EXAMPLE_PIPELINE");
  if (bin.empty() || example.empty())
    GTEST_SKIP() << "TANDEM_BIN or TANDEM_EXAMPLE_PIPELINE is not set (run under ctest)";
  const Output o = launch(3, example);
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("needs exactly 2 ranks"), std::string::npos) << o.text;
}

TEST(Examples, MoeAlltoallvTwoAndThreeRanks) {
  const std::string bin = env("TANDEM_BIN"), example = env("TANDEM_EXAMPLE_MOE");
  if (bin.empty() || example.empty()) GTEST_SKIP() << "TANDEM_BIN or TANDEM_EXAMPLE_MOE is not set (run under ctest)";
  for (int ranks : {2, 3}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    const Output o = launch(ranks, example);
    ASSERT_EQ(o.status, 0) << o.text;
    expect_every_rank_within(o, "moe", ranks);
  }
}

// Four workers under --elastic 2:4; rank 2 and then rank 0 kill themselves
// (SIGKILL) mid-training. The launcher goes on, the survivors (ranks 1 and 3)
// shrink twice, redo the interrupted steps, and end with the same weights as
// one process running every step, bit-equal to each other.
TEST(Examples, ElasticTrainingLosesTwoWorkers) {
  const std::string bin = env("TANDEM_BIN"), example = env("TANDEM_EXAMPLE_ELASTIC");
  if (bin.empty() || example.empty())
    GTEST_SKIP() << "TANDEM_BIN or TANDEM_EXAMPLE_ELASTIC is not set (run under ctest)";
  const Output o = launch(4, example + " --kill 2:40 --kill 0:90", "--elastic 2:4");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(count(o.text, "the job goes on with"), 2) << o.text;
  EXPECT_EQ(count(o.text, "2 shrinks, 0 grows, weights equal to rank 0's"), 2) << o.text;
  const std::vector<double> diffs = differences(o.text, "reference");
  ASSERT_EQ(diffs.size(), 2u) << o.text;
  for (double d : diffs) EXPECT_LE(d, 1e-9) << o.text;
}

// Three workers; rank 1 stops itself (SIGSTOP) and is left out when the
// heartbeat names it. Ranks 0 and 2 finish; the launcher then stops rank 1,
// which could never finish, and the job succeeds. With a replacement allowed,
// it starts once the store records rank 1 failed.
TEST(Examples, ElasticTrainingLeavesAStoppedWorkerOut) {
  const std::string bin = env("TANDEM_BIN"), example = env("TANDEM_EXAMPLE_ELASTIC");
  if (bin.empty() || example.empty())
    GTEST_SKIP() << "TANDEM_BIN or TANDEM_EXAMPLE_ELASTIC is not set (run under ctest)";
  const Output o = launch(3, example + " --stop 1:30", "--elastic 2:3");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(count(o.text, "1 shrinks, 0 grows, weights equal to rank 0's"), 2) << o.text;
  EXPECT_EQ(count(o.text, "rank 1 was left out of the job"), 1) << o.text;

  // With --max-restarts, the silent worker's replacement starts as soon as
  // the store records it failed (not when it exits); it joins, and the three
  // end equal. The stopped one is still stopped at the end, as above.
  const Output r = launch(3, example + " --stop 1:30 --step-ms 20", "--elastic 2:3 --max-restarts 1");
  ASSERT_EQ(r.status, 0) << r.text;
  EXPECT_EQ(count(r.text, "rank 1 is recorded as failed but still runs (silent)"), 1) << r.text;
  EXPECT_EQ(count(r.text, "starting rank 3 on rank 1's slot to join the job"), 1) << r.text;
  EXPECT_EQ(count(r.text, "1 shrinks, 1 grows, weights equal to rank 0's"), 2) << r.text;
  EXPECT_EQ(count(r.text, "rank 3 (now 2 of 3): 128 steps, 0 shrinks, 0 grows, weights equal to rank 0's"), 1)
      << r.text;
}

// Four workers under --elastic 2:4 --max-restarts 2: rank 2 dies at step 40,
// the launcher starts process 4 on its slot, the survivors shrink and admit
// it (grow) with the weights; then process 4 dies at step 70 and process 5
// replaces it. Every worker ends at four ranks with rank 0's weights, equal
// to one process's.
TEST(Examples, ElasticTrainingReplacesLostWorkers) {
  const std::string bin = env("TANDEM_BIN"), example = env("TANDEM_EXAMPLE_ELASTIC");
  if (bin.empty() || example.empty())
    GTEST_SKIP() << "TANDEM_BIN or TANDEM_EXAMPLE_ELASTIC is not set (run under ctest)";
  const Output o = launch(4, example + " --kill 2:40 --kill 4:70", "--elastic 2:4 --max-restarts 2");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(count(o.text, "to join the job (restart"), 2) << o.text;
  EXPECT_EQ(count(o.text, "2 shrinks, 2 grows, weights equal to rank 0's"), 3) << o.text;
  EXPECT_EQ(count(o.text, "rank 5 (now 3 of 4): 128 steps, 0 shrinks, 0 grows, weights equal to rank 0's"), 1)
      << o.text;
  const std::vector<double> diffs = differences(o.text, "reference");
  ASSERT_EQ(diffs.size(), 4u) << o.text;
  for (double d : diffs) EXPECT_LE(d, 1e-9) << o.text;
}

// Two workers under --elastic 2:4 and a discovery script that offers four
// slots here: the launcher starts processes 2 and 3 with TANDEM_JOIN=1, rank
// 0 sees them waiting (joiners_waiting, sent with the gradients), and the
// members admit both at the next step. All four end with equal weights.
// Without --elastic the script is refused; a script that fails is named and
// the job goes on with the workers it has.
TEST(Examples, ElasticTrainingGrowsOntoOfferedSlots) {
  const std::string bin = env("TANDEM_BIN"), example = env("TANDEM_EXAMPLE_ELASTIC");
  if (bin.empty() || example.empty())
    GTEST_SKIP() << "TANDEM_BIN or TANDEM_EXAMPLE_ELASTIC is not set (run under ctest)";
  const Output o =
      launch(2, example + " --grow-to 4 --step-ms 20", "--elastic 2:4 --host-discovery-script 'echo localhost:4'");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(count(o.text, "offered by --host-discovery-script, to join the job"), 2) << o.text;
  EXPECT_EQ(count(o.text, "of 4): 128 steps, 0 shrinks, "), 4) << o.text;
  EXPECT_EQ(count(o.text, "weights equal to rank 0's"), 4) << o.text;
  EXPECT_EQ(o.text.find("sizes its shared segment differently"), std::string::npos) << o.text;
  const std::vector<double> diffs = differences(o.text, "reference");
  ASSERT_EQ(diffs.size(), 4u) << o.text;
  for (double d : diffs) EXPECT_LE(d, 1e-9) << o.text;

  const Output failing = launch(2, example + " --step-ms 5", "--elastic 2:4 --host-discovery-script 'exit 3'");
  EXPECT_EQ(failing.status, 0) << failing.text;
  EXPECT_EQ(count(failing.text, "host discovery: 'exit 3' exited with 3; the hosts it offered before stand"), 1)
      << failing.text;
  const Output bad = run(bin + " launch -n 2 --host-discovery-script 'echo localhost:2' -- true", kLimitSeconds);
  EXPECT_EQ(bad.status, 2) << bad.text;
  EXPECT_NE(bad.text.find("--host-discovery-script adds workers to an elastic job"), std::string::npos) << bad.text;
  // Without -n or -H the script's first answer is the starting hosts.
  const Output started = run(bin +
                                 " launch --elastic 1:3 --host-discovery-script 'echo localhost:2' -- sh -c "
                                 "'echo up $TANDEM_RANK of $TANDEM_WORLD_SIZE'",
                             kLimitSeconds);
  EXPECT_EQ(started.status, 0) << started.text;
  EXPECT_EQ(count(started.text, " of 2"), 2) << started.text;
}

// A replacement that nobody admits (the program never grows) is stopped once
// the other workers finished, and the job succeeds; --max-restarts needs --elastic.
TEST(Examples, ElasticLauncherStopsAReplacementNeverAdmitted) {
  const std::string bin = env("TANDEM_BIN");
  if (bin.empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const std::string program =
      "sh -c 'if [ \"$TANDEM_JOIN\" = 1 ]; then exec sleep 60; fi; if [ $TANDEM_RANK = 1 ]; then kill -9 $$; fi; "
      "sleep 1'";
  const Output o = run(bin + " launch -n 2 --elastic 1:2 --max-restarts 1 -- " + program, 30);
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("starting rank 2 on rank 1's slot"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("rank 2, a replacement, was not admitted before the others finished; stopping it"),
            std::string::npos)
      << o.text;
  const Output bad = run(bin + " launch -n 2 --max-restarts 1 -- true", kLimitSeconds);
  EXPECT_EQ(bad.status, 2) << bad.text;
  EXPECT_NE(bad.text.find("--max-restarts replaces lost workers of an elastic job"), std::string::npos) << bad.text;
}

TEST(Examples, ElasticRefusesAStartOutsideItsBounds) {
  const std::string bin = env("TANDEM_BIN");
  if (bin.empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const Output o = run(bin + " launch -n 5 --elastic 2:4 -- true", kLimitSeconds);
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_NE(o.text.find("-n 5 is outside --elastic 2:4"), std::string::npos) << o.text;
  const Output bad = run(bin + " launch --elastic 3:2 -- true", kLimitSeconds);
  EXPECT_EQ(bad.status, 2) << bad.text;
  EXPECT_NE(bad.text.find("--elastic takes MIN:MAX workers"), std::string::npos) << bad.text;
}

}  // namespace
