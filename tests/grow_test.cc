// Growing: grow() admits processes created with CommOptions::join. A joiner
// takes the rank after the members' and receives their state by broadcast; a
// replacement restores the size after a shrink, and its own death later is
// named at once (its connection to the job's store drops) and shrunk past; a
// grow with nobody waiting changes nothing; a joiner nobody admits times out
// saying why, and is not admitted later.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "multiprocess.h"
#include "tandem/tandem.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// The sum over ranks 0..n-1 of (rank + 1).
float triangle(int n) { return float(n * (n + 1) / 2); }

// Every rank's all-reduce of rank + 1 gives the sum over the communicator's size.
void expect_every_rank_summed(Communicator& comm) {
  float x = float(comm.rank() + 1);
  comm.allreduce(&x, 1, DataType::f32, ReduceOp::sum);
  EXPECT_EQ(x, triangle(comm.size())) << "rank " << comm.rank() << " of " << comm.size();
}

// Members call grow() until someone joins (they agree on each answer).
Communicator::Grown grow_until_joined(Communicator& comm, int max_new) {
  for (int attempt = 0; attempt < 2000; ++attempt) {
    Communicator::Grown g = comm.grow(max_new);
    if (g.comm) return g;
    std::this_thread::sleep_for(5ms);
  }
  ADD_FAILURE() << "rank " << comm.rank() << ": nobody joined in 10 s";
  return {};
}

// Three members and one joiner (process 3 of the group), on both paths: the
// joiner gets rank 3, the members keep theirs, every rank sees the sum of
// four, and rank 0's state reaches the joiner by broadcast.
TEST(Grow, AJoinerTakesTheNextRankAndGetsTheMembersState) {
  for (bool shared : {true, false}) {
    SCOPED_TRACE(shared ? "shared memory" : "UCX");
    ring::RingOptions ring_options;
    ring_options.shared_memory = shared;
    RankGroup group(4, [&](CommOptions o) {
      std::unique_ptr<Communicator> comm;
      if (o.rank == 3) {
        o.join = true;
        comm = ring::connect(o, ring_options);
        EXPECT_TRUE(comm->joined());
      } else {
        o.size = 3;
        auto members = ring::connect(o, ring_options);
        float x = float(members->rank() + 1);
        members->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(x, triangle(3));
        Communicator::Grown g = grow_until_joined(*members, 4);
        EXPECT_EQ(g.joined, 1);
        comm = std::move(g.comm);
        EXPECT_FALSE(comm->joined());
        EXPECT_EQ(comm->rank(), o.rank);
        // The old communicator stays valid.
        float y = 1;
        members->allreduce(&y, 1, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(y, 3.0f);
      }
      EXPECT_EQ(comm->size(), 4);
      expect_every_rank_summed(*comm);
      std::vector<double> state(1000, comm->rank() == 0 ? 0.25 : -1.0);
      comm->broadcast(state.data(), state.data(), state.size(), DataType::f64, 0);
      EXPECT_EQ(state, std::vector<double>(1000, 0.25));
      return 0;
    });
    group.expect_success(60s);
  }
}

// joiners_waiting() sees a waiting joiner on the rank that asks, without a
// collective; the members share the answer and grow once, after which
// nobody waits.
TEST(Grow, JoinersWaitingCountsTheTicketsNoGrowClaimed) {
  RankGroup group(3, [&](CommOptions o) {
    std::unique_ptr<Communicator> comm;
    if (o.rank == 2) {
      o.join = true;
      comm = ring::connect(o, {});
    } else {
      o.size = 2;
      auto members = ring::connect(o, {});
      int waiting = 0;
      for (int polls = 0; members->rank() == 0 && waiting == 0 && polls < 2000; ++polls) {
        waiting = members->joiners_waiting();
        if (waiting == 0) std::this_thread::sleep_for(5ms);
      }
      members->broadcast(&waiting, 1, DataType::i32, 0);
      EXPECT_EQ(waiting, 1) << "rank " << members->rank();
      Communicator::Grown g = members->grow(4);
      EXPECT_EQ(g.joined, 1);
      EXPECT_EQ(members->joiners_waiting(), 0);
      comm = std::move(g.comm);
    }
    if (!comm) return 1;
    EXPECT_EQ(comm->size(), 3);
    expect_every_rank_summed(*comm);
    return 0;
  });
  group.expect_success(60s);
}

// Four members and a replacement waiting (process 4). Rank 2 dies; the
// survivors shrink to three and grow back to four with the replacement
// (rank 3, numbered 4 in the job). Then the replacement dies: the store names
// it when its connection drops, well before a heartbeat would, and the
// survivors shrink past it.
TEST(Grow, AReplacementRestoresTheSizeAfterAShrink) {
  CommOptions base;
  base.heartbeat = 10s;  // a failure named within a second came from the dropped connection
  RankGroup group(
      5,
      [&](CommOptions o) {
        std::unique_ptr<Communicator> comm;
        if (o.rank == 4) {
          o.join = true;
          comm = ring::connect(o, {});
          EXPECT_EQ(comm->rank(), 3);
        } else {
          o.size = 4;
          auto first = ring::connect(o, {});
          float x = 1;
          if (first->rank() == 2) kill(getpid(), SIGKILL);
          try {
            first->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
            ADD_FAILURE() << "an all-reduce without rank 2 returned";
          } catch (const PeerFailure&) {
          }
          Communicator::Shrunk shrunk = first->shrink();
          EXPECT_EQ(shrunk.members, (std::vector<int>{0, 1, 3}));
          Communicator::Grown g = grow_until_joined(*shrunk.comm, 1);
          comm = std::move(g.comm);
        }
        EXPECT_EQ(comm->size(), 4);
        expect_every_rank_summed(*comm);
        if (comm->rank() == 3) kill(getpid(), SIGKILL);
        const auto start = Clock::now();
        try {
          float x = 1;
          comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
          ADD_FAILURE() << "an all-reduce without the replacement returned";
        } catch (const PeerFailure& e) {
          EXPECT_EQ(e.rank(), 3) << e.what();
          EXPECT_LT(Clock::now() - start, 2s) << e.what();
        }
        Communicator::Shrunk again = comm->shrink();
        EXPECT_EQ(again.members, (std::vector<int>{0, 1, 2}));
        float y = 1;
        again.comm->allreduce(&y, 1, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(y, 3.0f);
        return 0;
      },
      base);
  const std::vector<int> codes = group.wait(90s);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 128 + SIGKILL, 0, 128 + SIGKILL}));
}

// A job of one rank (no store of its own until then) grows to two.
TEST(Grow, AOneRankJobGrowsToTwo) {
  RankGroup group(2, [](CommOptions o) {
    std::unique_ptr<Communicator> comm;
    if (o.rank == 1) {
      o.join = true;
      comm = ring::connect(o, {});
    } else {
      o.size = 1;
      auto alone = ring::connect(o, {});
      comm = grow_until_joined(*alone, 1).comm;
    }
    EXPECT_EQ(comm->size(), 2);
    expect_every_rank_summed(*comm);
    return 0;
  });
  group.expect_success(60s);
}

// A joiner that gave up (its connect timeout) withdrew its ticket: a later
// grow admits only the joiner still waiting.
TEST(Grow, AJoinerThatGaveUpIsNotAdmitted) {
  RankGroup group(3, [](CommOptions o) {
    if (o.rank == 1) {
      o.join = true;
      o.connect_timeout = 300ms;
      EXPECT_THROW(ring::connect(o, {}), Timeout);
      return 0;
    }
    std::unique_ptr<Communicator> comm;
    if (o.rank == 2) {
      std::this_thread::sleep_for(600ms);
      o.join = true;
      comm = ring::connect(o, {});
    } else {
      o.size = 1;
      auto alone = ring::connect(o, {});
      std::this_thread::sleep_for(1s);
      Communicator::Grown g = grow_until_joined(*alone, 4);
      EXPECT_EQ(g.joined, 1);
      comm = std::move(g.comm);
    }
    EXPECT_EQ(comm->size(), 2);
    expect_every_rank_summed(*comm);
    return 0;
  });
  group.expect_success(60s);
}

// With nobody waiting, grow() returns no communicator, on every member, every time.
TEST(Grow, WithNobodyWaitingNothingChanges) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    for (int i = 0; i < 20; ++i) {
      Communicator::Grown g = comm->grow();
      EXPECT_EQ(g.comm, nullptr);
      EXPECT_EQ(g.joined, 0);
    }
    float x = 1;
    comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
    EXPECT_EQ(x, 3.0f);
    return 0;
  });
  group.expect_success(60s);
}

// A joiner that no member admits fails at its connect timeout, saying where joiners are admitted.
TEST(Grow, AJoinerNobodyAdmitsTimesOutSayingWhy) {
  CommOptions base;
  base.connect_timeout = 500ms;
  RankGroup group(
      1,
      [](CommOptions o) {
        o.join = true;
        try {
          ring::connect(o, {});
          ADD_FAILURE() << "join returned with no members";
        } catch (const Timeout& e) {
          EXPECT_NE(std::string(e.what()).find("no member called grow()"), std::string::npos) << e.what();
        }
        return 0;
      },
      base);
  group.expect_success(30s);
}

}  // namespace
}  // namespace tandem::testing
