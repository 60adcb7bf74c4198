// The communicator's parts on their own, over an in-memory store: the call
// check (start-up versions, mismatches published and learned, a rank that
// left), liveness (which rank failed, and why, as the error names it) and
// the table of operations (what each call's buffers span).
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>

#include "comm_context.h"
#include "liveness/call_check.h"
#include "liveness/liveness.h"
#include "memory_store.h"
#include "tandem/call.h"
#include "tandem/errors.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

CommContext context(const std::shared_ptr<KeyValueStore>& store, int rank, int size, std::string job = "job") {
  CommOptions o;
  o.rank = rank;
  o.size = size;
  o.prefix = "pg";
  o.job_id = std::move(job);
  CommContext ctx(o);
  ctx.store = store;
  return ctx;
}

Task task_of(const Description& what, Deadline deadline = Clock::now() + 10s) {
  return Task{{}, std::make_shared<Request::State>(), 10s, deadline, what};
}

const Description kAllreduce{Collective::allreduce, 4, DataType::f32, ReduceOp::sum};

template <class E, class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(CallCheck, RanksOfOneBuildAndJobPassTheStartUpCheck) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 2), c1 = context(store, 1, 2);
  auto other = std::async(std::launch::async, [&] { CallCheck(c1).check_versions(Clock::now() + 5s); });
  EXPECT_NO_THROW(CallCheck(c0).check_versions(Clock::now() + 5s));
  EXPECT_NO_THROW(other.get());
}

TEST(CallCheck, RanksOfAnotherJobFailTheStartUpCheckOnEveryRankNamingBoth) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 2, "a"), c1 = context(store, 1, 2, "b");
  auto other = std::async(std::launch::async, [&] {
    return error_of<InvalidArgument>([&] { CallCheck(c1).check_versions(Clock::now() + 5s); });
  });
  const std::string seen = error_of<InvalidArgument>([&] { CallCheck(c0).check_versions(Clock::now() + 5s); });
  for (const std::string& e : {seen, other.get()}) {
    EXPECT_NE(e.find("ranks disagree at start-up"), std::string::npos) << e;
    EXPECT_NE(e.find("job a"), std::string::npos) << e;
    EXPECT_NE(e.find("job b"), std::string::npos) << e;
  }
}

TEST(CallCheck, AMismatchOneRankPublishesFailsTheOthersInThatCallAndTheFirstStays) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 3), c2 = context(store, 2, 3);
  CallCheck(c0).publish_mismatch("call #3: rank 0 runs allreduce, rank 1 runs broadcast");
  CallCheck(c0).publish_mismatch("a later finding");
  const std::string e =
      error_of<CollectiveMismatch>([&] { CallCheck(c2).check_calls_match(kAllreduce, 3, 1, Clock::now() + 1s); });
  EXPECT_NE(e.find("call #3: rank 0 runs allreduce, rank 1 runs broadcast (rank 2 learned it during"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("a later finding"), std::string::npos) << e;
  EXPECT_NE(error_of<CollectiveMismatch>([&] { CallCheck(c2).explain_mismatch(); }).find("learned it from the store"),
            std::string::npos);
}

TEST(CallCheck, ARankThatLeftAfterCallFourMakesCallFiveAMismatch) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 3);
  store->set("pg/left/4", "2", Clock::now() + 1s);
  const std::string e =
      error_of<CollectiveMismatch>([&] { CallCheck(c0).check_calls_match(kAllreduce, 5, 2, Clock::now() + 1s); });
  EXPECT_NE(e.find("rank 2 skipped call #5: it destroyed its communicator after call #4"), std::string::npos) << e;
  EXPECT_NO_THROW(CallCheck(c0).check_calls_match(kAllreduce, 4, 2, Clock::now() + 1s));
}

TEST(CallCheck, PointToPointLearnsOfAPeerThatGaveUp) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 2);
  store->set("pg/abandoned", "1", Clock::now() + 1s);
  const Description recv{Collective::send_recv, 8, DataType::f32, std::nullopt, 1, 7};
  try {
    CallCheck(c0).check_calls_match(recv, 0, 1, Clock::now() + 1s);
    ADD_FAILURE() << "nothing thrown";
  } catch (const PeerFailure& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_NE(std::string(e.what()).find("rank 1 left the communicator after an error or abort()"), std::string::npos)
        << e.what();
  }
}

TEST(Liveness, TheFirstRankTheStoreSawFailIsNamedWithItsHostAndReason) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 4);
  CallCheck calls(c0);
  Liveness liveness(c0, calls);
  store->set("pg/host/3", "host vm, pid 42", Clock::now() + 1s);
  store->set(failure_reason_key(3), "it missed its heartbeats", Clock::now() + 1s);
  store->set(kFailedRanksKey, "3,1", Clock::now() + 1s);
  // A call that has just begun leaves the store to the watch thread (not started here).
  EXPECT_NO_THROW(liveness.check(task_of(kAllreduce), 7, 1, -1));
  // One that has waited a failure poll asks the store itself.
  try {
    liveness.check(task_of(kAllreduce, Clock::now() + 10s - c0.opts.failure_poll), 7, 1, -1);
    ADD_FAILURE() << "nothing thrown";
  } catch (const PeerFailure& e) {
    EXPECT_EQ(e.rank(), 3);
    EXPECT_NE(std::string(e.what()).find("rank 3 (host vm, pid 42) failed: it missed its heartbeats; during"),
              std::string::npos)
        << e.what();
  }
  // A transport error about rank 1 still names rank 3, which failed first.
  try {
    liveness.blame_first_failure(PeerFailure(1, "endpoint closed"), task_of(kAllreduce), 7);
  } catch (const PeerFailure& e) {
    EXPECT_EQ(e.rank(), 3);
    EXPECT_NE(std::string(e.what()).find("rank 0 saw: endpoint closed"), std::string::npos) << e.what();
  }
}

// The watch thread polls the store while calls wait; the next check of a
// call that has just begun acts on what it found.
TEST(Liveness, TheWatchThreadsNewsFailsACallThatHasJustBegun) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 2);
  c0.opts.heartbeat = 0ms;
  c0.opts.failure_poll = 10ms;
  CallCheck calls(c0);
  Liveness liveness(c0, calls);
  liveness.start(Clock::now() + 1s);
  EXPECT_NO_THROW(liveness.check(task_of(kAllreduce), 1, 1, -1));
  store->set(c0.key(Liveness::kRevokedKey), "rank 1 revoked the communicator: test", Clock::now() + 1s);
  const auto until = Clock::now() + 5s;
  std::string e;
  while (e.empty() && Clock::now() < until) {
    std::this_thread::sleep_for(1ms);
    try {
      liveness.check(task_of(kAllreduce), 2, 1, -1);
    } catch (const Revoked& r) {
      e = r.what();
    }
  }
  EXPECT_NE(e.find("rank 1 revoked the communicator: test; during allreduce #2"), std::string::npos) << e;
  liveness.stop();
}

TEST(Liveness, AFailedEndpointAndAPassedDeadlineAreNamed) {
  auto store = std::make_shared<MemoryStore>();
  CommContext c0 = context(store, 0, 2);
  CallCheck calls(c0);
  Liveness liveness(c0, calls);
  try {
    liveness.check(task_of(kAllreduce), 2, 1, 1);
    ADD_FAILURE() << "nothing thrown";
  } catch (const PeerFailure& e) {
    EXPECT_EQ(e.rank(), 1);
    EXPECT_NE(std::string(e.what()).find("its UCX endpoint reported an error"), std::string::npos) << e.what();
  }
  const std::string e = error_of<Timeout>([&] { liveness.check(task_of(kAllreduce, Clock::now() - 1ms), 2, 1, -1); });
  EXPECT_NE(e.find("timed out after 10000 ms"), std::string::npos) << e;
  EXPECT_NO_THROW(liveness.check(task_of(kAllreduce), 2, 1, -1));
}

TEST(Operations, TheTableListsEveryOpInOrderWithItsOneName) {
  const auto ops = operations();
  ASSERT_EQ(ops.size(), size_t(Op::group) + 1);
  for (size_t i = 0; i < ops.size(); ++i) {
    EXPECT_EQ(size_t(ops[i].op), i);
    EXPECT_EQ(find_operation(ops[i].name), &ops[i]);
  }
  EXPECT_EQ(find_operation("all_reduce"), nullptr);
  EXPECT_STREQ(to_string(operation(Op::gatherv).collective), "gatherv");
  EXPECT_EQ(operation(Op::send).collective, Collective::send_recv);
}

TEST(Operations, FitCountTakesTheCountFromABufferEveryRankHolds) {
  Call c{.op = Op::alltoall};
  fit_count(c, 12, 12, 1, 4);
  EXPECT_EQ(c.count, 3u);
  c = {.op = Op::reduce_scatter};
  fit_count(c, 12, 3, 0, 4);
  EXPECT_EQ(c.count, 3u);
  // scatter: off the root there is no input; the count comes from the output.
  c = {.op = Op::scatter, .root = 0};
  fit_count(c, 0, 5, 2, 4);
  EXPECT_EQ(c.count, 5u);
  EXPECT_EQ(input_extent(c, 2, 4), 0u);
  EXPECT_EQ(input_extent(c, 0, 4), 20u);
}

TEST(Operations, FitCountNamesTheBufferThatIsTooShort) {
  Call c{.op = Op::allreduce};
  try {
    fit_count(c, 3, 2, 0, 2);
    FAIL() << "a short output passed";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "allreduce: output has 2 elements, not 3");
  }
  c = {.op = Op::alltoall};
  EXPECT_THROW(fit_count(c, 5, 5, 0, 2), InvalidArgument);  // not size() equal blocks
  const size_t counts[] = {2, 3}, displs[] = {10, 0};
  c = {.op = Op::allgatherv, .recv = {counts, displs}};
  fit_count(c, 3, 12, 1, 2);
  EXPECT_EQ(c.count, 3u);
  try {
    fit_count(c, 3, 11, 1, 2);
    FAIL() << "blocks reaching past the output passed";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "allgatherv: output has 11 elements, the blocks span 12");
  }
  // reduce_scatterv's output is this rank's own block.
  c = {.op = Op::reduce_scatterv, .send = {counts, {}}};
  fit_count(c, 5, 3, 1, 2);
  EXPECT_THROW(fit_count(c, 5, 1, 1, 2), InvalidArgument);
}

}  // namespace
}  // namespace tandem::testing
