// `tandem bench ps` (see tandem/bench/ps.h). Terms: a dense row is one push
// + pull of a key of `bytes`; a sparse row is one step of push_rows +
// pull_rows of `fraction` of an embedding's rows, next to an all-reduce of
// the whole embedding gradient. ratio = all-reduce time / PS time.
#include "tandem/bench/ps.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "tandem/bench/plot.h"
#include "tandem/bench/report.h"
#include "tandem/bootstrap.h"
#include "tandem/paramserver.h"
#include "tandem/tandem.h"

namespace tandem::bench {

namespace {

struct PsResult {
  std::string kind;     // dense or sparse
  size_t bytes = 0;     // the key's (and the all-reduce's) bytes
  size_t ps_bytes = 0;  // what one worker moves per PS iteration (push + pull)
  double ps_ms = 0, allreduce_ms = 0;
  bool ok = true;
};

using Ms = std::chrono::duration<double, std::milli>;

// The slowest worker's value.
double slowest(Communicator& workers, double ms) {
  workers.allreduce(&ms, 1, DataType::f64, ReduceOp::max);
  return ms;
}

template <class F>
double time_ms(Communicator& workers, int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  workers.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f();
  return slowest(workers, Ms(Clock::now() - t0).count() / iters);
}

void plot(const PsBenchOptions& o, const std::vector<PsResult>& results, int workers, int servers) {
  const std::string data = o.plot + ".dat";
  {
    std::ofstream f(data);
    for (const auto& r : results)
      if (r.kind == "dense") f << r.bytes << " " << r.ps_ms << " " << r.allreduce_ms << "\n";
    f << "\n\n";
    for (const auto& r : results)
      if (r.kind == "sparse") f << r.bytes << " " << r.ps_ms << " " << r.allreduce_ms << "\n";
  }
  run_gnuplot(o.plot, data,
              "set title 'tandem bench ps: " + std::to_string(workers) + " workers, " + std::to_string(servers) +
                  " server(s)'\nset xlabel 'bytes'\nset ylabel 'ms per step'\nset logscale xy\nset key top left\n"
                  "plot DATA_FILE index 0 using 1:2 with linespoints title 'dense: PS push+pull', "
                  "'' index 0 using 1:3 with linespoints title 'dense: ring all-reduce', "
                  "'' index 1 using 1:2 with points pt 7 ps 2 title 'sparse: PS push rows + pull rows', "
                  "'' index 1 using 1:3 with points pt 5 ps 2 title 'sparse: all-reduce of the dense gradient'\n");
}

}  // namespace

int run_ps_bench(const PsBenchOptions& o) {
  if (o.format != "table" && o.format != "json") throw InvalidArgument("bench ps: --format must be table or json");
  if (!(o.fraction > 0 && o.fraction <= 1)) throw InvalidArgument("bench ps: --fraction must be in (0, 1]");
  if (o.iters < 1 || o.warmup < 0 || o.sparse_steps < 1)
    throw InvalidArgument("bench ps: --iters and --steps must be >= 1");
  const CommOptions copts = comm_options_from_env();
  const ring::RingOptions ropts = ring::ring_options_from_env();
  ps::Options popts = ps::ps_options_from_env();
  if (popts.servers < 1) {
    throw InvalidArgument(
        "bench ps needs servers: run under `tandem launch -n W --servers S`, or set TANDEM_SERVERS=S");
  }
  auto world = ring::connect(copts, ropts);
  if (ps::is_server(world->rank(), world->size(), popts)) {
    ps::serve(*world, popts);
    return 0;
  }
  const int nworkers = ps::worker_count(world->size(), popts);
  // The all-reduce runs among the workers only, on a communicator of their own.
  CommOptions wopts = copts;
  wopts.size = nworkers;
  wopts.local_size = std::min(copts.local_size, nworkers);
  wopts.prefix = copts.prefix + "/workers";
  wopts.host_store = false;  // world rank 0 hosts it already, if anyone does
  auto workers = ring::connect(wopts, ropts);
  const int rank = workers->rank();

  std::vector<size_t> sizes;
  if (o.dense) {
    for (size_t b = o.min_bytes; b <= o.max_bytes; b = std::max(b + 1, size_t(double(b) * o.factor)))
      sizes.push_back(b / 4 * 4);
  }
  std::vector<ps::KeySpec> keys;
  for (size_t b : sizes) keys.push_back({"dense/" + std::to_string(b), b / 4});
  if (o.sparse) keys.push_back({"embedding", o.rows, o.cols});
  ps::Client client(*world, keys, popts);

  std::vector<PsResult> results;
  for (size_t b : sizes) {
    const std::string key = "dense/" + std::to_string(b);
    std::vector<float> data(b / 4, 1.0f), out(b / 4, 0.0f);
    PsResult r{"dense", b, 2 * b};
    r.ps_ms = time_ms(*workers, o.warmup, o.iters, [&] {
      auto push = client.push_async(key, data.data(), data.size(), DataType::f32);
      client.pull(key, out.data(), out.size(), DataType::f32);
      push.wait();
    });
    r.ok = out.front() == float(nworkers) && out.back() == float(nworkers);
    r.allreduce_ms = time_ms(*workers, o.warmup, o.iters, [&] {
      workers->allreduce(data.data(), out.data(), data.size(), DataType::f32, ReduceOp::sum);
    });
    r.ok = r.ok && out.front() == float(nworkers);
    results.push_back(r);
  }
  if (o.sparse) {
    const size_t n = std::max<size_t>(1, size_t(double(o.rows) * o.fraction));
    std::vector<float> rows(n * o.cols, 1.0f), got(n * o.cols, 0.0f);
    std::vector<int64_t> ids(n);
    std::mt19937_64 rng(1234 + uint64_t(rank));
    std::uniform_int_distribution<int64_t> pick(0, int64_t(o.rows) - 1);
    PsResult r{"sparse", o.rows * o.cols * 4, 2 * n * (o.cols * 4 + 8)};
    r.ps_ms = time_ms(*workers, 1, o.sparse_steps, [&] {
      for (auto& id : ids) id = pick(rng);  // this step's batch touches these rows
      client.push_rows("embedding", ids.data(), n, rows.data(), DataType::f32);
      client.pull_rows("embedding", ids.data(), n, got.data(), DataType::f32);
    });
    r.ok = std::all_of(got.begin(), got.end(), [&](float x) { return x >= 1.0f && x <= float(nworkers * n); });
    std::vector<float> gradient(o.rows * o.cols, 0.0f);
    r.allreduce_ms = time_ms(*workers, 1, o.sparse_steps, [&] {
      workers->allreduce(gradient.data(), gradient.size(), DataType::f32, ReduceOp::sum);
    });
    results.push_back(r);
  }
  client.close();
  bool ok = true;
  for (auto& r : results) {
    int good = r.ok ? 1 : 0;
    workers->allreduce(&good, 1, DataType::i32, ReduceOp::min);
    r.ok = good == 1;
    ok = ok && r.ok;
  }
  if (rank != 0) return ok ? 0 : 1;

  if (o.format == "json") {
    nlohmann::json j;
    j["workers"] = nworkers;
    j["servers"] = popts.servers;
    j["transport"] = world->transport_summary();
    for (const auto& r : results) {
      j["results"].push_back({{"kind", r.kind},
                              {"bytes", r.bytes},
                              {"ps_bytes_per_worker", r.ps_bytes},
                              {"ps_ms", r.ps_ms},
                              {"allreduce_ms", r.allreduce_ms},
                              {"ratio", r.allreduce_ms / r.ps_ms},
                              {"ok", r.ok}});
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("# tandem bench ps: %d workers, %d server(s), transport %s\n", nworkers, popts.servers,
                world->transport_summary().c_str());
    if (o.sparse) {
      std::printf("# sparse: %zu x %zu f32 embedding, %.2f%% of rows per worker per step (push_rows + pull_rows)\n",
                  o.rows, o.cols, 100 * o.fraction);
    }
    std::printf("%8s %10s %14s %14s %16s %10s %4s\n", "kind", "bytes", "ps (ms)", "allreduce(ms)", "ps moved/worker",
                "ar/ps", "ok");
    for (const auto& r : results) {
      std::printf("%8s %10s %14.3f %14.3f %16s %10.2f %4s\n", r.kind.c_str(), human_bytes(r.bytes).c_str(), r.ps_ms,
                  r.allreduce_ms, human_bytes(r.ps_bytes).c_str(), r.allreduce_ms / r.ps_ms, r.ok ? "ok" : "BAD");
    }
  }
  if (!o.plot.empty()) plot(o, results, nworkers, popts.servers);
  return ok ? 0 : 1;
}

}  // namespace tandem::bench
