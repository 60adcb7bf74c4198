// Membership: revoke() stops a call on every rank, whether the rank waits on
// the one that revoked, on a rank that is gone, or has not called yet;
// shrink() gives the survivors of a failure one communicator over them, fences
// a stopped rank that wakes, and stops a minority.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "multiprocess.h"
#include "tandem/tandem.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// Runs `body` on `ranks` ranks through shared memory, then over UCX, after
// an all-reduce that checks every rank met.
void on_both_paths(int ranks, const std::function<int(std::unique_ptr<Communicator>&)>& body) {
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared memory" : "UCX");
    ring::RingOptions ring_options;
    ring_options.shared_memory = shared;
    RankGroup group(ranks, [&](const CommOptions& o) {
      auto comm = ring::connect(o, ring_options);
      float x = 1;
      comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
      EXPECT_EQ(x, float(ranks));
      return body(comm);
    });
    group.expect_success(60s);
  }
}

// Expects `call` to throw Revoked naming rank 0's reason; returns when it did.
template <typename Call>
Clock::time_point expect_revoked(Call&& call, const char* what) {
  try {
    call();
    ADD_FAILURE() << what << " returned after revoke()";
  } catch (const Revoked& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 revoked the communicator: lost rank 3"), std::string::npos)
        << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << e.what();
  }
  return Clock::now();
}

// Four ranks; rank 3 stops taking part (as a hung rank would). Ranks 1 and 2
// wait in an all-reduce rank 3 never joins, rank 2 first in a receive from
// rank 3; rank 0 revokes 300 ms after the ranks last met. Every waiting call
// ends with Revoked within a second of it (a failure poll, 200 ms, plus the
// store's round trip), later calls at once, and rank 3's late call too.
TEST(Revoke, EveryRanksPendingCallFailsWithRevoked) {
  on_both_paths(4, [](std::unique_ptr<Communicator>& comm) {
    float x = 1;
    const auto met = Clock::now();
    const auto revoke_at = met + 300ms;
    if (comm->rank() == 3) {
      std::this_thread::sleep_until(revoke_at + 1500ms);
      expect_revoked([&] { comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum); }, "rank 3's late all-reduce");
      EXPECT_TRUE(comm->aborted());
      return 0;
    }
    std::thread revoker;
    if (comm->rank() == 0) {
      revoker = std::thread([&] {
        std::this_thread::sleep_until(revoke_at);
        comm->revoke("lost rank 3");
      });
    }
    if (comm->rank() == 2) {
      float y = 0;
      const auto t = expect_revoked([&] { comm->recv(&y, 1, DataType::f32, 3, /*tag=*/7); }, "recv from rank 3");
      EXPECT_LT(t - revoke_at, 1s);
    }
    const auto t = expect_revoked([&] { comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum); }, "all-reduce");
    EXPECT_LT(t - revoke_at, 1s);
    fprintf(stderr, "rank %d: unblocked %.3f s after the revoke\n", comm->rank(),
            std::chrono::duration<double>(t - revoke_at).count());
    if (revoker.joinable()) revoker.join();
    // Sticky, and typed for every call: later ones fail at once.
    const auto later = Clock::now();
    expect_revoked([&] { comm->broadcast(&x, 1, DataType::f32, 0); }, "a later broadcast");
    expect_revoked([&] { comm->send(&x, 1, DataType::f32, (comm->rank() + 1) % 3, 1); }, "a later send");
    EXPECT_LT(Clock::now() - later, 100ms);
    EXPECT_TRUE(comm->aborted());
    EXPECT_TRUE(comm->revoked());
    return 0;
  });
}

// A communicator made by split() has its own revocation: revoking it leaves
// its parent working.
TEST(Revoke, ASplitCommunicatorIsRevokedAlone) {
  RankGroup group(2, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    auto part = comm->split(0, comm->rank());
    float x = 1;
    part->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
    EXPECT_EQ(x, 2.0f);
    if (comm->rank() == 0) part->revoke("lost rank 3");
    try {
      part->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
      ADD_FAILURE() << "the revoked communicator's all-reduce returned";
    } catch (const Revoked&) {
    }
    x = float(comm->rank() + 1);
    comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
    EXPECT_EQ(x, 3.0f);
    EXPECT_FALSE(comm->aborted());
    return 0;
  });
  group.expect_success(60s);
}

// Runs an all-reduce that a failure interrupts; true if it failed (as it must).
bool interrupted(Communicator& comm) {
  float x = 1;
  try {
    comm.allreduce(&x, 1, DataType::f32, ReduceOp::sum);
  } catch (const Error& e) {
    fprintf(stderr, "rank %d: interrupted: %s\n", comm.rank(), e.what());
    return true;
  }
  return false;
}

// Every rank's process id, for the tests that stop one.
std::vector<int64_t> pids_of(Communicator& comm) {
  std::vector<int64_t> pids(size_t(comm.size()));
  const int64_t mine = getpid();
  comm.allgather(&mine, pids.data(), 1, DataType::i64);
  return pids;
}

// Three ranks with a short heartbeat. Rank 0 stops rank 2 (SIGSTOP); ranks 0
// and 1 name it, shrink past it, wake it, and go on with a correct sum, while
// rank 2, once woken, runs `woken` on its old communicator.
void stop_rank_2_and_wake_it(const ring::RingOptions& ring_options, const std::function<void(Communicator&)>& woken) {
  CommOptions base;
  base.heartbeat = 400ms;
  RankGroup group(
      3,
      [&](const CommOptions& o) {
        auto comm = ring::connect(o, ring_options);
        const std::vector<int64_t> pids = pids_of(*comm);
        if (comm->rank() == 2) {
          std::this_thread::sleep_for(1500ms);  // stopped in here, woken after the shrink
          woken(*comm);
          return 0;
        }
        if (comm->rank() == 0) kill(pid_t(pids[2]), SIGSTOP);
        EXPECT_TRUE(interrupted(*comm));
        auto shrunk = comm->shrink();
        EXPECT_EQ(shrunk.members, (std::vector<int>{0, 1}));
        if (comm->rank() == 0) kill(pid_t(pids[2]), SIGCONT);
        float x = float(comm->rank() + 1);
        shrunk.comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(x, 3.0f);
        return 0;
      },
      base);
  group.expect_success(60s);
}

// Four ranks; rank 2 dies (its process exits without a word) while the others
// wait on it. They shrink to a communicator of three, renumbered in the old
// order, whose all-reduce sums the survivors' values; the shrink itself takes
// well under a second.
TEST(Shrink, SurvivorsOfADeadRankGoOnWithoutIt) {
  on_both_paths(4, [](std::unique_ptr<Communicator>& comm) {
    if (comm->rank() == 2) _exit(0);
    EXPECT_TRUE(interrupted(*comm));
    const auto start = Clock::now();
    auto shrunk = comm->shrink();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    fprintf(stderr, "rank %d: shrink took %.3f s\n", comm->rank(), seconds);
    EXPECT_LT(seconds, 2.0);
    EXPECT_EQ(shrunk.members, (std::vector<int>{0, 1, 3}));
    EXPECT_EQ(shrunk.comm->size(), 3);
    EXPECT_EQ(shrunk.comm->rank(), comm->rank() == 3 ? 2 : comm->rank());
    std::vector<float> v(1000, float(comm->rank() + 1));
    shrunk.comm->allreduce(v.data(), v.size(), DataType::f32, ReduceOp::sum);
    EXPECT_EQ(v[0], 1.0f + 2.0f + 4.0f);
    EXPECT_EQ(v[999], 7.0f);
    return 0;
  });
}

// Three ranks with a short heartbeat; rank 0 stops rank 2 (SIGSTOP). Ranks 0
// and 1 name it, shrink to two, and rank 0 wakes it: its call on the old
// communicator fails, and its shrink() fails with Excluded, while the two go on.
TEST(Shrink, AStoppedRankThatWakesIsFenced) {
  stop_rank_2_and_wake_it({}, [](Communicator& comm) {
    // Its first call may complete with what the others left in it before
    // they gave up on it; the next one fails.
    EXPECT_TRUE(interrupted(comm) || interrupted(comm));
    try {
      comm.shrink();
      ADD_FAILURE() << "the woken rank's shrink() returned";
    } catch (const Excluded& e) {
      EXPECT_NE(std::string(e.what()).find("rank 2 was left out of shrink #1 (members 0,1 of 3)"), std::string::npos)
          << e.what();
    }
  });
}

// As above, but the woken rank's calls only send (a send, a broadcast's root): they never
// wait, so no failure poll would stop them, and they completed on the old
// communicator as if nothing happened. The first call after the wake fails,
// through shared memory and over UCX.
TEST(Shrink, AWokenRanksCallsThatOnlySendFail) {
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared memory" : "UCX");
    ring::RingOptions ring_options;
    ring_options.shared_memory = shared;
    stop_rank_2_and_wake_it(ring_options, [](Communicator& comm) {
      float x = 2;
      int returned = 0;
      try {
        comm.send(&x, 1, DataType::f32, /*peer=*/0, /*tag=*/5);
        ++returned;
        comm.broadcast(&x, 1, DataType::f32, /*root=*/2);
        ++returned;
      } catch (const Error& e) {
        fprintf(stderr, "rank 2 (woken): %s\n", e.what());
      }
      EXPECT_EQ(returned, 0) << "calls that returned after the wake (a send, a broadcast from rank 2)";
      EXPECT_THROW(comm.shrink(), Excluded);
    });
  }
}

// The deciding rank is stopped before it decides. Rank 1 calls shrink()
// first (so it decides) and waits for rank 3, which comes 2 s later; rank 2
// stops rank 1 at 0.5 s. When the heartbeat records rank 1 as failed, ranks 0
// and 2 choose a new decider, which waits for rank 3 and decides 0, 2, 3.
// Woken afterwards, rank 1 finds its writes refused and gets Excluded.
TEST(Shrink, AStoppedDeciderIsReplaced) {
  CommOptions base;
  base.heartbeat = 400ms;
  RankGroup group(
      4,
      [](const CommOptions& o) {
        auto comm = ring::connect(o, {});
        std::vector<int64_t> pids(4);
        const int64_t pid = getpid();
        comm->allgather(&pid, pids.data(), 1, DataType::i64);
        const auto met = Clock::now();
        const int r = comm->rank();
        if (r == 1) {
          try {
            comm->shrink();
            ADD_FAILURE() << "the stopped decider's shrink() returned";
          } catch (const Excluded& e) {
            EXPECT_NE(std::string(e.what()).find("rank 1 was left out of shrink #1 (members 0,2,3 of 4)"),
                      std::string::npos)
                << e.what();
          }
          return 0;
        }
        if (r == 2) {
          std::this_thread::sleep_until(met + 500ms);
          kill(pid_t(pids[1]), SIGSTOP);
        }
        std::this_thread::sleep_until(met + (r == 3 ? 2000ms : 600ms));
        auto shrunk = comm->shrink();
        EXPECT_EQ(shrunk.members, (std::vector<int>{0, 2, 3}));
        float x = float(r + 1);
        shrunk.comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(x, 1.0f + 3.0f + 4.0f);
        if (r == 0) kill(pid_t(pids[1]), SIGCONT);
        return 0;
      },
      base);
  group.expect_success(60s);
}

// A rank that is alive (it beats) but never calls shrink() is not recorded
// failed: the others' shrink() goes on without it within their timeout,
// instead of failing with Timeout, and the late rank is left out.
TEST(Shrink, GoesOnWithoutASilentLiveRankWithinItsTimeout) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    float x = 1;
    comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
    if (comm->rank() == 2) {
      std::this_thread::sleep_for(3s);
      EXPECT_THROW(comm->shrink(), Excluded);
      return 0;
    }
    CollectiveOptions within;
    within.timeout = 1s;
    const auto start = Clock::now();
    auto shrunk = comm->shrink({}, within);
    EXPECT_LT(Clock::now() - start, 1s);
    EXPECT_EQ(shrunk.members, (std::vector<int>{0, 1}));
    x = float(comm->rank() + 1);
    shrunk.comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
    EXPECT_EQ(x, 3.0f);
    return 0;
  });
  group.expect_success(60s);
}

// Four ranks, two die: the two left are no majority, so both stop with
// Excluded saying so (the other two could be alive behind a partition).
TEST(Shrink, AMinorityStops) {
  RankGroup group(4, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    float x = 1;
    comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
    if (comm->rank() >= 2) _exit(0);
    EXPECT_TRUE(interrupted(*comm));
    try {
      comm->shrink();
      ADD_FAILURE() << "a minority's shrink() returned";
    } catch (const Excluded& e) {
      EXPECT_NE(std::string(e.what()).find("no majority: ranks 0,1 are 2 of 4"), std::string::npos) << e.what();
    }
    return 0;
  });
  group.expect_success(60s);
}

// Bad input: an excluded rank out of range.
TEST(Shrink, RefusesAnExcludedRankOutOfRange) {
  RankGroup group(1, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    try {
      comm->shrink({5});
      ADD_FAILURE() << "shrink({5}) returned";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("excluded rank 5 is out of range for world size 1"), std::string::npos);
    }
    auto alone = comm->shrink();
    EXPECT_EQ(alone.comm->size(), 1);
    EXPECT_EQ(alone.members, std::vector<int>{0});
    return 0;
  });
  group.expect_success(60s);
}

}  // namespace
}  // namespace tandem::testing
