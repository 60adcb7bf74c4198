// A network partition must not make two jobs. Five ranks on two "hosts"
// (network namespaces on one LAN, UCX over TCP); node-a hosts the store. At
// step 30 rank 4 takes node-b's link down. The side with the store and a
// majority of the five names the silent ranks within the heartbeat bound,
// shrinks and finishes every step with the right sums; the other side stops
// with an error. A majority cut off from the store stops as well.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "netns.h"

namespace {

using tandem::testing::NetnsLab;

// Runs five ranks, the first `on_a` on node-a (rank 0, the store's host,
// among them), the rest on node-b; rank 4 takes node-b's link down at step 30.
std::vector<NetnsLab::Rank> run_partition(int on_a) {
  const std::string rank_bin = std::getenv("TANDEM_PARTITION_RANK");
  NetnsLab lab({"node-a", "node-b"});
  lab.add_lan("lan", "10.73.1", {"eth0", "eth0"});
  lab.wait_up("eth0");
  std::vector<int> host_of;
  std::vector<std::string> env, commands;
  for (int r = 0; r < 5; ++r) {
    const bool a = r < on_a;
    host_of.push_back(a ? 0 : 1);
    env.push_back("TANDEM_RANK=" + std::to_string(r) + " TANDEM_WORLD_SIZE=5 TANDEM_LOCAL_RANK=" +
                  std::to_string(a ? r : r - on_a) + " TANDEM_LOCAL_WORLD_SIZE=" + std::to_string(a ? on_a : 5 - on_a) +
                  " TANDEM_STORE_ADDR=10.73.1.1:29731 TANDEM_HOST_STORE=1 TANDEM_SECRET=" + std::string(64, 'p') +
                  " TANDEM_HEARTBEAT_MS=500 TANDEM_TIMEOUT_MS=8000 TANDEM_CONNECT_TIMEOUT_MS=4000 UCX_TLS=tcp,self");
    commands.push_back(rank_bin + " 100 4 30 eth0");
  }
  return lab.run_ranks(host_of, env, commands, std::chrono::seconds(60));
}

void expect_stopped(const NetnsLab::Rank& rank, int r) {
  SCOPED_TRACE("rank " + std::to_string(r) + ": " + rank.output);
  EXPECT_EQ(rank.code, 3);
  EXPECT_NE(rank.output.find("stopped: "), std::string::npos);
  EXPECT_EQ(rank.output.find("went on"), std::string::npos);
}

// node-a: ranks 0-2 and the store, a majority: it goes on; node-b stops.
TEST(Partition, OnlyTheMajoritySideGoesOn) {
  const std::string why = tandem::testing::netns_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  if (!std::getenv("TANDEM_PARTITION_RANK")) GTEST_SKIP() << "TANDEM_PARTITION_RANK is not set (run under ctest)";
  const std::vector<NetnsLab::Rank> ranks = run_partition(3);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " (node-a): " + ranks[size_t(r)].output);
    EXPECT_EQ(ranks[size_t(r)].code, 0);
    EXPECT_NE(ranks[size_t(r)].output.find("went on: members 0,1,2 of 5"), std::string::npos);
    EXPECT_NE(ranks[size_t(r)].output.find("done: 100 steps, last sum 6 right"), std::string::npos);
  }
  for (int r = 3; r < 5; ++r) expect_stopped(ranks[size_t(r)], r);
}

// node-a: ranks 0-1 and the store, a minority; node-b: ranks 2-4, a majority
// that cannot reach the store. Neither side goes on: no two jobs, and no job
// without the store (the limit docs/api.md states).
TEST(Partition, AMajorityWithoutTheStoreStopsToo) {
  const std::string why = tandem::testing::netns_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  if (!std::getenv("TANDEM_PARTITION_RANK")) GTEST_SKIP() << "TANDEM_PARTITION_RANK is not set (run under ctest)";
  const std::vector<NetnsLab::Rank> ranks = run_partition(2);
  for (int r = 0; r < 5; ++r) expect_stopped(ranks[size_t(r)], r);
}

}  // namespace
