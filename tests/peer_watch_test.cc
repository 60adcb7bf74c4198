// Liveness over a store that does not watch ranks (peer_watch.h): each rank
// beats and watches its ring successor. First the watch itself on a made-up
// clock (exact bounds), then three communicators in threads bootstrapping
// through an in-memory store (no tandem store anywhere).
#include "liveness/peer_watch.h"

#include <gtest/gtest.h>

#include <thread>

#include "memory_store.h"
#include "tandem/ring/ring.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
constexpr auto kHeartbeat = 1000ms;

struct World {
  MemoryStore store;
  std::vector<PeerWatch> watches;
  Clock::time_point now = Clock::now();
  explicit World(int n) {
    for (int r = 0; r < n; ++r) watches.emplace_back(store, "pg", r, n, kHeartbeat);
  }
  // One step of every rank not in `stopped`; time moves on by a step.
  void step(const std::vector<int>& stopped = {}) {
    for (int r = 0; r < int(watches.size()); ++r) {
      if (std::find(stopped.begin(), stopped.end(), r) == stopped.end()) watches[size_t(r)].step(now, now + 1s);
    }
    now += watches[0].step_interval();
  }
  std::optional<std::string> failed() { return store.try_get(kFailedRanksKey, now + 1s); }
};

TEST(PeerWatch, EachRankWatchesItsSuccessor) {
  World w(3);
  EXPECT_EQ(w.watches[0].watched(), 1);
  EXPECT_EQ(w.watches[2].watched(), 0);
  EXPECT_EQ(w.watches[0].step_interval(), kHeartbeat / 4);
  EXPECT_EQ(PeerWatch(w.store, "x", 0, 1, kHeartbeat).watched(), -1);  // a world of one watches nobody
}

TEST(PeerWatch, BeatingRanksAreNeverRecorded) {
  World w(3);
  for (int i = 0; i < 200; ++i) w.step();  // 50 heartbeats
  EXPECT_FALSE(w.failed());
  EXPECT_EQ(w.store.try_get("pg/beat/1", w.now), "100");  // a beat every second step
}

TEST(PeerWatch, ASilentRankIsRecordedByItsWatcherWithinTwoAndAHalfHeartbeats) {
  World w(3);
  for (int i = 0; i < 8; ++i) w.step();
  const auto stopped_at = w.now;
  int steps = 0;
  while (!w.failed() && steps < 100) {
    w.step({1});
    ++steps;
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(w.now - stopped_at);
  ASSERT_EQ(w.failed(), "1");
  EXPECT_LE(took, kSilentHeartbeats * kHeartbeat + kHeartbeat / 2) << took.count() << " ms";
  EXPECT_GT(took, kSilentHeartbeats * kHeartbeat) << took.count() << " ms";
  const auto reason = w.store.try_get(failure_reason_key(1), w.now);
  ASSERT_TRUE(reason);
  EXPECT_NE(reason->find("no heartbeat for 2."), std::string::npos) << *reason;
  EXPECT_NE(reason->find("rank 0 watches it"), std::string::npos) << *reason;
  for (int i = 0; i < 40; ++i) w.step({1});  // reported once; nobody else is
  EXPECT_EQ(w.failed(), "1");
}

TEST(PeerWatch, TwoSilentRanksAreBothListedInOrder) {
  World w(4);
  for (int i = 0; i < 8; ++i) w.step();
  for (int i = 0; i < 4; ++i) w.step({3});  // 3 stops first, 1 a heartbeat later
  for (int i = 0; i < 40; ++i) w.step({1, 3});
  EXPECT_EQ(w.failed(), "3,1");
}

TEST(PeerWatch, ARankThatLeftIsNotRecorded) {
  World w(3);
  for (int i = 0; i < 8; ++i) w.step();
  w.watches[1].leave(w.now);
  for (int i = 0; i < 40; ++i) w.step({1});
  EXPECT_FALSE(w.failed());
  EXPECT_EQ(w.watches[0].watched(), -1);
}

// Three communicators (threads of this process, UCX and shared memory
// between them) bootstrap through one in-memory store with heartbeats on:
// closed-form all-reduces, no failure recorded, every rank's beat moved.
TEST(ForeignStore, CommunicatorsBootstrapThroughAHandedInStore) {
  constexpr int n = 3;
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::string> errors(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      try {
        CommOptions o;
        o.rank = r, o.size = n, o.local_rank = r, o.local_size = n;
        o.store = store;  // and no store_address
        o.heartbeat = 200ms;
        o.connect_timeout = 60s;
        o.timeout = 60s;
        o.ucx_net_devices = "lo";
        o.flight_entries = 0;
        auto comm = ring::connect(o, {});
        for (size_t count : {size_t(1), size_t(1000), size_t(1) << 20}) {
          std::vector<float> x(count, float(r + 1));
          comm->allreduce(x.data(), count, DataType::f32, ReduceOp::sum);
          for (float v : x) {
            if (v != float(n * (n + 1) / 2)) throw Error("allreduce gave " + std::to_string(v));
          }
        }
        std::this_thread::sleep_for(600ms);  // three heartbeats: nobody may be recorded
        comm->barrier();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
  const Deadline d = Clock::now() + 1s;
  EXPECT_FALSE(store->try_get(kFailedRanksKey, d));
  for (int r = 0; r < n; ++r) {
    EXPECT_GE(std::stoll(store->try_get("tandem/beat/" + std::to_string(r), d).value_or("0")), 3) << r;
    EXPECT_TRUE(store->check({"tandem/gone/" + std::to_string(r)}, d)) << r;
  }
  EXPECT_TRUE(store->check({"tandem/version/verdict"}, d));
}

}  // namespace
}  // namespace tandem::testing
