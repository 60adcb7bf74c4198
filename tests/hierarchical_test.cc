// Hierarchical all-reduce across "hosts": network namespaces joined by a
// bridge, several rank processes per namespace. UCX_TLS=tcp,self keeps UCX's
// shared memory out, so data between hosts crosses the veth links; within a
// host the ranks map each other's segments (tandem counts the namespace as
// part of the host identity). Every rank runs tests/hierarchical_rank.cc with
// TANDEM_ALGO=hierarchical (every size takes it) or auto, and the test checks
// the closed forms and that every rank's result digest is the same.
//
// Quick tier: 2 hosts x 2 ranks (forced and auto). Full tier (DISABLED_,
// `ctest -L full`): 3 x 1, 2 x 3, and 2 x 2 with TANDEM_SHM=0 (phases 1 and 3
// over the UCX ring).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "memory_channel.h"
#include "netns.h"
#include "tandem/ring/ring.h"
#include "tandem/transport.h"

namespace {

using tandem::testing::NetnsLab;

constexpr auto kGuard = std::chrono::seconds(120);

std::string rank_bin() {
  const char* b = std::getenv("TANDEM_HIERARCHICAL_RANK");
  return b ? b : "hierarchical_rank";
}

struct Outcome {
  std::vector<NetnsLab::Rank> ranks;
  std::string topology_line(size_t i) const {
    std::istringstream in(ranks[i].output);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("topology ", 0) == 0) return line;
    }
    return "";
  }
  // case -> (wrong, digest) of process i.
  std::map<std::string, std::pair<std::string, std::string>> cases(size_t i) const {
    std::map<std::string, std::pair<std::string, std::string>> out;
    std::istringstream in(ranks[i].output);
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line);
      std::string tag, name, w, wrong, d, digest;
      if (words >> tag >> name >> w >> wrong >> d >> digest && tag == "case") out[name] = {wrong, digest};
    }
    return out;
  }
};

// `hosts` namespaces on one LAN (10.73.1.<h+1> on eth0), carrier up.
std::unique_ptr<NetnsLab> make_lab(int hosts) {
  std::vector<std::string> names;
  for (int h = 0; h < hosts; ++h) names.push_back("node-" + std::to_string(h));
  auto lab = std::make_unique<NetnsLab>(names);
  std::vector<std::string> itf(size_t(hosts), "eth0");
  lab->add_lan("l", "10.73.1", itf);
  lab->wait_up("eth0");
  return lab;
}

// Runs `per_host` ranks on each of `hosts` namespaces, host-major (rank = host * per_host + local).
Outcome run_hosts(int hosts, int per_host, const std::string& algorithm, int port, const std::string& extra) {
  const auto lab_owner = make_lab(hosts);
  NetnsLab& lab = *lab_owner;
  std::vector<int> host_of;
  std::vector<std::string> env, commands;
  const int n = hosts * per_host;
  for (int r = 0; r < n; ++r) {
    host_of.push_back(r / per_host);
    env.push_back("TANDEM_RANK=" + std::to_string(r) + " TANDEM_WORLD_SIZE=" + std::to_string(n) +
                  " TANDEM_LOCAL_RANK=" + std::to_string(r % per_host) + " TANDEM_LOCAL_WORLD_SIZE=" +
                  std::to_string(per_host) + " TANDEM_STORE_ADDR=10.73.1.1:" + std::to_string(port) +
                  " TANDEM_HOST_STORE=1 TANDEM_SECRET=" + std::string(64, 'h') +
                  " TANDEM_CONNECT_TIMEOUT_MS=30000 TANDEM_TIMEOUT_MS=60000 UCX_TLS=tcp,self"
                  " TANDEM_ALGO=" +
                  algorithm + " " + extra);
    commands.push_back(rank_bin());
  }
  return {lab.run_ranks(host_of, env, commands, kGuard)};
}

// Runs `tandem launch -H` in host 0's namespace; the launcher starts every
// rank through `ip netns exec` (its remote shell) in its host's namespace.
// Each rank's output is its "[rank] " lines; its code, the launcher's.
Outcome launch_hosts(int hosts, int per_host, const std::string& algorithm) {
  const auto lab_owner = make_lab(hosts);
  NetnsLab& lab = *lab_owner;
  std::string host_list;
  for (int h = 0; h < hosts; ++h) host_list += (h ? "," : "") + lab.ns(h) + ":" + std::to_string(per_host);
  const char* bin = std::getenv("TANDEM_BIN");
  const std::string launch = std::string(bin ? bin : "tandem") + " launch --timeout 100 -H " + host_list +
                             " --rsh \"ip netns exec {host} sh -c\" --store-addr 10.73.1.1 -- " + rank_bin();
  const auto run = lab.run_ranks(
      {0}, {"TANDEM_CONNECT_TIMEOUT_MS=30000 TANDEM_TIMEOUT_MS=60000 UCX_TLS=tcp,self TANDEM_ALGO=" + algorithm},
      {launch}, kGuard);
  Outcome o;
  o.ranks.resize(size_t(hosts * per_host));
  std::istringstream in(run[0].output);
  for (std::string line; std::getline(in, line);) {
    int r = -1;
    if (std::sscanf(line.c_str(), "[%d] ", &r) == 1 && r >= 0 && size_t(r) < o.ranks.size())
      o.ranks[size_t(r)].output += line.substr(line.find("] ") + 2) + "\n";
  }
  for (auto& rank : o.ranks) {
    rank.code = run[0].code;
    rank.seconds = run[0].seconds;
  }
  if (run[0].code != 0) ADD_FAILURE() << "tandem launch:\n" << run[0].output;
  return o;
}

// shm: the ranks of a host map each other's segments (else phases 1 and 3 take the UCX ring).
void expect_hierarchical(const Outcome& o, int hosts, int per_host, bool shm) {
  const size_t n = o.ranks.size();
  ASSERT_EQ(n, size_t(hosts * per_host));
  const std::string topology =
      std::to_string(hosts) + " hosts x " + std::to_string(per_host) + (per_host == 1 ? " rank" : " ranks");
  std::printf("rank 0 (%.1f s):\n%s", o.ranks[0].seconds, o.ranks[0].output.c_str());
  const auto reference = o.cases(0);
  EXPECT_EQ(reference.size(), 6u) << o.ranks[0].output;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(o.ranks[i].code, 0) << "rank " << i << ":\n" << o.ranks[i].output;
    const std::string line = o.topology_line(i);
    EXPECT_NE(line.find("topology " + topology + " local " + std::to_string(i % size_t(per_host)) + "/" +
                        std::to_string(per_host)),
              std::string::npos)
        << line;
    EXPECT_EQ(line.find("shared memory within each host") != std::string::npos, shm && per_host > 1) << line;
    const auto mine = o.cases(i);
    EXPECT_EQ(mine.size(), reference.size()) << o.ranks[i].output;
    for (const auto& [name, result] : mine) {
      EXPECT_EQ(result.first, "0") << "rank " << i << " case " << name << ": wrong elements";
      EXPECT_EQ(result.second, reference.at(name).second)
          << "rank " << i << " case " << name << ": result differs from rank 0's bits";
    }
  }
}

// A MemoryChannel with a topology and per-host "segments": hosts as groups of threads.
class HostChannel final : public tandem::Channel, public tandem::SharedMemory {
 public:
  HostChannel(tandem::testing::MemoryChannel& inner, tandem::Topology topology, const tandem::SharedSegments* host)
      : inner_(inner), topology_(std::move(topology)), host_(host) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  tandem::Pending send(int peer, tandem::Tag tag, const void* data, size_t bytes) override {
    return inner_.send(peer, tag, data, bytes);
  }
  tandem::Pending recv(int peer, tandem::Tag tag, void* data, size_t bytes) override {
    return inner_.recv(peer, tag, data, bytes);
  }
  bool test(tandem::Pending& p) override { return inner_.test(p); }
  void wait(tandem::Pending& p) override { inner_.wait(p); }
  const tandem::Topology* topology() const override { return &topology_; }
  tandem::SharedMemory* shared_memory() override { return host_ ? this : nullptr; }
  const tandem::SharedSegments* host_segments() const override { return host_; }
  void count_traffic(uint64_t) override {}
  void idle(int peer, unsigned spins) override { inner_.idle(peer, spins); }
  void* scratch(size_t bytes, int slot) override { return inner_.scratch(bytes, slot); }

 private:
  tandem::testing::MemoryChannel& inner_;
  tandem::Topology topology_;
  const tandem::SharedSegments* host_;
};

// Hosts x ranks threads, host-major; each host's ranks share heap "segments"
// unless `shm` is off. f32 input of rank r at i: (r + 1) * (i % 7 + 1) + 0.1 * (i % 3),
// whose sum rounds differently in different orders: every rank must get the same bits,
// within 1e-3 of the closed form.
void thread_case(int hosts, int per_host, size_t count, tandem::ReduceOp op, bool shm, bool in_place) {
  using namespace tandem;
  const int n = hosts * per_host;
  ring::RingOptions o;
  o.segment_bytes = 4096;
  o.segments_in_flight = 2;
  o.allreduce = ring::AllreduceAlgorithm::hierarchical;
  o.small_message_bytes = 256;
  o.shm_chunk_bytes = 4096;
  auto algos = ring::algorithms(o);
  std::vector<std::unique_ptr<tandem::testing::HeapSegments>> segments;
  for (int h = 0; h < hosts; ++h)
    segments.push_back(std::make_unique<tandem::testing::HeapSegments>(per_host, algos->shared_bytes()));
  std::vector<std::string> ids;
  for (int r = 0; r < n; ++r) ids.push_back("host" + std::to_string(r / per_host));
  tandem::testing::Mailbox box;
  std::vector<std::vector<float>> in(static_cast<size_t>(n), std::vector<float>(count)), out = in;
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) in[size_t(r)][i] = float((r + 1) * int(i % 7 + 1)) + 0.1f * float(i % 3);
    threads.emplace_back([&, r] {
      try {
        tandem::testing::MemoryChannel inner(box, r, n);
        HostChannel ch(inner, make_topology(ids, r), shm ? segments[size_t(r / per_host)]->view() : nullptr);
        float* dst = in_place ? in[size_t(r)].data() : out[size_t(r)].data();
        algos->allreduce(ch, AllreduceArgs{in[size_t(r)].data(), dst, count, DataType::f32, op});
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto& result = in_place ? in : out;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
    ASSERT_EQ(std::memcmp(result[size_t(r)].data(), result[0].data(), count * sizeof(float)), 0)
        << "rank " << r << " differs bitwise from rank 0";
  }
  for (size_t i = 0; i < count; ++i) {
    const double k = double(i % 7 + 1), frac = 0.1 * double(i % 3);
    const double want = op == ReduceOp::max   ? k * n + frac
                        : op == ReduceOp::avg ? k * (n + 1) / 2.0 + frac
                                              : k * n * (n + 1) / 2.0 + n * frac;
    ASSERT_NEAR(result[0][i], want, 1e-3 * std::max(1.0, want)) << "element " << i;
  }
}

TEST(HierarchicalThreads, ExactAndIdenticalOnEveryRank) {
  for (auto [hosts, per_host] : {std::pair{2, 2}, {3, 1}, {2, 3}, {3, 2}}) {
    for (size_t count : {size_t(1), size_t(7), size_t(1001), size_t(65536 + 3)}) {
      for (auto op : {tandem::ReduceOp::sum, tandem::ReduceOp::avg, tandem::ReduceOp::max}) {
        for (bool shm : {true, false}) {
          SCOPED_TRACE(std::to_string(hosts) + "x" + std::to_string(per_host) + " count " + std::to_string(count) +
                       " op " + std::string(tandem::to_string(op)) + (shm ? " shm" : " ring"));
          ASSERT_NO_FATAL_FAILURE(thread_case(hosts, per_host, count, op, shm, (count == 7 || count == 65539) != shm));
        }
      }
    }
  }
}

TEST(HierarchicalThreads, UnevenHostsAreRefusedByName) {
  using namespace tandem;
  auto algos = ring::algorithms({4096, 2, ring::AllreduceAlgorithm::hierarchical});
  tandem::testing::Mailbox box;
  tandem::testing::MemoryChannel inner(box, 0, 3);
  HostChannel ch(inner, make_topology({"a", "a", "b"}, 0), nullptr);
  float x = 1;
  try {
    algos->allreduce(ch, AllreduceArgs{&x, &x, 1, DataType::f32, ReduceOp::sum});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("2 hosts (2, 1 ranks)"), std::string::npos) << e.what();
  }
}

class Hierarchical : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = tandem::testing::netns_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST(Topology, HostsAreNumberedByTheirLowestRank) {
  // Ranks 0, 2 on host "b", 1, 3, 4 on "a": a launcher that did not go host-major.
  const auto t = tandem::make_topology({"b", "a", "b", "a", "a"}, 3);
  EXPECT_EQ(t.hosts(), 2);
  EXPECT_EQ(t.host(), 1);
  EXPECT_EQ(t.local_rank(), 1);
  EXPECT_EQ(t.local_size(), 3);
  EXPECT_EQ(t.ranks[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(t.ranks[1], (std::vector<int>{1, 3, 4}));
  EXPECT_FALSE(t.uniform());
  EXPECT_EQ(t.str(), "2 hosts (2, 3 ranks)");
  const auto u = tandem::make_topology({"x", "x", "y", "y"}, 2);
  EXPECT_TRUE(u.uniform());
  EXPECT_EQ(u.str(), "2 hosts x 2 ranks");
  EXPECT_EQ(u.peers_with_local_rank(1), (std::vector<int>{1, 3}));
  EXPECT_THROW(tandem::make_topology({"x"}, 1), tandem::InvalidArgument);
}

void expect_hierarchical(int hosts, int per_host, const std::string& algorithm, int port, bool shm = true) {
  expect_hierarchical(run_hosts(hosts, per_host, algorithm, port, shm ? "" : "TANDEM_SHM=0"), hosts, per_host, shm);
}

TEST_F(Hierarchical, TwoHostsTimesTwoRanks) { expect_hierarchical(2, 2, "hierarchical", 29611); }
// auto picks hierarchical above 64 KiB here, recursive doubling below: the same checks hold.
// The ranks are started by `tandem launch -H` across the namespaces (host-major local ranks).
TEST_F(Hierarchical, TwoHostsTimesTwoRanksAutoUnderLaunch) {
  expect_hierarchical(launch_hosts(2, 2, "auto"), 2, 2, /*shm=*/true);
}
TEST_F(Hierarchical, DISABLED_ThreeHostsTimesOneRank) { expect_hierarchical(3, 1, "hierarchical", 29613); }
TEST_F(Hierarchical, DISABLED_TwoHostsTimesThreeRanks) { expect_hierarchical(2, 3, "hierarchical", 29614); }
TEST_F(Hierarchical, DISABLED_TwoHostsTimesTwoRanksWithoutSharedMemory) {
  expect_hierarchical(2, 2, "hierarchical", 29615, /*shm=*/false);
}

}  // namespace
