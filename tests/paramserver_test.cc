// Parameter server across real processes: the last S ranks serve, the others
// push and pull. Values are integers in floats, so sums are exact and compared
// bitwise with the closed form (what an all-reduce of the same pushes gives).
#include "tandem/paramserver.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "command.h"
#include "multiprocess.h"
#include "routed_sync.h"
#include "tandem/tandem.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;

// Runs W workers and S servers; worker_body(comm, worker index) returns the exit code.
// A server may end with the error `server_error` (a rejected declaration).
void run_job(int workers, int servers, ps::Options options, const std::function<int(Communicator&, int)>& worker_body,
             std::chrono::seconds guard = 90s, const std::string& server_error = "") {
  EXPECT_EQ(options.servers, servers) << "the workers' options must name the same servers";
  RankGroup group(workers + servers, [&](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    if (ps::is_server(o.rank, o.size, options)) {
      try {
        ps::serve(*comm, options);
      } catch (const InvalidArgument& e) {
        if (server_error.empty() || std::string(e.what()).find(server_error) == std::string::npos) throw;
      }
      return 0;
    }
    return worker_body(*comm, o.rank);
  });
  group.expect_success(guard);
}

float dense_value(int worker, uint64_t step, size_t i) { return float((worker + 1) * int(i % 13) + int(step)); }
float dense_sum(int workers, uint64_t step, size_t i) {
  float s = 0;
  for (int w = 0; w < workers; ++w) s += dense_value(w, step, i);
  return s;
}

// Synchronous mode: every pull of step t returns exactly the sum of the
// workers' step-t pushes, for a key spread over many parts and servers, a
// small key and an f64 key.
TEST(ParamServer, SynchronousDenseEqualsAllreduceSum) {
  for (auto [workers, servers] : {std::pair{2, 1}, std::pair{3, 2}, std::pair{4, 3}}) {
    SCOPED_TRACE(std::to_string(workers) + " workers, " + std::to_string(servers) + " servers");
    ps::Options options;
    options.part_bytes = 4096;  // 1000 x 10 f32 = 40 KB: 10 parts dealt over the servers
    options.servers = servers;
    run_job(workers, servers, options, [&](Communicator& comm, int w) {
      std::vector<ps::KeySpec> keys = {{"big", 1000, 10}, {"small", 3}, {"wide", 500, 1, DataType::f64}};
      ps::Client client(comm, keys, options);
      EXPECT_EQ(client.layout()[0].parts.size(), 10u);
      for (uint64_t step = 1; step <= 3; ++step) {
        std::vector<float> big(10000), small(3);
        std::vector<double> wide(500);
        for (size_t i = 0; i < big.size(); ++i) big[i] = dense_value(w, step, i);
        for (size_t i = 0; i < small.size(); ++i) small[i] = dense_value(w, step, i);
        for (size_t i = 0; i < wide.size(); ++i) wide[i] = dense_value(w, step, i);
        auto r1 = client.push_async("big", big.data(), big.size(), DataType::f32);
        auto r2 = client.push_async("small", small.data(), small.size(), DataType::f32);
        client.push("wide", wide.data(), wide.size(), DataType::f64);
        r1.wait();
        r2.wait();
        std::vector<float> got(10000, -1), got_small(3, -1);
        std::vector<double> got_wide(500, -1);
        EXPECT_EQ(client.pull("big", got.data(), got.size(), DataType::f32), step);
        EXPECT_EQ(client.pull("small", got_small.data(), 3, DataType::f32), step);
        EXPECT_EQ(client.pull("wide", got_wide.data(), 500, DataType::f64), step);
        for (size_t i = 0; i < got.size(); ++i) {
          if (got[i] != dense_sum(workers, step, i)) {
            ADD_FAILURE() << "big[" << i << "] = " << got[i] << " at step " << step << ", expected "
                          << dense_sum(workers, step, i);
            return 1;
          }
        }
        for (size_t i = 0; i < 3; ++i) EXPECT_EQ(got_small[i], dense_sum(workers, step, i));
        for (size_t i = 0; i < 500; ++i) EXPECT_EQ(got_wide[i], double(dense_sum(workers, step, i)));
      }
      EXPECT_EQ(client.step("big"), 3u);
      return 0;
    });
  }
}

// Server-side SGD with momentum: w_t = w_{t-1} - lr * m_t, m_t = mu * m_{t-1} + mean of the pushes.
TEST(ParamServer, ServerSideSgdWithMomentum) {
  const int workers = 2;
  ps::Options options;
  run_job(workers, 1, options, [&](Communicator& comm, int w) {
    ps::KeySpec key{"w", 8};
    key.rule = ps::UpdateRule::sgd;
    key.lr = 0.5f;
    key.momentum = 0.5f;
    ps::Client client(comm, {key}, options);
    std::vector<float> init(8, 10.0f);
    if (w == 0) client.set("w", init.data(), 8, DataType::f32);  // ordered before worker 0's first push
    // Worker w pushes w + 1 everywhere: the mean is 1.5 (all values exact in binary).
    const float expected[] = {9.25f, 8.125f, 6.8125f};
    for (int t = 0; t < 3; ++t) {
      std::vector<float> g(8, float(w + 1)), got(8, -1);
      client.push("w", g.data(), 8, DataType::f32);
      EXPECT_EQ(client.pull("w", got.data(), 8, DataType::f32), uint64_t(t + 1));
      for (float x : got) EXPECT_EQ(x, expected[t]) << "step " << t + 1;
    }
    return 0;
  });
}

// Overlapping row sets, with repeats, from every worker, over two servers; a
// second step touches other rows, which must not see the first step's sums.
TEST(ParamServer, SparseOverlappingRowsSum) {
  const int workers = 3;
  ps::Options options;
  options.part_bytes = 100 * 8 * 4;  // 1000 x 8 f32: 10 parts, 5 per server
  options.servers = 2;
  run_job(workers, 2, options, [&](Communicator& comm, int w) {
    ps::Client client(comm, {{"emb", 1000, 8}}, options);
    auto rows_of = [](int worker, uint64_t step) {
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < 50; ++i) ids.push_back((i * 17 + worker * 3 + int64_t(step) * 400) % 1000);
      ids.push_back(ids.front());  // a repeat sums twice
      return ids;
    };
    auto row_value = [](int worker, int64_t id, size_t c) { return float(worker + 1 + id % 5 + int(c)); };
    for (uint64_t step = 1; step <= 2; ++step) {
      const auto ids = rows_of(w, step);
      std::vector<float> rows(ids.size() * 8);
      for (size_t i = 0; i < ids.size(); ++i)
        for (size_t c = 0; c < 8; ++c) rows[i * 8 + c] = row_value(w, ids[i], c);
      client.push_rows("emb", ids.data(), ids.size(), rows.data(), DataType::f32);
      std::vector<float> expected(1000 * 8, 0.0f);
      for (int v = 0; v < workers; ++v) {
        for (int64_t id : rows_of(v, step))
          for (size_t c = 0; c < 8; ++c) expected[size_t(id) * 8 + c] += row_value(v, id, c);
      }
      std::vector<float> dense(1000 * 8, -1.0f);
      EXPECT_EQ(client.pull("emb", dense.data(), dense.size(), DataType::f32), step);
      EXPECT_EQ(std::memcmp(dense.data(), expected.data(), dense.size() * sizeof(float)), 0)
          << "dense pull, step " << step;
      // pull_touched: exactly the rows some worker pushed this step, with their sums.
      std::vector<int64_t> touched;
      std::vector<std::byte> touched_rows;
      EXPECT_EQ(client.pull_touched("emb", touched, touched_rows), step);
      std::vector<float> rebuilt(1000 * 8, 0.0f);
      if (touched_rows.size() != touched.size() * 8 * sizeof(float)) {
        ADD_FAILURE() << touched_rows.size() << " bytes for " << touched.size() << " rows";
        return 1;
      }
      for (size_t i = 0; i < touched.size(); ++i)
        std::memcpy(&rebuilt[size_t(touched[i]) * 8], &touched_rows[i * 32], 32);
      EXPECT_EQ(std::memcmp(rebuilt.data(), expected.data(), rebuilt.size() * sizeof(float)), 0)
          << "pull_touched, step " << step;
      std::set<int64_t> all;
      for (int v = 0; v < workers; ++v)
        for (int64_t id : rows_of(v, step)) all.insert(id);
      EXPECT_EQ(touched.size(), all.size());
      std::vector<int64_t> ask = {999, 0, ids[3], ids[3], 512};
      std::vector<float> got(ask.size() * 8, -1.0f);
      EXPECT_EQ(client.pull_rows("emb", ask.data(), ask.size(), got.data(), DataType::f32), step);
      for (size_t i = 0; i < ask.size(); ++i)
        for (size_t c = 0; c < 8; ++c) {
          EXPECT_EQ(got[i * 8 + c], expected[size_t(ask[i]) * 8 + c]) << "row " << ask[i];
        }
    }
    // A worker whose batch touched nothing still takes its step.
    client.push_rows("emb", nullptr, 0, nullptr, DataType::f32);
    std::vector<float> dense(1000 * 8, -1.0f);
    EXPECT_EQ(client.pull("emb", dense.data(), dense.size(), DataType::f32), 3u);
    for (float x : dense) EXPECT_EQ(x, 0.0f);
    return 0;
  });
}

// Bounded staleness: workers of different speeds; every pull of step t reads
// an applied step in [t - s, t] whose value is that step's exact sum, and the
// fastest worker does run ahead (else the bound was never exercised).
TEST(ParamServer, BoundedStalenessNeverExceedsItsBound) {
  const int workers = 3, staleness = 2, steps = 12;
  ps::Options options;
  options.staleness = staleness;
  run_job(
      workers, 1, options,
      [&](Communicator& comm, int w) {
        ps::Client client(comm, {{"k", 64}}, options);
        int ahead = 0;
        for (uint64_t t = 1; t <= steps; ++t) {
          std::vector<float> v(64, float((w + 1) * int(t)));
          client.push("k", v.data(), v.size(), DataType::f32);
          std::this_thread::sleep_for(std::chrono::milliseconds(w * 15));  // worker 2 is the slowest
          std::vector<float> got(64, -1);
          const uint64_t a = client.pull("k", got.data(), got.size(), DataType::f32);
          EXPECT_GE(a + staleness, t) << "worker " << w << " read step " << a << " at its step " << t;
          EXPECT_LE(a, t);
          if (a < t) ++ahead;
          const float sum = float(a) * workers * (workers + 1) / 2;
          for (float x : got) EXPECT_EQ(x, sum) << "value of applied step " << a;
        }
        if (w == 0) {
          EXPECT_GT(ahead, 0) << "the fastest worker never ran ahead";
        }
        return 0;
      },
      120s);
}

// Undeclared key, wrong size, wrong dtype, bad row id, workers that disagree.
TEST(ParamServer, ClearErrors) {
  ps::Options options;
  run_job(1, 1, options, [&](Communicator& comm, int) {
    ps::Client client(comm, {{"weights", 10, 4}}, options);
    std::vector<float> data(40);
    std::vector<double> wrong(40);
    auto expect_error = [](auto&& f, const std::string& text) {
      try {
        f();
        ADD_FAILURE() << "no error; expected one containing: " << text;
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      }
    };
    expect_error([&] { client.push("bias", data.data(), 40, DataType::f32); },
                 "push: key 'bias' was not declared (declared: 'weights')");
    expect_error([&] { client.push("weights", data.data(), 39, DataType::f32); },
                 "push 'weights': 39 elements given, but the key was declared 10 x 4 = 40 elements");
    expect_error([&] { client.pull("weights", wrong.data(), 40, DataType::f64); },
                 "pull 'weights': dtype f64 given, but the key was declared f32");
    int64_t bad = 10;
    expect_error([&] { client.push_rows("weights", &bad, 1, data.data(), DataType::f32); },
                 "row id 10 at position 0 is outside the key's 10 rows");
    client.push("weights", data.data(), 40, DataType::f32);  // still usable
    return 0;
  });
  run_job(
      2, 1, options,
      [&](Communicator& comm, int w) {
        try {
          ps::Client client(comm, {{"weights", 10, w == 0 ? size_t(4) : size_t(5)}}, options);
          ADD_FAILURE() << "workers declared different keys without an error";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find(
                        "worker 0 has key 'weights': 10 x 4 f32, sum, worker 1 has key 'weights': 10 x 5 f32, sum"),
                    std::string::npos)
              << e.what();
        }
        return 0;
      },
      90s, "workers declare different keys");
}

// A server killed mid-step: every worker fails with PeerFailure naming it within 10 s.
TEST(ParamServer, KilledServerIsNamedWithinTenSeconds) {
  constexpr int kWorkers = 2, kServers = 2, kVictim = 3, kNamed = 20, kTooSlow = 5;
  ps::Options options;
  options.servers = kServers;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  RankGroup group(kWorkers + kServers, [&](const CommOptions& o) {
    close(ready[0]);
    auto comm = ring::connect(o, {});
    if (ps::is_server(o.rank, o.size, options)) {
      ps::serve(*comm, options);
      return 0;
    }
    ps::Client client(comm.operator*(), {{"k", 4 << 20}}, options);  // 16 MiB: 4 parts, 2 per server
    std::vector<float> data(4 << 20, 1.0f);
    client.push("k", data.data(), data.size(), DataType::f32);
    client.pull("k", data.data(), data.size(), DataType::f32);
    if (o.rank == 0) (void)!write(ready[1], "x", 1);
    for (;;) {
      const auto t0 = Clock::now();
      try {
        client.push("k", data.data(), data.size(), DataType::f32);
        client.pull("k", data.data(), data.size(), DataType::f32);
      } catch (const PeerFailure& e) {
        fprintf(stderr, "[rank %d] %s\n", o.rank, e.what());
        if (Clock::now() - t0 > 10s) return kTooSlow;
        return kNamed + e.rank();
      }
    }
  });
  close(ready[1]);
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  std::this_thread::sleep_for(100ms);
  const auto killed_at = Clock::now();
  kill(group.pid(kVictim), SIGKILL);
  auto codes = group.wait(60s);
  EXPECT_LT(Clock::now() - killed_at, 10s);
  EXPECT_EQ(codes[kVictim], 128 + SIGKILL);
  for (int r = 0; r < kWorkers; ++r)
    EXPECT_EQ(codes[r], kNamed + kVictim) << "worker " << r << " did not name server rank " << kVictim;
  // The other server is left waiting on its workers: it fails too, naming someone, or is still serving.
  EXPECT_NE(codes[kVictim - 1], 0);
}

// A worker that gives up (abort, then its communicator ends) while the
// others wait for its push: the waiting worker and the server fail naming it.
TEST(ParamServer, WorkerThatGivesUpIsNamed) {
  constexpr int kNamed = 20, kTooSlow = 5;
  ps::Options options;
  options.servers = 1;
  RankGroup group(3, [&](const CommOptions& o) {
    auto comm = ring::connect(o, {});
    const auto t0 = Clock::now();
    try {
      if (ps::is_server(o.rank, o.size, options)) {
        ps::serve(*comm, options);
        return 0;
      }
      ps::Client client(*comm, {{"k", 16}}, options);
      std::vector<float> v(16, 1.0f);
      if (o.rank == 1) {
        comm->abort("the test gives up");
        return 0;
      }
      client.push("k", v.data(), v.size(), DataType::f32);
      client.pull("k", v.data(), v.size(), DataType::f32);  // waits for rank 1's push
      return 1;
    } catch (const PeerFailure& e) {
      fprintf(stderr, "[rank %d] %s\n", o.rank, e.what());
      if (Clock::now() - t0 > 10s) return kTooSlow;
      return kNamed + e.rank();
    }
  });
  auto codes = group.wait(60s);
  EXPECT_EQ(codes[0], kNamed + 1) << "worker 0";
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], kNamed + 1) << "the server";
}

// One step over both routes: an embedding by name to the parameter server
// (only its non-zero rows pushed), the rest through the all-reduce buckets
// of a workers-only communicator; every gradient leaves wait() averaged.
TEST(ParamServer, RoutedSyncReducesBothRoutesInOneStep) {
  const int workers = 2;
  ps::Options options;
  options.servers = 1;
  run_job(workers, 1, options, [&](Communicator& world, int w) {
    CommOptions wo = world.options();
    wo.size = workers;
    wo.local_size = workers;
    wo.prefix += "/workers";
    auto comm = ring::connect(wo, {});
    trainer::RoutedSyncOptions ro;
    ro.ps = options;
    ro.ps_names = {"embedding"};
    trainer::RoutedSync sync(*comm, world, ro);
    const int dense = sync.register_gradient("dense", 1000);
    const int emb = sync.register_gradient("embedding", 100, 4);
    const int bias = sync.register_gradient("bias", 10);
    sync.finalize(Clock::now() + 30s);
    EXPECT_TRUE(sync.routed(emb));
    EXPECT_FALSE(sync.routed(dense));
    for (int step = 1; step <= 2; ++step) {
      std::fill(sync.data(dense), sync.data(dense) + 1000, float(w + 1));
      std::fill(sync.data(bias), sync.data(bias) + 10, float(step));
      const std::vector<int64_t> rows = {w, 50, 99};
      for (int64_t r : rows)
        for (int c = 0; c < 4; ++c) sync.data(emb)[r * 4 + c] = float((w + 1) * (r + 1) * step);
      sync.mark_ready(bias);
      sync.mark_ready(emb);
      sync.mark_ready(dense);
      sync.wait(Clock::now() + 30s);
      for (int i = 0; i < 1000; ++i) EXPECT_EQ(sync.data(dense)[i], 1.5f);
      for (int i = 0; i < 10; ++i) EXPECT_EQ(sync.data(bias)[i], float(step));
      for (int64_t r = 0; r < 100; ++r) {
        float expected = 0;
        if (r == 0) expected = 1.0f * step / 2;
        if (r == 1) expected = 2.0f * 2 * step / 2;
        if (r == 50 || r == 99) expected = 3.0f * float(r + 1) * step / 2;
        for (int c = 0; c < 4; ++c) EXPECT_EQ(sync.data(emb)[r * 4 + c], expected) << "row " << r << ", step " << step;
      }
      sync.zero_gradients();
    }
    return 0;
  });
}

// tandem launch --servers starts the server ranks (tandem ps serve); the bench
// checks its own results (ok: the pulled sums are the workers' count).
TEST(ParamServer, LaunchWithServersRunsTheBench) {
  const std::string bin = env("TANDEM_BIN");
  if (bin.empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const auto out = run(
      bin + " launch -n 2 --servers 2 -- " + bin + " bench ps -b 64K -e 1M -n 2 --rows 20000 --cols 16 --steps 2", 120);
  EXPECT_EQ(out.status, 0) << out.text;
  EXPECT_NE(out.text.find("2 workers, 2 server(s)"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("sparse"), std::string::npos) << out.text;
  EXPECT_EQ(out.text.find("BAD"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("tandem ps serve: rank 3 applied"), std::string::npos) << out.text;
}

// Under mpirun the roles come from TANDEM_SERVERS alone: the last rank serves inside the bench.
TEST(ParamServer, BenchUnderMpirunWithTandemServers) {
  const std::string bin = env("TANDEM_BIN");
  if (bin.empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "mpirun not found: install openmpi-bin to run this test";
  }
  // The store's port comes from mpirun's job id; another test running beside
  // this one may hold it. A new mpirun job has another id, so another port.
  auto out = run("true", 10);
  for (int attempt = 0; attempt < 3; ++attempt) {
    out = run("mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -n 3 -x TANDEM_SERVERS=1 " + bin +
                  " bench ps -b 64K -e 256K -n 2 --rows 10000 --cols 16 --steps 2 --format json",
              120);
    if (out.text.find("Address already in use") == std::string::npos) break;
  }
  EXPECT_EQ(out.status, 0) << out.text;
  EXPECT_NE(out.text.find("\"servers\": 1"), std::string::npos) << out.text;
  EXPECT_NE(out.text.find("\"workers\": 2"), std::string::npos) << out.text;
  EXPECT_EQ(out.text.find("\"ok\": false"), std::string::npos) << out.text;
}

}  // namespace
}  // namespace tandem::testing
