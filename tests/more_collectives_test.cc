// All-to-all, rooted and variable-size collectives, point-to-point messages
// and sub-communicators across real rank processes: random calls checked
// against closed-form values (every dtype, zero and odd counts, in place,
// 1-5 ranks, with and without tandem's shared memory), symmetric exchanges
// without a group, receives from any source, and failures named.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "collectives.h"
#include "multiprocess.h"
#include "shm_timed_path.h"
#include "tandem/bench/buffers.h"
#include "tandem/tandem.h"
#include "typed_values.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<char>;
using bench::count_wrong;
using bench::count_wrong_moved;
using bench::moved_value;

// The element rank `from` sends rank `to` at position j of a block (alltoall, scatter).
double addressed_value(int from, int to, size_t j) { return moved_value(from, size_t(to) * 7919 + j); }

void fill_moved(DataType t, void* buf, int rank, size_t count, size_t first = 0) {
  for (size_t i = 0; i < count; ++i) put(t, buf, i, moved_value(rank, first + i));
}

Blocks packed(const std::vector<size_t>& counts) {
  Blocks b{counts, std::vector<size_t>(counts.size())};
  std::exclusive_scan(counts.begin(), counts.end(), b.displs.begin(), size_t(0));
  return b;
}

// One random call of every kind per round; every rank draws the same numbers.
struct Draw {
  std::mt19937_64 rng;
  size_t count() {
    static const size_t kCounts[] = {0, 1, 3, 7, 4099, 70001};
    return rng() % 4 == 0 ? size_t(rng() % 20000) : kCounts[rng() % 6];
  }
  std::vector<size_t> counts(int n) {
    std::vector<size_t> c(static_cast<size_t>(n));
    for (auto& x : c) x = rng() % 3 == 0 ? 0 : count() % 5000;
    return c;
  }
  template <class T, size_t N>
  T pick(const T (&options)[N]) {
    return options[rng() % N];
  }
};

void alltoallv_case(Communicator& comm, Draw& d, DataType t, bool equal) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = dtype_size(t);
  // matrix[p][q]: what rank p sends rank q.
  std::vector<std::vector<size_t>> matrix(static_cast<size_t>(n));
  const size_t same = d.count() % 9000;
  for (auto& row : matrix) row = equal ? std::vector<size_t>(size_t(n), same) : d.counts(n);
  std::vector<size_t> recv_counts(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) recv_counts[size_t(p)] = matrix[size_t(p)][size_t(r)];
  const Blocks send = packed(matrix[size_t(r)]), recv = packed(recv_counts);
  const size_t in_count = std::accumulate(send.counts.begin(), send.counts.end(), size_t(0));
  const size_t out_count = std::accumulate(recv.counts.begin(), recv.counts.end(), size_t(0));
  Bytes in(in_count * es + 1), out(out_count * es + 1, char(0xab));
  for (int q = 0; q < n; ++q) {
    for (size_t j = 0; j < send.counts[size_t(q)]; ++j)
      put(t, in.data(), send.displs[size_t(q)] + j, addressed_value(r, q, j));
  }
  const bool inplace = equal && d.rng() % 2 == 0;
  if (inplace) {
    std::copy(in.begin(), in.end(), out.begin());
    comm.alltoall(out.data(), out.data(), same, t);
  } else if (equal) {
    comm.alltoall(in.data(), out.data(), same, t);
  } else {
    comm.alltoallv(in.data(), send, out.data(), recv, t);
  }
  for (int p = 0; p < n; ++p) {
    for (size_t j = 0; j < recv.counts[size_t(p)]; ++j) {
      const double got = get(t, out.data(), recv.displs[size_t(p)] + j);
      if (got != addressed_value(p, r, j)) {
        ADD_FAILURE() << (equal ? "alltoall" : "alltoallv") << (inplace ? " in place " : " ") << to_string(t)
                      << ": block from rank " << p << " element " << j << " is " << got;
        return;
      }
    }
  }
}

void reduce_case(Communicator& comm, Draw& d, DataType t) {
  const int n = comm.size(), r = comm.rank(), root = int(d.rng() % size_t(n));
  const ReduceOp op = d.pick(kAllReduceOps);
  const size_t count = d.count(), es = dtype_size(t);
  const bool inplace = d.rng() % 2 == 0;
  Bytes in(count * es + 1), out(count * es + 1, char(0xab));
  for (size_t i = 0; i < count; ++i) put(t, in.data(), i, input_value(op, t, r, i));
  const Bytes before = in;
  if (inplace) {
    comm.reduce(in.data(), in.data(), count, t, op, root);
  } else {
    comm.reduce(in.data(), out.data(), count, t, op, root);
    EXPECT_EQ(in, before) << "reduce changed its input";
  }
  if (r == root) {
    EXPECT_EQ(count_wrong(op, t, n, (inplace ? in : out).data(), count), 0)
        << "reduce " << to_string(t) << " " << to_string(op) << " count " << count << " root " << root;
  }
}

void gather_scatter_case(Communicator& comm, Draw& d, DataType t) {
  const int n = comm.size(), r = comm.rank(), root = int(d.rng() % size_t(n));
  const size_t es = dtype_size(t);
  const bool variable = d.rng() % 2 == 0;
  const std::vector<size_t> counts = variable ? d.counts(n) : std::vector<size_t>(size_t(n), d.count() % 9000);
  const Blocks b = packed(counts);
  const size_t mine = counts[size_t(r)], all = b.displs.back() + counts.back();
  // gather(v)
  Bytes in(mine * es + 1), out(all * es + 1, char(0xab));
  fill_moved(t, in.data(), r, mine);
  if (variable) {
    comm.gatherv(in.data(), mine, out.data(), b, t, root);
  } else {
    comm.gather(in.data(), out.data(), mine, t, root);
  }
  if (r == root) {
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(count_wrong_moved(t, p, out.data() + b.displs[size_t(p)] * es, counts[size_t(p)]), 0)
          << (variable ? "gatherv " : "gather ") << to_string(t) << " block " << p << " root " << root;
    }
  }
  // scatter(v): root's block p carries addressed_value(root, p, j)
  Bytes src(all * es + 1), dst(mine * es + 1, char(0xab));
  if (r == root) {
    for (int p = 0; p < n; ++p) {
      for (size_t j = 0; j < counts[size_t(p)]; ++j)
        put(t, src.data(), b.displs[size_t(p)] + j, addressed_value(root, p, j));
    }
  }
  if (variable) {
    comm.scatterv(src.data(), b, dst.data(), mine, t, root);
  } else {
    comm.scatter(src.data(), dst.data(), mine, t, root);
  }
  for (size_t j = 0; j < mine; ++j) {
    if (get(t, dst.data(), j) != addressed_value(root, r, j)) {
      ADD_FAILURE() << (variable ? "scatterv " : "scatter ") << to_string(t) << " element " << j << " root " << root;
      break;
    }
  }
}

void variable_ring_case(Communicator& comm, Draw& d, DataType t) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = dtype_size(t);
  const std::vector<size_t> counts = d.counts(n);
  const Blocks b = packed(counts);
  const size_t mine = counts[size_t(r)], all = b.displs.back() + counts.back();
  const bool inplace = d.rng() % 2 == 0;
  // allgatherv
  Bytes in(mine * es + 1), out(all * es + 1, char(0xab));
  fill_moved(t, in.data(), r, mine);
  if (inplace) std::copy(in.begin(), in.end() - 1, out.begin() + long(b.displs[size_t(r)] * es));
  comm.allgatherv(inplace ? out.data() + b.displs[size_t(r)] * es : in.data(), mine, out.data(), b, t);
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(count_wrong_moved(t, p, out.data() + b.displs[size_t(p)] * es, counts[size_t(p)]), 0)
        << "allgatherv " << to_string(t) << " block " << p;
  }
  // reduce_scatterv: element g of the whole buffer reduces as in an all-reduce
  const ReduceOp op = d.pick(kAllReduceOps);
  Bytes whole(all * es + 1), block(mine * es + 1, char(0xab));
  for (size_t g = 0; g < all; ++g) put(t, whole.data(), g, input_value(op, t, r, g));
  void* dst = inplace ? whole.data() + b.displs[size_t(r)] * es : block.data();
  comm.reduce_scatterv(whole.data(), dst, b, t, op);
  EXPECT_EQ(count_wrong(op, t, n, dst, mine, b.displs[size_t(r)]), 0)
      << "reduce_scatterv " << to_string(t) << " " << to_string(op) << (inplace ? " in place" : "");
}

int random_calls(const CommOptions& o, bool shared_memory, int rounds, const char* transport = "") {
  ring::RingOptions ring_options;
  ring_options.shared_memory = shared_memory;
  auto comm = ring::connect(o, ring_options);
  EXPECT_NE(comm->transport_summary().find(transport), std::string::npos) << comm->transport_summary();
  Draw d{std::mt19937_64(20261126 + comm->size())};
  for (int round = 0; round < rounds && !::testing::Test::HasFailure(); ++round) {
    const DataType t = d.pick(kAllDataTypes);
    alltoallv_case(*comm, d, t, true);
    alltoallv_case(*comm, d, t, false);
    reduce_case(*comm, d, t);
    gather_scatter_case(*comm, d, t);
    variable_ring_case(*comm, d, t);
  }
  return ::testing::Test::HasFailure() ? kExpectationFailed : 0;
}

class RandomCalls : public ::testing::TestWithParam<int> {};

TEST_P(RandomCalls, AgainstClosedForm) {
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory on" : "UCX only");
    RankGroup group(GetParam(), [shm](const CommOptions& o) { return random_calls(o, shm, 12); });
    group.expect_success(240s);
  }
}

// UCX forced onto TCP over loopback: the path between hosts.
TEST(RandomCallsOverTcp, AgainstClosedForm) {
  RankGroup group(3, [](const CommOptions& o) {
    setenv("UCX_TLS", "tcp,self", 1);  // read when the communicator creates its UCX context
    return random_calls(o, false, 6, "tcp");
  });
  group.expect_success(240s);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RandomCalls, ::testing::Values(1, 2, 3, 4, 5),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

// Rank r's all-to-all of `count`-element blocks (every block if `counts` is
// empty, else counts[p][q] from p to q) in `in`/`out` (in place if equal),
// checked element by element; the failures name the case.
void checked_alltoall(Communicator& comm, DataType t, const std::vector<std::vector<size_t>>& counts, size_t count,
                      char* in, char* out, const char* what) {
  const int n = comm.size(), r = comm.rank();
  const bool equal = counts.empty();
  std::vector<size_t> send_counts(size_t(n), count), recv_counts(size_t(n), count);
  for (int p = 0; !equal && p < n; ++p) {
    send_counts[size_t(p)] = counts[size_t(r)][size_t(p)];
    recv_counts[size_t(p)] = counts[size_t(p)][size_t(r)];
  }
  const Blocks send = packed(send_counts), recv = packed(recv_counts);
  for (int q = 0; q < n; ++q) {
    for (size_t j = 0; j < send.counts[size_t(q)]; ++j) {
      put(t, in, send.displs[size_t(q)] + j, addressed_value(r, q, j));
    }
  }
  if (equal) {
    comm.alltoall(in, out, count, t);
  } else {
    comm.alltoallv(in, send, out, recv, t);
  }
  for (int p = 0; p < n; ++p) {
    for (size_t j = 0; j < recv.counts[size_t(p)]; ++j) {
      if (get(t, out, recv.displs[size_t(p)] + j) != addressed_value(p, r, j)) {
        ADD_FAILURE() << what << " " << to_string(t) << " count " << count << ": block from rank " << p << " element "
                      << j << " is " << get(t, out, recv.displs[size_t(p)] + j);
        return;
      }
    }
  }
}

// Every all-to-all path through shared memory against UCX: staged (small
// blocks), read directly by cross-memory attach (heap, when forced) or
// through mappings (allocate_shared), in place (staged, on some ranks or all), and alltoallv
// after its count directory, blocks up to 300001 elements.
int alltoall_paths(const CommOptions& o, bool shared_memory, bool cross_memory) {
  ring::RingOptions ring_options;
  ring_options.shared_memory = shared_memory;
  if (cross_memory) ring_options.shm_paths = ring::ShmPathTable("alltoall:heap:64K-=cma");
  auto comm = ring::connect(o, ring_options);
  const int n = comm->size();
  std::mt19937_64 rng(77 + size_t(n));
  size_t round = 0;
  for (size_t count : {size_t(0), size_t(1), size_t(517), size_t(9001), size_t(70001), size_t(300001)}) {
    const DataType t = kAllDataTypes[round++ % std::size(kAllDataTypes)];
    const size_t bytes = size_t(n) * count * dtype_size(t) + 1;
    Bytes in(bytes), out(bytes, char(0xab));
    checked_alltoall(*comm, t, {}, count, in.data(), out.data(), "alltoall");
    checked_alltoall(*comm, t, {}, count, out.data(), out.data(), "alltoall in place");
    auto* shared_in = static_cast<char*>(comm->allocate_shared(bytes));
    auto* shared_out = static_cast<char*>(comm->allocate_shared(bytes));
    checked_alltoall(*comm, t, {}, count, shared_in, shared_out, "alltoall registered");
    checked_alltoall(*comm, t, {}, count, shared_out, shared_out, "alltoall registered in place");
    // In place on rank 0 only: it offers no input, and every rank stages.
    checked_alltoall(*comm, t, {}, count, comm->rank() == 0 ? shared_out : shared_in, shared_out,
                     "alltoall registered, in place on rank 0");
    comm->free_shared(shared_in);
    comm->free_shared(shared_out);
    // Variable blocks around `count`, some empty: every rank draws the same matrix.
    std::vector<std::vector<size_t>> matrix(static_cast<size_t>(n), std::vector<size_t>(static_cast<size_t>(n)));
    size_t largest_row = 0;
    for (auto& row : matrix) {
      for (auto& c : row) c = rng() % 4 == 0 ? 0 : size_t(rng() % (2 * count + 2));
    }
    for (int p = 0; p < n; ++p) {
      size_t row = 0, column = 0;
      for (int q = 0; q < n; ++q) row += matrix[size_t(p)][size_t(q)], column += matrix[size_t(q)][size_t(p)];
      largest_row = std::max({largest_row, row, column});
    }
    Bytes vin(largest_row * dtype_size(t) + 1), vout(largest_row * dtype_size(t) + 1);
    checked_alltoall(*comm, t, matrix, count, vin.data(), vout.data(), "alltoallv");
    if (::testing::Test::HasFailure()) break;
  }
  return ::testing::Test::HasFailure() ? kExpectationFailed : 0;
}

// The default path choice for heap buffers (shm_timed_path.cc): each size
// class opens at its first call with two untimed calls by cross-memory
// attach and one pair of trials (two staged calls, the second timed; three
// by cross-memory attach, the faster of the last two), then rank 0's
// verdict; from call 64, unless cross-memory attach won that pair clearly,
// a full opening, a warm call of each path and then pairs of trials, then
// the verdict again. In-place calls count too and stage. Every call's
// output is checked, over both openings and after them.
int alltoall_timed_path(const CommOptions& o) {
  auto comm = ring::connect(o, ring::RingOptions{});
  const int n = comm->size();
  // A small class (a second opening of 2 + 4 x 10 calls from call 64, 2 + 6 x 6 where ranks outnumber cores)
  // and a large one (2 + 4 x 3, or 2 + 6 x 2), each past it.
  for (auto [per_rank, calls] : {std::pair{size_t(96) << 10, 150}, std::pair{size_t(4) << 20, 84}}) {
    const size_t count = per_rank / size_t(n) / sizeof(float), bytes = per_rank + 1;
    Bytes in(bytes), out(bytes);
    for (int call = 0; call < calls; ++call) {
      std::memset(out.data(), 0xab, bytes);  // no call passes on a previous one's output
      const bool in_place = call % 7 == 3;
      checked_alltoall(*comm, DataType::f32, {}, count, in.data(), in_place ? in.data() : out.data(),
                       in_place ? "timed-path alltoall in place" : "timed-path alltoall");
      if (::testing::Test::HasFailure()) return kExpectationFailed;
    }
  }
  return 0;
}

TEST(Alltoall, TimedPathOpeningThenVerdict) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    RankGroup group(n, alltoall_timed_path);
    group.expect_success(120s);
  }
}

// The all-to-all streams its own block once the host's ranks' inputs and
// outputs would fill the last-level cache, and never under 1 MiB.
TEST(Alltoall, StreamingStoresPastTheLastLevelCache) {
  for (bool amd : {false, true}) {
    SCOPED_TRACE(amd ? "AMD" : "other");
    EXPECT_EQ(ring::alltoall_stream_min_bytes(32 << 20, 2, amd), size_t(8) << 20);
    EXPECT_EQ(ring::alltoall_stream_min_bytes(32 << 20, 4, amd), size_t(4) << 20);
    EXPECT_EQ(ring::alltoall_stream_min_bytes(2 << 20, 2, amd), size_t(1) << 20);  // a small cache: the floor
    EXPECT_EQ(ring::alltoall_stream_min_bytes(0, 2, amd), size_t(1) << 20);        // unknown: the floor
    EXPECT_EQ(ring::alltoall_stream_min_bytes(32 << 20, 0, amd), size_t(1) << 20);
  }
  // Over 32 MiB: a socket's (Intel), the floor; AMD's is a CCD's 32 MiB.
  EXPECT_EQ(ring::alltoall_stream_min_bytes(size_t(260) << 20, 2, false), size_t(1) << 20);
  EXPECT_EQ(ring::alltoall_stream_min_bytes(size_t(508) << 20, 2, true), size_t(8) << 20);
}

// Rank 0's verdict on a round's trials: staged unless cross-memory attach
// won more pairs (on a tie: the lower total) and is under 0.9 of staging's
// total (the first round's one pair: staging only if under 0.9 of
// cross-memory attach's).
TEST(Alltoall, TimedPathVerdict) {
  auto trials = [](uint64_t staged_ns, uint64_t cma_ns, uint64_t staged_wins, uint64_t cma_wins) {
    ring::PathTrials t{};
    t.staged_ns = staged_ns, t.cross_memory_ns = cma_ns, t.staged_wins = staged_wins, t.cross_memory_wins = cma_wins;
    return t;
  };
  EXPECT_FALSE(ring::staged_won(trials(100, 80, 1, 2)));
  EXPECT_FALSE(ring::staged_won(trials(100, 89, 1, 1)));  // a tie in pairs: the lower total, clearly lower
  EXPECT_TRUE(ring::staged_won(trials(100, 95, 1, 2)));   // 5 % faster: not enough
  EXPECT_TRUE(ring::staged_won(trials(100, 90, 1, 2)));   // 0.9 exactly: not under it
  EXPECT_TRUE(ring::staged_won(trials(100, 50, 2, 1)));   // fewer pairs won
  EXPECT_TRUE(ring::staged_won(trials(90, 100, 1, 2)));   // more pairs, a higher total
  EXPECT_TRUE(ring::staged_won(trials(0, 0, 0, 0)));      // neither timed
  // The first round's one pair: the margin turned round, staging only if it
  // took under 0.9 of cross-memory attach's time.
  EXPECT_FALSE(ring::staged_won(trials(100, 95, 0, 1), /*first_pair=*/true));
  EXPECT_FALSE(ring::staged_won(trials(95, 100, 1, 0), /*first_pair=*/true));
  EXPECT_FALSE(ring::staged_won(trials(90, 100, 1, 0), /*first_pair=*/true));  // 0.9 exactly: not under it
  EXPECT_TRUE(ring::staged_won(trials(89, 100, 1, 0), /*first_pair=*/true));
  EXPECT_TRUE(ring::staged_won(trials(0, 0, 0, 0), /*first_pair=*/true));  // neither timed
  // A trial that lost a call (its total 0): the rule of later rounds.
  EXPECT_EQ(ring::staged_won(trials(100, 0, 0, 0), true), ring::staged_won(trials(100, 0, 0, 0)));
  EXPECT_EQ(ring::staged_won(trials(0, 100, 0, 0), true), ring::staged_won(trials(0, 100, 0, 0)));
}

// A first pair is clear when cross-memory attach's timed call took under
// 1/1.5 of staging's, both timed; never for staging (one slow call fakes it).
TEST(Alltoall, TimedPathClearFirstPair) {
  auto trials = [](uint64_t staged_ns, uint64_t cma_ns) {
    ring::PathTrials t{};
    t.staged_ns = staged_ns, t.cross_memory_ns = cma_ns;
    return t;
  };
  EXPECT_TRUE(ring::clear_verdict(trials(150, 100)));
  EXPECT_TRUE(ring::clear_verdict(trials(300, 100)));
  EXPECT_FALSE(ring::clear_verdict(trials(100, 220)));  // staging clearly faster: checked in the second round
  EXPECT_FALSE(ring::clear_verdict(trials(149, 100)));
  EXPECT_FALSE(ring::clear_verdict(trials(100, 140)));
  EXPECT_FALSE(ring::clear_verdict(trials(0, 100)));  // a trial that lost a call
  EXPECT_FALSE(ring::clear_verdict(trials(100, 0)));
  EXPECT_EQ(ring::verdict_offer(ring::kStaged | ring::kClear), ring::Offer::staged);
  EXPECT_EQ(ring::verdict_offer(ring::kCrossMemory | ring::kClear), ring::Offer::cross_memory);
  EXPECT_EQ(ring::verdict_offer(ring::kCrossMemory), ring::Offer::cross_memory);
}

// Rank 0's timed call of a trial of two timed calls into `t`, `elapsed_ns`
// ago: its place in the trial and its pair, the way it went, and whether
// the trial keeps its faster call (the first round's) or sums them.
void timed_trial_call(ring::PathTrials& t, ring::Reach way, bool second_of_pair, bool begins, uint64_t elapsed_ns,
                      ring::Reach went, bool fastest = false) {
  ring::TimedPath p;
  p.trials = &t, p.trial = way, p.second_of_pair = second_of_pair, p.fastest = fastest;
  p.trial_begins = begins, p.trial_ends = !begins;
  if (begins && !second_of_pair) t.pair_first_ns = ring::kNotTimed;  // as timed_path opens a pair
  p.started_ns = tandem::trial_clock_ns() - elapsed_ns;
  ring::confirm_trial(p, went);
  ring::end_trial(p);
}

// Trials of three calls (where ranks outnumber cores): the last two timed
// and summed; a trial one of whose calls went another way counts nowhere.
TEST(Alltoall, TimedPathTrialsOfThreeCalls) {
  ring::PathTrials t{};
  auto call = [&t](ring::Reach way, bool second_of_pair, bool begins, uint64_t elapsed_ns, ring::Reach went) {
    timed_trial_call(t, way, second_of_pair, begins, elapsed_ns, went);
  };
  const auto S = ring::Reach::staged, C = ring::Reach::cross_memory;
  const uint64_t ms = 1'000'000;
  call(S, false, true, 10 * ms, S), call(S, false, false, 10 * ms, S);
  call(C, true, true, 1 * ms, C), call(C, true, false, 1 * ms, C);
  EXPECT_GE(t.staged_ns, 20 * ms);
  EXPECT_LT(t.staged_ns, 21 * ms);
  EXPECT_GE(t.cross_memory_ns, 2 * ms);
  EXPECT_LT(t.cross_memory_ns, 3 * ms);
  EXPECT_EQ(t.cross_memory_wins, 1u);
  EXPECT_EQ(t.staged_wins, 0u);
  // A pair whose staged trial lost its first timed call to an in-place call: neither total nor pair moves.
  const ring::PathTrials before = t;
  call(S, false, true, 10 * ms, C), call(S, false, false, 10 * ms, S);
  call(C, true, true, 1 * ms, C), call(C, true, false, 1 * ms, C);
  EXPECT_EQ(t.staged_ns, before.staged_ns);
  EXPECT_GE(t.cross_memory_ns, before.cross_memory_ns + 2 * ms);
  EXPECT_EQ(t.cross_memory_wins + t.staged_wins, 1u);
}

// The first round's trials: each timed by its faster timed call, so that one
// slow call of cross-memory attach does not make staging win the pair.
TEST(Alltoall, TimedPathFirstPairTakesTheFasterCall) {
  ring::PathTrials t{};
  auto call = [&t](ring::Reach way, bool second_of_pair, bool begins, uint64_t elapsed_ns) {
    timed_trial_call(t, way, second_of_pair, begins, elapsed_ns, way, /*fastest=*/true);
  };
  const auto S = ring::Reach::staged, C = ring::Reach::cross_memory;
  const uint64_t us = 1'000;
  call(S, false, true, 100 * us), call(S, false, false, 100 * us);
  call(C, true, true, 200 * us), call(C, true, false, 45 * us);  // a slow call, then a usual one
  EXPECT_GE(t.staged_ns, 100 * us);
  EXPECT_LT(t.staged_ns, 110 * us);
  EXPECT_GE(t.cross_memory_ns, 45 * us);
  EXPECT_LT(t.cross_memory_ns, 55 * us);
  EXPECT_FALSE(ring::staged_won(t, /*first_pair=*/true));
  EXPECT_TRUE(ring::clear_verdict(t));
}

TEST(Alltoall, EverySharedMemoryPath) {
  for (int n : {2, 3, 4}) {
    for (int path : {0, 1, 2}) {
      const bool shm = path != 2, cma = path == 1;
      SCOPED_TRACE(std::to_string(n) +
                   (shm ? cma ? " ranks, cross-memory attach" : " ranks, shared memory on" : " ranks, UCX only"));
      RankGroup group(n, [shm, cma](const CommOptions& o) { return alltoall_paths(o, shm, cma); });
      group.expect_success(240s);
    }
  }
}

// Buffers that overlap other than in NCCL's in-place layout (MPI forbids
// them, NCCL leaves them undefined) give the result of apart buffers. Each
// case runs on 2 and 3 ranks, shared memory on (its paths as timed, and
// the direct ones forced: cross-memory attach) and off, counts 1000 and
// 300,001 floats (cross-memory attach, and the mapping, past 256 KiB), heap
// and allocate_shared buffers: `body(comm, count, buffer)` gets a buffer of
// count * (ranks + 1) floats and returns the wrong elements it found.
template <class Body>
void expect_overlaps_handled(Body body) {
  constexpr const char* kDirect = "alltoall:heap:16K-=cma,allgather:heap:16K-=cma,reduce_scatter:heap:16K-=cma";
  for (int n : {2, 3}) {
    for (const char* paths : {"", kDirect, static_cast<const char*>(nullptr)}) {
      const bool shm = paths != nullptr;
      SCOPED_TRACE(std::to_string(n) + (!shm     ? " ranks, UCX only"
                                        : *paths ? " ranks, direct"
                                                 : " ranks, shared memory"));
      RankGroup group(n, [shm, paths, body](const CommOptions& o) {
        ring::RingOptions ring_options;
        ring_options.shared_memory = shm;
        if (shm) ring_options.shm_paths = ring::ShmPathTable(paths);
        auto comm = ring::connect(o, ring_options);
        for (size_t count : {size_t(1000), size_t(300001)}) {
          for (bool registered : {false, true}) {
            bench::Buffers buffers(*comm, count * size_t(comm->size() + 1) * sizeof(float), registered);
            EXPECT_EQ(body(*comm, count, buffers.in), 0)
                << (registered ? "allocate_shared" : "heap") << " buffer, count " << count;
            if (::testing::Test::HasFailure()) return kExpectationFailed;
          }
        }
        return 0;
      });
      group.expect_success(120s);
    }
  }
}

// This rank's f32 summands: `elements` of them.
void fill_summands(const Communicator& comm, void* in, size_t elements) {
  for (size_t g = 0; g < elements; ++g) {
    put(DataType::f32, in, g, input_value(ReduceOp::sum, DataType::f32, comm.rank(), g));
  }
}

// The input at the next rank's block of the output: the algorithms would
// overwrite it with that rank's block while still sending it.
TEST(Overlap, AllgatherInputAtAnotherBlockOfTheOutput) {
  expect_overlaps_handled([](Communicator& comm, size_t count, char* out) {
    const int n = comm.size(), r = comm.rank();
    const size_t block = count * sizeof(float);
    char* in = out + size_t((r + 1) % n) * block;
    fill_moved(DataType::f32, in, r, count);
    comm.allgather(in, out, count, DataType::f32);
    long wrong = 0;
    for (int b = 0; b < n; ++b) wrong += count_wrong_moved(DataType::f32, b, out + size_t(b) * block, count);
    return wrong;
  });
}

// The output at the next rank's block of the input (MPI's in place puts it
// at the start): the peers would read that block while this rank writes it.
TEST(Overlap, ReduceScatterOutputAtAnotherBlockOfTheInput) {
  expect_overlaps_handled([](Communicator& comm, size_t count, char* in) {
    const int n = comm.size(), r = comm.rank();
    fill_summands(comm, in, size_t(n) * count);
    char* out = in + size_t((r + 1) % n) * count * sizeof(float);
    comm.reduce_scatter(in, out, count, DataType::f32, ReduceOp::sum);
    return count_wrong(ReduceOp::sum, DataType::f32, n, out, count, size_t(r) * count);
  });
}

// Sums what `call(in, out)` returns with the output 3 elements before and 5
// after the input, both inside `buffer`.
template <class Call>
long with_shifted_output(char* buffer, Call call) {
  long wrong = 0;
  for (long shift : {-3L, 5L}) {
    auto* in = reinterpret_cast<float*>(buffer) + 4;
    wrong += call(in, in + shift);
  }
  return wrong;
}

// The output a few elements off the input: it would be written before all
// of the input was read. The reduce and the broadcast: on the root.
TEST(Overlap, OutputShiftedFromTheInput) {
  expect_overlaps_handled([](Communicator& comm, size_t count, char* buffer) {
    const int n = comm.size(), root = n - 1;
    const bool is_root = comm.rank() == root;
    return with_shifted_output(buffer,
                               [&](float* in, float* out) {
                                 fill_summands(comm, in, count);
                                 comm.allreduce(in, out, count, DataType::f32, ReduceOp::sum);
                                 return count_wrong(ReduceOp::sum, DataType::f32, n, out, count);
                               }) +
           with_shifted_output(buffer,
                               [&](float* in, float* out) {
                                 fill_summands(comm, in, count);
                                 comm.reduce(in, is_root ? out : nullptr, count, DataType::f32, ReduceOp::sum, root);
                                 return is_root ? count_wrong(ReduceOp::sum, DataType::f32, n, out, count) : 0;
                               }) +
           with_shifted_output(buffer, [&](float* in, float* out) {
             if (is_root) fill_moved(DataType::f32, in, root, count);
             float* target = is_root ? out : in;
             comm.broadcast(in, target, count, DataType::f32, root);
             return count_wrong_moved(DataType::f32, root, target, count);
           });
  });
}

// Every rank's block `count` elements, packed in rank order.
Blocks equal_blocks(int n, size_t count) { return packed(std::vector<size_t>(size_t(n), count)); }

// gather, gatherv and allgatherv: an input at the next rank's block of the
// output (the root's, for the gathers; a small gather takes one cell).
TEST(Overlap, GathersAndAllgathervInputAtAnotherBlock) {
  expect_overlaps_handled([](Communicator& comm, size_t count, char* out) {
    const int n = comm.size(), r = comm.rank(), root = n - 1;
    const size_t block = count * sizeof(float);
    long wrong = 0;
    for (const Op op : {Op::gather, Op::gatherv, Op::allgatherv}) {
      const bool all = op == Op::allgatherv;
      char* in = out + size_t((r + 1) % n) * block;
      fill_moved(DataType::f32, in, r, count);
      if (all) {
        comm.allgatherv(in, count, out, equal_blocks(n, count), DataType::f32);
      } else if (op == Op::gatherv) {
        comm.gatherv(in, count, out, equal_blocks(n, count), DataType::f32, root);
      } else {
        comm.gather(in, out, count, DataType::f32, root);
      }
      for (int b = 0; (all || r == root) && b < n; ++b) {
        wrong += count_wrong_moved(DataType::f32, b, out + size_t(b) * block, count);
      }
    }
    return wrong;
  });
}

// Only the gather's root overlaps (its input at another block of its
// output), its senders' buffers apart: senders that write their blocks
// straight into the root's output would overwrite its input there, so the
// root stages the call, and every rank with it.
TEST(Overlap, GatherRootInputAtAnotherBlockSendersApart) {
  expect_overlaps_handled([](Communicator& comm, size_t count, char* out) {
    const int n = comm.size(), r = comm.rank(), root = n - 1;
    const size_t block = count * sizeof(float);
    char* in = out + size_t(r == root ? (r + 1) % n : n) * block;
    fill_moved(DataType::f32, in, r, count);
    comm.gather(in, out, count, DataType::f32, root);
    long wrong = 0;
    for (int b = 0; r == root && b < n; ++b)
      wrong += count_wrong_moved(DataType::f32, b, out + size_t(b) * block, count);
    return wrong;
  });
}

// scatter's and scatterv's root and reduce_scatterv: an output at the next rank's block of the input.
TEST(Overlap, ScattersAndReduceScattervOutputAtAnotherBlock) {
  expect_overlaps_handled([](Communicator& comm, size_t count, char* in) {
    const int n = comm.size(), r = comm.rank(), root = n - 1;
    const size_t block = count * sizeof(float);
    char* out = in + size_t((r + 1) % n) * block;
    char* mine = r == root ? out : in + size_t(n) * block;
    long wrong = 0;
    for (bool variable : {false, true}) {
      for (int b = 0; b < n; ++b) fill_moved(DataType::f32, in + size_t(b) * block, b, count);
      if (variable) {
        comm.scatterv(in, equal_blocks(n, count), mine, count, DataType::f32, root);
      } else {
        comm.scatter(in, mine, count, DataType::f32, root);
      }
      wrong += count_wrong_moved(DataType::f32, r, mine, count);
    }
    fill_summands(comm, in, size_t(n) * count);
    comm.reduce_scatterv(in, out, equal_blocks(n, count), DataType::f32, ReduceOp::sum);
    return wrong + count_wrong(ReduceOp::sum, DataType::f32, n, out, count, size_t(r) * count);
  });
}

// MPI's in place at the root: a gather's input and a scatter's output at
// the root's own block of the other buffer. No peer touches that block, so
// the calls stage or read directly as out of place: staged, by cross-memory
// attach (forced) and through allocate_shared buffers, small and large.
TEST(Overlap, GatherAndScatterInPlaceAtTheRoot) {
  for (int n : {2, 3}) {
    for (const char* paths : {"alltoall:heap:*=staged", "alltoall:heap:16K-=cma"}) {
      SCOPED_TRACE(std::to_string(n) + " ranks, " + paths);
      RankGroup group(n, [paths](const CommOptions& o) {
        ring::RingOptions ring_options;
        ring_options.shm_paths = ring::ShmPathTable(paths);
        auto comm = ring::connect(o, ring_options);
        const int n = comm->size(), r = comm->rank(), root = n - 1;
        for (size_t count : {size_t(1000), size_t(300001)}) {
          for (bool registered : {false, true}) {
            const size_t block = count * sizeof(float);
            bench::Buffers buffers(*comm, block * size_t(n), registered);
            char* const all = buffers.in;
            char* const own = all + size_t(r) * block;
            fill_moved(DataType::f32, own, r, count);
            comm->gather(own, all, count, DataType::f32, root);
            long wrong = 0;
            for (int b = 0; r == root && b < n; ++b) {
              wrong += count_wrong_moved(DataType::f32, b, all + size_t(b) * block, count);
            }
            for (int b = 0; r == root && b < n; ++b) fill_moved(DataType::f32, all + size_t(b) * block, b, count, 1);
            char* const mine = r == root ? own : buffers.out;
            comm->scatter(all, mine, count, DataType::f32, root);
            for (size_t j = 0; j < count; ++j) wrong += get(DataType::f32, mine, j) != moved_value(r, 1 + j);
            EXPECT_EQ(wrong, 0) << (registered ? "allocate_shared" : "heap") << " buffers, count " << count;
            if (::testing::Test::HasFailure()) return kExpectationFailed;
          }
        }
        return 0;
      });
      group.expect_success(120s);
    }
  }
}

// An alltoallv whose sender and receiver disagree on a block's size fails on
// every rank at once, naming both sizes (the count directory shows them all).
// Fewer elements in all than ranks: rank 0 sends one to the last rank, no
// one else sends anything; through shared memory and over UCX. (The shared
// path once returned at once when the total was below one element a rank.)
TEST(Alltoall, VariableBlocksFewerElementsThanRanks) {
  for (bool shm : {true, false}) {
    SCOPED_TRACE(shm ? "shared memory on" : "UCX only");
    ring::RingOptions ro;
    ro.shared_memory = shm;
    RankGroup group(3, [&](const CommOptions& o) {
      auto comm = ring::connect(o, ro);
      const int n = comm->size(), r = comm->rank();
      std::vector<size_t> send_counts(size_t(n), 0), recv_counts(size_t(n), 0);
      if (r == 0) send_counts[size_t(n - 1)] = 1;
      if (r == n - 1) recv_counts[0] = 1;
      float in = 42.0f, out = -1.0f;
      comm->alltoallv(&in, packed(send_counts), &out, packed(recv_counts), DataType::f32);
      EXPECT_EQ(out, r == n - 1 ? 42.0f : -1.0f) << "rank " << r;
      return 0;
    });
    group.expect_success(60s);
  }
}

TEST(Alltoall, BlockSizeMismatchIsNamedOnEveryRank) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const int n = comm->size(), r = comm->rank();
    std::vector<float> in(64), out(64);
    Blocks send = packed(std::vector<size_t>(size_t(n), 4)), recv = send;
    if (r == 1) recv = packed({5, 4, 4});  // rank 0 sends it 4
    try {
      comm->alltoallv(in.data(), send, out.data(), recv, DataType::f32);
      ADD_FAILURE() << "an alltoallv with mismatched block sizes succeeded";
    } catch (const CollectiveMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 sends rank 1 4 elements but rank 1 expects 5"), std::string::npos)
          << e.what();
    }
    return ::testing::Test::HasFailure() ? kExpectationFailed : 0;
  });
  group.expect_success(60s);
}

// A blocking all-to-all runs on the caller's thread borrowing per-thread
// arguments; one issued behind queued calls must queue with its own copy.
// Here blocking calls of changing counts follow async ones still queued, and
// every output is checked afterwards against the closed form.
int alltoall_behind_queued_calls(const CommOptions& o, bool shared_memory) {
  ring::RingOptions ring_options;
  ring_options.shared_memory = shared_memory;
  auto comm = ring::connect(o, ring_options);
  const int n = comm->size(), r = comm->rank();
  constexpr size_t kCounts[] = {5, 1024, 3, 70001};
  std::vector<std::vector<float>> ins, outs;
  auto fill = [&](size_t count) {
    ins.emplace_back(count * size_t(n));
    outs.emplace_back(count * size_t(n), -1.0f);
    for (int q = 0; q < n; ++q) {
      for (size_t j = 0; j < count; ++j) ins.back()[size_t(q) * count + j] = float(addressed_value(r, q, j));
    }
  };
  for (int round = 0; round < 3; ++round) {
    ins.clear();
    outs.clear();
    std::vector<Request> pending;
    for (size_t count : kCounts) {  // async, then blocking: the blocking ones find work queued
      fill(count);
      pending.push_back(comm->alltoall_async(ins.back().data(), outs.back().data(), count, DataType::f32));
      fill(count + 1);
      comm->alltoall(ins.back().data(), outs.back().data(), count + 1, DataType::f32);
    }
    for (auto& p : pending) p.wait();
    fill(7);  // alltoallv on an idle communicator, after the others
    comm->alltoallv(ins.back().data(), packed(std::vector<size_t>(size_t(n), 7)), outs.back().data(),
                    packed(std::vector<size_t>(size_t(n), 7)), DataType::f32);
    for (size_t b = 0; b < outs.size(); ++b) {
      const size_t count = outs[b].size() / size_t(n);
      for (int p = 0; p < n; ++p) {
        for (size_t j = 0; j < count; ++j) {
          const float want = float(addressed_value(p, r, j)), got = outs[b][size_t(p) * count + j];
          if (got != want) {
            ADD_FAILURE() << "round " << round << " call " << b << " (count " << count << ") from rank " << p
                          << " element " << j << ": " << got << " != " << want;
            return kExpectationFailed;
          }
        }
      }
    }
  }
  return ::testing::Test::HasFailure() ? kExpectationFailed : 0;
}

TEST(Alltoall, BlockingCallsBehindQueuedCalls) {
  for (int n : {2, 3}) {
    for (bool shm : {true, false}) {
      SCOPED_TRACE(std::to_string(n) + (shm ? " ranks, shared memory on" : " ranks, UCX only"));
      RankGroup group(n, [shm](const CommOptions& o) { return alltoall_behind_queued_calls(o, shm); });
      group.expect_success(120s);
    }
  }
}

TEST(PointToPoint, TagsAnySourceAndSymmetricExchange) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const int n = comm->size(), r = comm->rank();
    // Symmetric exchange without a group: each rank posts its receive first, then its send.
    std::vector<float> to_next(1000), from_prev(1000);
    for (size_t i = 0; i < to_next.size(); ++i) to_next[i] = float(r * 1000 + int(i));
    Request rx = comm->recv_async(from_prev.data(), 1000, DataType::f32, (r + n - 1) % n, 7);
    Request tx = comm->send_async(to_next.data(), 1000, DataType::f32, (r + 1) % n, 7);
    rx.wait();
    tx.wait();
    EXPECT_EQ(rx.source(), (r + n - 1) % n);
    EXPECT_EQ(from_prev[999], float(((r + n - 1) % n) * 1000 + 999));
    // Tags keep messages apart: two sends with different tags received in the other order.
    if (r == 0) {
      int64_t a = 11, b = 22;
      comm->send(&a, 1, DataType::i64, 1, 1);
      comm->send(&b, 1, DataType::i64, 1, 2);
    } else if (r == 1) {
      int64_t a = 0, b = 0;
      Request second = comm->recv_async(&b, 1, DataType::i64, 0, 2);
      comm->recv(&a, 1, DataType::i64, 0, 1);
      second.wait();
      EXPECT_EQ(a, 11);
      EXPECT_EQ(b, 22);
    }
    // Any source: rank 0 hears from each other rank once, in whatever order.
    if (r == 0) {
      std::vector<int> seen;
      for (int i = 1; i < n; ++i) {
        int32_t value = -1;
        const int from = comm->recv(&value, 1, DataType::i32, kAnySource, 9);
        EXPECT_EQ(value, from * 100);
        seen.push_back(from);
      }
      std::sort(seen.begin(), seen.end());
      EXPECT_EQ(seen, (std::vector<int>{1, 2}));
    } else {
      int32_t value = r * 100;
      comm->send(&value, 1, DataType::i32, 0, 9);
    }
    // A group: all-to-all by hand, every op posted at once; a send to oneself too.
    std::vector<int32_t> out(static_cast<size_t>(n), r), in(static_cast<size_t>(n), -1);
    std::vector<P2POp> ops;
    for (int p = 0; p < n; ++p) {
      ops.push_back({P2POp::recv, &in[size_t(p)], 1, DataType::i32, p, 3});
      ops.push_back({P2POp::send, &out[size_t(p)], 1, DataType::i32, p, 3});
    }
    comm->group(ops);
    for (int p = 0; p < n; ++p) EXPECT_EQ(in[size_t(p)], p);
    comm->barrier();
    return 0;
  });
  group.expect_success(60s);
}

TEST(PointToPoint, SizeMismatchIsNamed) {
  RankGroup group(2, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    std::vector<float> data(100);
    try {
      if (comm->rank() == 0) {
        comm->send(data.data(), 100, DataType::f32, 1, 4);
        return 0;
      }
      comm->recv(data.data(), 50, DataType::f32, 0, 4);
      ADD_FAILURE() << "a 400-byte message into a 200-byte receive succeeded";
    } catch (const CollectiveMismatch& e) {
      EXPECT_NE(std::string(e.what()).find("send_recv(50 x f32, peer 0, tag 4)"), std::string::npos) << e.what();
    }
    return 0;
  });
  group.expect_success(60s);
}

TEST(PointToPoint, DeadSenderIsNamed) {
  CommOptions base;
  base.heartbeat = std::chrono::milliseconds(500);
  RankGroup group(
      2,
      [](const CommOptions& o) {
        auto comm = ring::connect(o, {});
        comm->barrier();
        if (comm->rank() == 1) {
          std::this_thread::sleep_for(200ms);
          raise(SIGKILL);
        }
        float x = 0;
        const auto start = Clock::now();
        try {
          comm->recv(&x, 1, DataType::f32, 1);
          ADD_FAILURE() << "a receive from a dead rank succeeded";
        } catch (const PeerFailure& e) {
          EXPECT_EQ(e.rank(), 1) << e.what();
          EXPECT_LT(Clock::now() - start, 5s) << "named within the heartbeat bound";
        }
        return 0;
      },
      base);
  auto codes = group.wait(60s);
  EXPECT_EQ(codes[0], 0);
}

// A rank that stops (SIGSTOP: alive, silent) before an all-to-all is named by
// the others within three heartbeat intervals.
TEST(Collectives, StoppedRankInAlltoallIsNamed) {
  CommOptions base;
  base.heartbeat = std::chrono::milliseconds(500);
  RankGroup group(
      3,
      [](const CommOptions& o) {
        auto comm = ring::connect(o, {});
        comm->barrier();
        if (comm->rank() == 2) raise(SIGSTOP);
        std::vector<float> in(3 << 16), out(3 << 16);
        const auto start = Clock::now();
        try {
          comm->alltoall(in.data(), out.data(), 1 << 16, DataType::f32);
          ADD_FAILURE() << "an all-to-all with a stopped rank succeeded";
        } catch (const PeerFailure& e) {
          EXPECT_EQ(e.rank(), 2) << e.what();
          EXPECT_NE(std::string(e.what()).find("alltoall"), std::string::npos) << e.what();
          EXPECT_LT(Clock::now() - start, 1500ms + 1s) << "named within three heartbeats (and a poll)";
        }
        return 0;
      },
      base);
  auto codes = group.wait_for_all_but(2, 60s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
}

// A joiner reads the members' chunk back from their segment's size
// (grow.cc): every chunk RingOptions accepts survives the round trip.
TEST(Segments, ChunkReadBackFromTheSegmentSize) {
  for (size_t chunk : {size_t(4096), size_t(8192), size_t(256) << 10, size_t(1) << 20, size_t(64) << 20}) {
    EXPECT_EQ(ring::shm_chunk_for_segment(ring::shm_segment_bytes(chunk)), chunk) << chunk;
  }
}

// A communicator whose shared-memory chunk is 4 KiB (cells of 64 bytes,
// runs of 512): calls of a few KiB span several chunks.
auto connect_with_4k_chunks(const CommOptions& o) {
  ring::RingOptions ro;
  ro.shm_chunk_bytes = 4096;
  return ring::connect(o, ro);
}

// On shared memory a rooted call's sending side returns once its part is
// staged (a gather's and reduce's non-roots, a scatter's and broadcast's
// root), so it runs ahead of its receivers by up to 64 calls of one cell,
// 32 of a run or 4 whole chunks. Back to back, with roots moving, calls of
// one cell (64 bytes of a 4 KiB chunk) and of a run (512) among calls of
// several chunks, so that runs and whole chunks start past cells left
// unused and calls of one cell past their 64 cells, and every input
// rewritten as soon as its call returns: each root still gets each call's
// data. Then 300 calls of one cell to one root, whose senders fill their
// cells and wait for them again and again.
TEST(Rooted, SendingSidesRunAheadAndKeepTheirData) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = connect_with_4k_chunks(o);
    const int n = comm->size(), r = comm->rank();
    std::vector<float> in(3 * 1600), out(3 * 1600);
    auto value = [](int call, int rank, size_t j) { return float(call * 4096 + rank * 2048 + int(j % 2000)); };
    int wrong = 0;
    for (int call = 0; call < 240 && wrong == 0; ++call) {
      const int root = call % n;
      const size_t count = call % 3 == 0   ? (call % 2 == 0 ? 1 + size_t(call) % 5 : 10 + size_t(call) % 30)
                           : call % 3 == 1 ? 100 + size_t(call * 37) % 1500
                                           : 30 + size_t(call) % 100;
      std::fill(out.begin(), out.end(), -1.0f);
      switch (call % 4) {
        case 0:
          for (size_t j = 0; j < count; ++j) in[j] = value(call, r, j);
          comm->gather(in.data(), out.data(), count, DataType::f32, root);
          for (int p = 0; p < n && r == root; ++p)
            for (size_t j = 0; j < count; ++j) wrong += out[size_t(p) * count + j] != value(call, p, j);
          break;
        case 1:
          for (size_t j = 0; j < count; ++j) in[j] = value(call, r, j);
          comm->reduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum, root);
          for (size_t j = 0; j < count && r == root; ++j)
            wrong += out[j] != value(call, 0, j) + value(call, 1, j) + value(call, 2, j);
          break;
        case 2:
          for (int p = 0; p < n; ++p)
            for (size_t j = 0; j < count; ++j) in[size_t(p) * count + j] = value(call, p, j) + float(root);
          comm->scatter(in.data(), out.data(), count, DataType::f32, root);
          for (size_t j = 0; j < count; ++j) wrong += out[j] != value(call, r, j) + float(root);
          break;
        default:
          for (size_t j = 0; j < count; ++j) in[j] = value(call, r, j);
          comm->broadcast(in.data(), out.data(), count, DataType::f32, root);
          for (size_t j = 0; j < count; ++j) wrong += out[j] != value(call, root, j);
      }
      std::fill(in.begin(), in.end(), -2.0f);  // the next call's data, written at once
      if (wrong) ADD_FAILURE() << wrong << " wrong elements at call " << call << " (root " << root << ")";
    }
    for (int call = 240; call < 540 && wrong == 0; ++call) {
      const size_t count = 4;  // 3 ranks x 16 bytes: one 64-byte cell
      for (size_t j = 0; j < count; ++j) in[j] = value(call, r, j);
      comm->gather(in.data(), out.data(), count, DataType::f32, 0);
      for (int p = 0; p < n && r == 0; ++p)
        for (size_t j = 0; j < count; ++j) wrong += out[size_t(p) * count + j] != value(call, p, j);
      std::fill(in.begin(), in.end(), -2.0f);
      if (wrong) ADD_FAILURE() << wrong << " wrong elements at one-cell call " << call;
    }
    return wrong == 0 ? 0 : kExpectationFailed;
  });
  group.expect_success(120s);
}

// allgatherv and reduce_scatterv with unequal blocks (one empty, one
// spanning several 4 KiB chunks, blocks apart with gaps between them) go
// through the segments on one host: back to back, every value exact.
TEST(Variable, UnequalBlocksThroughSharedMemory) {
  RankGroup group(3, [](const CommOptions& o) {
    auto comm = connect_with_4k_chunks(o);
    const int n = comm->size(), r = comm->rank();
    int wrong = 0;
    for (int call = 0; call < 60 && wrong == 0; ++call) {
      Blocks b;
      size_t end = 0;
      for (int p = 0; p < n; ++p) {
        const size_t count = (p + call) % n == 0 ? 0 : 1 + size_t(call * 97 + p * 1013) % 3000;
        b.counts.push_back(count);
        b.displs.push_back(end + 7);  // a gap before every block
        end += count + 7;
      }
      const size_t mine = b.counts[size_t(r)];
      auto value = [&](int p, size_t j) { return float(call * 8192 + p * 4096) + float(j % 4000); };
      std::vector<float> in(mine + 1), out(end + 1, -1.0f);
      for (size_t j = 0; j < mine; ++j) in[j] = value(r, j);
      comm->allgatherv(in.data(), mine, out.data(), b, DataType::f32);
      for (int p = 0; p < n; ++p)
        for (size_t j = 0; j < b.counts[size_t(p)]; ++j) wrong += out[b.displs[size_t(p)] + j] != value(p, j);
      std::vector<float> whole(end + 1, 0.0f), block(mine + 1, -1.0f);
      for (int p = 0; p < n; ++p)
        for (size_t j = 0; j < b.counts[size_t(p)]; ++j) whole[b.displs[size_t(p)] + j] = value(p, j) + float(r);
      comm->reduce_scatterv(whole.data(), block.data(), b, DataType::f32, ReduceOp::sum);
      for (size_t j = 0; j < mine; ++j) wrong += block[j] != float(n) * value(r, j) + float(n * (n - 1) / 2);
      if (wrong) ADD_FAILURE() << wrong << " wrong elements at call " << call;
    }
    return wrong == 0 ? 0 : kExpectationFailed;
  });
  group.expect_success(120s);
}

// A gather's non-root rank returns once its block is staged (as MPI's eager
// sends): it learns of the mismatch at its next call.
TEST(Collectives, MismatchedKindsAreNamed) {
  RankGroup group(2, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    std::vector<float> in(8), out(8);
    try {
      if (comm->rank() == 0) {
        comm->alltoall(in.data(), out.data(), 4, DataType::f32);
      } else {
        comm->gather(in.data(), out.data(), 4, DataType::f32, 0);
        comm->allreduce(in.data(), 4, DataType::f32, ReduceOp::sum);
      }
      ADD_FAILURE() << "alltoall against gather succeeded";
    } catch (const CollectiveMismatch& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("alltoall(4 x f32)"), std::string::npos) << what;
      EXPECT_NE(what.find("gather(4 x f32, root 0)"), std::string::npos) << what;
    }
    return 0;
  });
  group.expect_success(60s);
}

TEST(Split, ColoursKeysAndConcurrentParent) {
  RankGroup group(4, [](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const int r = comm->rank();
    // Colours: even and odd ranks; keys reverse the order. Rank 3 opts out of a second split.
    auto half = comm->split(r % 2, -r);
    EXPECT_EQ(half->size(), 2);
    EXPECT_EQ(half->rank(), r < 2 ? 1 : 0);
    auto some = comm->split(r == 3 ? kUndefinedColor : 0, r);
    EXPECT_EQ(some == nullptr, r == 3);
    if (some) {
      EXPECT_EQ(some->size(), 3);
      EXPECT_EQ(some->rank(), r);
    }
    // The child and the parent run collectives at the same time, from two threads.
    std::vector<int64_t> parent_data(100000, r + 1), child_data(100000, r + 1);
    std::thread other([&] { half->allreduce(child_data.data(), child_data.size(), DataType::i64, ReduceOp::sum); });
    comm->allreduce(parent_data.data(), parent_data.size(), DataType::i64, ReduceOp::sum);
    other.join();
    EXPECT_EQ(parent_data[99999], 10);
    EXPECT_EQ(child_data[99999], r % 2 == 0 ? 1 + 3 : 2 + 4);
    // A duplicate: same ranks, its own calls.
    auto dup = comm->duplicate();
    EXPECT_EQ(dup->rank(), r);
    int32_t v = r;
    dup->broadcast(&v, 1, DataType::i32, 2);
    EXPECT_EQ(v, 2);
    return 0;
  });
  group.expect_success(120s);
}

}  // namespace
}  // namespace tandem::testing
