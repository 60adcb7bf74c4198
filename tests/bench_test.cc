// `tandem bench` end to end under `tandem launch` and under mpirun: the JSON
// rows follow the contract other tools read, and the data check passes.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "command.h"

namespace {

using tandem::testing::Output;
using tandem::testing::run;

std::vector<nlohmann::json> json_rows(const std::string& text) {
  std::vector<nlohmann::json> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    auto brace = line.find('{');
    if (brace == std::string::npos) continue;
    rows.push_back(nlohmann::json::parse(line.substr(brace)));
  }
  return rows;
}

std::string bin() {
  const char* b = std::getenv("TANDEM_BIN");
  return b ? b : "";
}

void expect_contract(const std::vector<nlohmann::json>& rows, int nranks, size_t sizes) {
  ASSERT_EQ(rows.size(), 2 * sizes) << "one row per size and placement";
  for (const auto& r : rows) {
    for (const char* key : {"collective", "nranks", "bytes", "count", "dtype", "op", "inplace", "time_us", "algbw_gbps",
                            "busbw_gbps", "wrong"}) {
      EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
    }
    EXPECT_EQ(r["collective"], "allreduce");
    EXPECT_EQ(r["nranks"], nranks);
    EXPECT_EQ(r["wrong"], 0) << r.dump();
    EXPECT_GT(r["time_us"].get<double>(), 0);
    const double algbw = r["bytes"].get<double>() / r["time_us"].get<double>() / 1e3;
    EXPECT_NEAR(r["algbw_gbps"].get<double>(), algbw, 1e-6 + algbw * 1e-6);
    EXPECT_NEAR(r["busbw_gbps"].get<double>(), algbw * 2.0 * (nranks - 1) / nranks, 1e-6 + algbw * 1e-6);
  }
}

TEST(Bench, JsonRowsUnderTandemLaunch) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  for (const char* dtype : {"f32", "f16", "i32"}) {
    Output o = run(bin() + " launch -n 3 -- " + bin() + " bench allreduce -b 1K -e 1M -f 32 -n 3 -w 1 -c 1 -d " +
                   dtype + " -o avg --format json");
    ASSERT_EQ(o.status, 0) << o.text;
    auto rows = json_rows(o.text);
    expect_contract(rows, 3, 3);  // 1 KiB, 32 KiB, 1 MiB
    for (const auto& r : rows) EXPECT_EQ(r["dtype"], dtype);
  }
}

// One collective's sweep over 1K, 32K and 1M: nccl-tests' sizes (bytes =
// count * element size * blocks), busbw factor, root column, a clean data
// check, and a row per placement (sendrecv has no in-place form: one row per size).
struct Expect {
  const char* collective;
  double factor;
  size_t blocks;
  int root;  // the root column: -1 where the collective has none
  bool in_place;
  const char* flags;
};

void expect_collective(const Expect& e, int n) {
  SCOPED_TRACE(e.collective);
  Output o = run(bin() + " launch -n " + std::to_string(n) + " -- " + bin() + " bench " + e.collective +
                 " -b 1K -e 1M -f 32 -n 3 -w 1 -c 1 --format json " + e.flags);
  ASSERT_EQ(o.status, 0) << o.text;
  auto rows = json_rows(o.text);
  ASSERT_EQ(rows.size(), e.in_place ? 6u : 3u) << o.text;
  for (const auto& r : rows) {
    EXPECT_EQ(r["collective"], e.collective);
    EXPECT_EQ(r["nranks"], n);
    EXPECT_EQ(r["wrong"], 0) << r.dump();
    EXPECT_EQ(r["checked"], true) << r.dump();
    if (!e.in_place) {
      EXPECT_EQ(r["inplace"], false) << r.dump();
    }
    const size_t esize = r["dtype"] == "i64" || r["dtype"] == "f64" ? 8 : r["dtype"] == "f32" ? 4 : 2;
    EXPECT_EQ(r["bytes"].get<size_t>(), r["count"].get<size_t>() * esize * e.blocks) << r.dump();
    EXPECT_EQ(r["root"], e.root) << r.dump();
    const double algbw = r["bytes"].get<double>() / r["time_us"].get<double>() / 1e3;
    EXPECT_NEAR(r["algbw_gbps"].get<double>(), algbw, 1e-6 + algbw * 1e-6);
    EXPECT_NEAR(r["busbw_gbps"].get<double>(), algbw * e.factor, 1e-6 + algbw * 1e-6);
  }
}

// The other collectives, one run each.
TEST(Bench, EveryCollectiveUnderTandemLaunch) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const int n = 3;
  for (const Expect& e : {Expect{"reduce_scatter", double(n - 1) / n, n, -1, true, "-o max -d bf16"},
                          Expect{"allgather", double(n - 1) / n, n, -1, true, "-d i64"},
                          Expect{"broadcast", 1.0, 1, 2, true, "-r 2 -d f16"},
                          // Blocks of varied sizes between every pair (varied_blocks), no in-place form.
                          Expect{"alltoallv", double(n - 1) / n, n, -1, false, "-d i64"},
                          // The variable-size forms with equal blocks.
                          Expect{"allgatherv", double(n - 1) / n, n, -1, true, "-d f16"},
                          Expect{"reduce_scatterv", double(n - 1) / n, n, -1, true, "-o sum -d f32"}}) {
    expect_collective(e, n);
  }
  Output b = run(bin() + " launch -n " + std::to_string(n) + " -- " + bin() + " bench barrier -n 20 --format json");
  ASSERT_EQ(b.status, 0) << b.text;
  auto rows = json_rows(b.text);
  ASSERT_EQ(rows.size(), 1u) << b.text;
  EXPECT_EQ(rows[0]["collective"], "barrier");
  EXPECT_GT(rows[0]["time_us"].get<double>(), 0);
  EXPECT_EQ(rows[0]["bytes"], 0);
}

// nccl-tests' reduce, alltoall, gather, scatter and sendrecv at 2 ranks, where
// the factors differ: (n-1)/n = 0.5 for alltoall, gather and scatter, 1 for
// reduce and sendrecv. Size: alltoall a rank's whole send buffer, gather and
// scatter the root's buffer (2 blocks); reduce and sendrecv one buffer.
TEST(Bench, NcclTestsRootedAlltoallAndSendrecv) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const int n = 2;
  for (const Expect& e :
       {Expect{"reduce", 1.0, 1, 1, true, "-r 1 -o max -d f16"}, Expect{"reduce", 1.0, 1, 0, true, "-o sum"},
        Expect{"alltoall", 0.5, n, -1, true, "-d i64"}, Expect{"gather", 0.5, n, 1, true, "-r 1"},
        Expect{"scatter", 0.5, n, 1, true, "-r 1 -d bf16"}, Expect{"sendrecv", 1.0, 1, -1, false, "-d f64"}}) {
    expect_collective(e, n);
  }
  // The comparison scripts' call (bench/anchors/run_tandem.sh): one size, rows of exactly that many bytes.
  Output a =
      run(bin() + " launch -n 2 -- " + bin() + " bench alltoall -b 4096 -e 4096 -n 5 -w 5 -c 1 -d f32 --format json");
  ASSERT_EQ(a.status, 0) << a.text;
  for (const auto& r : json_rows(a.text)) EXPECT_EQ(r["bytes"], 4096) << r.dump();
  // The table: sendrecv's in-place columns say N/A; the check still passes.
  Output t = run(bin() + " launch -n 2 -- " + bin() + " bench sendrecv -b 4K -e 64K -f 16 -n 2 -w 1");
  ASSERT_EQ(t.status, 0) << t.text;
  EXPECT_NE(t.text.find("N/A"), std::string::npos) << t.text;
  EXPECT_NE(t.text.find("# Out of bounds values : 0 OK"), std::string::npos) << t.text;
  Output one = run(bin() + " launch -n 1 -- " + bin() + " bench sendrecv -b 4K -e 4K");
  EXPECT_EQ(one.status, 2) << one.text;
  EXPECT_NE(one.text.find("needs 2 or more ranks"), std::string::npos) << one.text;
  Output bad = run(bin() + " bench send_recv");
  EXPECT_EQ(bad.status, 2) << bad.text;
  EXPECT_NE(bad.text.find("sendrecv"), std::string::npos) << "the error should list the collectives: " << bad.text;
}

// --compress: the same contract, plus 16-bit wire bytes and the error against
// the f32 result, within compression::error_bound (#wrong counts the elements beyond it).
TEST(Bench, CompressedAllreduceReportsWireBytesAndError) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  for (const char* codec : {"fp16", "bf16"}) {
    SCOPED_TRACE(codec);
    Output o = run(bin() + " launch -n 2 -- " + bin() + " bench allreduce -b 4K -e 1M -f 16 -n 3 -w 1 -c 1 -o avg" +
                   " --compress " + codec + " --format json");
    ASSERT_EQ(o.status, 0) << o.text;
    auto rows = json_rows(o.text);
    expect_contract(rows, 2, 3);
    for (const auto& r : rows) {
      EXPECT_EQ(r["compress"], codec);
      EXPECT_EQ(r["wire_bytes"].get<double>(), r["bytes"].get<double>() / 2) << r.dump();
      EXPECT_EQ(r["fallbacks"], 0);
      // Inputs in [-1, 1]: a rounding error shows, and stays far below one input's size.
      EXPECT_GT(r["max_abs_error"].get<double>(), 0) << r.dump();
      EXPECT_LT(r["max_abs_error"].get<double>(), std::string(codec) == "fp16" ? 2e-3 : 2e-2) << r.dump();
      EXPECT_LE(r["mean_abs_error"].get<double>(), r["max_abs_error"].get<double>());
    }
  }
  Output table = run(bin() + " launch -n 2 -- " + bin() + " bench allreduce -b 64K -e 64K -n 2 -w 1 --compress fp16");
  ASSERT_EQ(table.status, 0) << table.text;
  EXPECT_NE(table.text.find("# compression: fp16 on the wire"), std::string::npos) << table.text;
  EXPECT_NE(table.text.find("max err"), std::string::npos) << table.text;
  Output bad = run(bin() + " launch -n 1 -- " + bin() + " bench allgather --compress fp16");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.text.find("--compress works on allreduce of f32"), std::string::npos) << bad.text;
}

TEST(Bench, UnderMpirun) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "mpirun not found: install openmpi-bin to run this test";
  }
  Output o = run("mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo -n 2 " + bin() +
                 " bench allreduce -b 4K -e 4M -f 32 -n 3 -w 1 -c 1 --format json");
  ASSERT_EQ(o.status, 0) << o.text;
  expect_contract(json_rows(o.text), 2, 3);
}

TEST(Bench, TableCsvAndPlot) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  Output t = run(bin() + " launch -n 2 -- " + bin() + " bench allreduce -b 8 -e 64K -f 16 -n 2 -w 1");
  ASSERT_EQ(t.status, 0) << t.text;
  EXPECT_NE(t.text.find("# Out of bounds values : 0 OK"), std::string::npos) << t.text;
  EXPECT_NE(t.text.find("# Avg bus bandwidth"), std::string::npos) << t.text;

  Output c = run(bin() + " launch -n 2 -- " + bin() + " bench allreduce -b 1K -e 1K -n 2 -w 1 --format csv");
  ASSERT_EQ(c.status, 0) << c.text;
  EXPECT_NE(c.text.find("collective,bytes,count,dtype,op,root,inplace,time_us"), std::string::npos) << c.text;

  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot not installed";
  // A quote in the path: gnuplot runs without a shell and reads the paths as its own quoted strings.
  const std::string png = ::testing::TempDir() + "tandem_bench_test_it's_" + std::to_string(getpid()) + ".png";
  Output p =
      run(bin() + " launch -n 2 -- " + bin() + " bench allreduce -b 1K -e 64K -f 8 -n 2 -w 1 --plot \"" + png + "\"");
  ASSERT_EQ(p.status, 0) << p.text;
  std::ifstream f(png, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG") << "no PNG written: " << p.text;
  std::remove(png.c_str());
}

TEST(Bench, RejectsBadFlags) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  Output o = run(bin() + " bench allreduce -d f12");
  EXPECT_EQ(o.status, 2) << o.text;
  EXPECT_NE(o.text.find("f32"), std::string::npos) << "the error should list valid dtypes: " << o.text;
  Output e = run(bin() + " bench allreduce -b 1M -e 1K");
  EXPECT_NE(e.status, 0) << e.text;
}

}  // namespace

namespace {

// The overlap bench end to end: every mode reports, the data check passes,
// fused buckets are fewer than gradients, per-gradient has one each.
// Each element reduced once on one host: the busiest rank's counted shared-memory
// traffic per payload byte stays a small constant at 8 ranks (heap buffers, the
// staged path; folding every rank's slot moved N + 3 = 11).
TEST(BenchTraffic, EightRanksMoveAtMostSixBytesPerPayloadByte) {
  for (const char* collective : {"allreduce", "reduce_scatter"}) {
    const auto out =
        run(bin() + " launch -n 8 -- " + bin() + " bench " + collective + " -b 16M -e 16M -n 2 -w 1 -c 1 --format json",
            300);
    ASSERT_EQ(out.status, 0) << out.text;
    const auto rows = json_rows(out.text);
    ASSERT_EQ(rows.size(), 2u) << out.text;
    for (const auto& r : rows) {
      EXPECT_EQ(r["wrong"], 0) << r.dump();
      if (!r["inplace"].get<bool>()) continue;  // out of place adds the copy into the output
      EXPECT_GT(r["traffic_per_byte"].get<double>(), 1.0) << r.dump();
      EXPECT_LE(r["traffic_per_byte"].get<double>(), 6.0) << r.dump();
    }
  }
}

TEST(BenchOverlap, EveryModeReportsWithCorrectGradients) {
  const auto out = run(bin() + " launch -n 2 -- " + bin() +
                           " bench overlap --model uniform:24:4K:64K --compute-ms 5 --steps 3 --warmup 1"
                           " --modes none,overlap,per-gradient,autotune,grid --grid-steps 1 --autotune-samples 2"
                           " --steps-per-sample 1 --threshold 256K --first-bucket 64K --format json",
                       240);
  ASSERT_EQ(out.status, 0) << out.text;
  std::vector<nlohmann::json> modes;
  for (const auto& r : json_rows(out.text))
    if (r.contains("mode")) modes.push_back(r);
  ASSERT_EQ(modes.size(), 5u) << out.text;
  const char* names[] = {"none", "overlap", "per-gradient", "autotune", "grid"};
  for (size_t i = 0; i < modes.size(); ++i) {
    const auto& m = modes[i];
    EXPECT_EQ(m["mode"], names[i]);
    EXPECT_EQ(m["wrong"], 0) << m.dump();
    EXPECT_GT(m["step_ms"].get<double>(), 0.0);
    EXPECT_GE(m["hidden_fraction"].get<double>(), 0.0);
    EXPECT_LE(m["hidden_fraction"].get<double>(), 1.0);
  }
  EXPECT_EQ(modes[2]["buckets"], 24);  // one all-reduce per gradient
  EXPECT_LT(modes[1]["buckets"].get<int>(), 24);
  EXPECT_DOUBLE_EQ(modes[0]["speedup_vs_first_mode"].get<double>(), 1.0);
}

TEST(BenchOverlap, CompressionListRunsEveryModeWithEachCodec) {
  const auto out = run(bin() + " launch -n 2 -- " + bin() +
                           " bench overlap --model uniform:16:4K:64K --compute-ms 2 --steps 2 --warmup 1"
                           " --modes none,overlap --compress none,fp16 --format json",
                       120);
  ASSERT_EQ(out.status, 0) << out.text;
  std::vector<std::string> names;
  for (const auto& r : json_rows(out.text))
    if (r.contains("mode")) {
      names.push_back(r["mode"]);
      EXPECT_EQ(r["wrong"], 0) << r.dump();
      EXPECT_TRUE(r.contains("compression_saved_estimate_ms"));
    }
  EXPECT_EQ(names, (std::vector<std::string>{"none", "overlap", "none+fp16", "overlap+fp16"})) << out.text;
  const auto bad = run(bin() + " launch -n 1 -- " + bin() + " bench overlap --compress none,fp8", 60);
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.text.find("--compress 'fp8'"), std::string::npos) << bad.text;
}

TEST(BenchOverlap, BadModelAndModeAreNamed) {
  auto out = run(bin() + " launch -n 1 -- " + bin() + " bench overlap --model uniform:0:4K", 60);
  EXPECT_NE(out.status, 0);
  EXPECT_NE(out.text.find("uniform:COUNT:MIN:MAX"), std::string::npos) << out.text;
  out = run(bin() + " launch -n 1 -- " + bin() + " bench overlap --modes none,fast", 60);
  EXPECT_NE(out.status, 0);
  EXPECT_NE(out.text.find("unknown mode 'fast'"), std::string::npos) << out.text;
}

}  // namespace

namespace {

std::string bench_bin() { return tandem::testing::env("TANDEM_BIN"); }

std::string scratch(const std::string& name) {
  return ::testing::TempDir() + "tandem_bench_" + std::to_string(getpid()) + "_" + name;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// nccl-tests' command lines as its README and users write them, with only the
// binary name changed (`./build/all_reduce_perf` -> `tandem bench
// all_reduce_perf`), each under `tandem launch -n 2` as under `mpirun -np 2`.
TEST(BenchNcclTests, CommandLinesRunWithOnlyTheBinaryNameChanged) {
  if (bench_bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const std::string json = scratch("out.json");
  const std::vector<std::string> lines = {
      "all_reduce_perf -b 8 -e 128M -f 2 -g 1",
      "all_gather_perf -b 8 -e 1M -f 2 -g 1",
      "reduce_scatter_perf -b 8 -e 1M -f 2 -t 1 -g 1",
      "broadcast_perf -b 8 -e 1M -f 2 -g 1 -r all",
      "reduce_perf -b 1K -e 64K -f 4 -o max -r 1",
      "alltoall_perf -b 1K -e 1M -f 4 -g 1",
      "sendrecv_perf -b 8 -e 1M -f 2 -g 1",
      "scatter_perf -b 1K -e 64K -f 8 -r all",
      "gather_perf -b 1K -e 64K -f 8 -d half",
      "hypercube_perf -b 8 -e 1M -f 2 -g 1",
      "all_reduce_perf -b 1M -e 4M -f 2 -n 50 -w 10 -c 0",
      "all_reduce_perf -b 8 -e 4K -f 2 -d all -o all",
      "all_reduce_perf -b 8 -e 1M -f 2 -g 1 -a 3",
      "all_reduce_perf -b 8 -e 1M -f 2 -g 1 -z 1",
      "all_reduce_perf -b 8 -e 1M -f 2 -g 1 -m 4",
      "all_reduce_perf -b 8 -e 64K -f 2 -g 1 -N 2",
      "all_reduce_perf -b 8 -e 1M -f 2 -g 1 -T 30",
      "all_reduce_perf -b 8 -e 1M -f 2 -g 1 -J " + json,
      "all_reduce_perf -b 8 -e 1M -f 2 -g 1 -p 1 -R 2 -C 1 -S 1 -G 0 -y 0",
  };
  for (const auto& line : lines) {
    SCOPED_TRACE(line);
    const Output o = run(bench_bin() + " launch -n 2 -- " + bench_bin() + " bench " + line, 120);
    EXPECT_EQ(o.status, 0) << o.text;
    if (line.find("-c 0") == std::string::npos) {
      EXPECT_NE(o.text.find("# Out of bounds values : 0 OK"), std::string::npos) << o.text;
    }
    EXPECT_EQ(o.text.find("FAILED"), std::string::npos) << o.text;
  }
  // -J: rank 0's JSON lines, no launcher prefix, the spread of every size.
  const auto rows = json_rows(read_text(json));
  ASSERT_EQ(rows.size(), 2u * 18) << read_text(json);  // 8 B .. 1 MiB, both placements
  EXPECT_EQ(read_text(json).find("[0]"), std::string::npos);
  for (const auto& r : rows) {
    EXPECT_EQ(r["collective"], "allreduce");
    EXPECT_EQ(r["rank_time"], "avg");
    EXPECT_LE(r["time_min_us"].get<double>(), r["time_p50_us"].get<double>()) << r.dump();
    EXPECT_LE(r["time_p50_us"].get<double>(), r["time_p99_us"].get<double>()) << r.dump();
    EXPECT_LE(r["time_p99_us"].get<double>(), r["time_max_us"].get<double>()) << r.dump();
    EXPECT_GE(r["time_slowest_us"].get<double>(), r["time_us"].get<double>()) << r.dump();
  }
  std::remove(json.c_str());
}

// -a: which rank's time the table shows; -m, -N and -d/-o all in the rows; -J FILE.csv.
TEST(BenchNcclTests, RankTimeAggregationCyclesAndFiles) {
  if (bench_bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const std::string launch = bench_bin() + " launch -n 2 -- " + bench_bin() + " bench ";
  Output o = run(launch + "all_reduce -b 4K -e 4K -n 5 -w 1 -a 3 -m 3 -N 2 --format json");
  ASSERT_EQ(o.status, 0) << o.text;
  auto rows = json_rows(o.text);
  ASSERT_EQ(rows.size(), 4u) << o.text;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["rank_time"], "max");
    EXPECT_EQ(rows[i]["time_us"], rows[i]["time_slowest_us"]) << rows[i].dump();
    EXPECT_EQ(rows[i]["agg_iters"], 3);
    EXPECT_EQ(rows[i]["cycle"], int(i / 2 + 1));
    EXPECT_EQ(rows[i]["wrong"], 0);
  }
  o = run(launch + "allgather -b 1K -e 2K -f 2 -n 2 -w 0 -d all");
  ASSERT_EQ(o.status, 0) << o.text;
  size_t tables = 0;
  for (size_t at = 0; (at = o.text.find("# tandem bench allgather", at)) != std::string::npos; ++at) ++tables;
  EXPECT_EQ(tables, 7u) << "one table per type: " << o.text;
  EXPECT_NE(o.text.find("# time: the mean over ranks (-a 1)"), std::string::npos) << o.text;

  const std::string csv = scratch("rows.csv");
  o = run(launch + "alltoall -b 1K -e 4K -f 4 -n 2 -w 0 -J " + csv);
  ASSERT_EQ(o.status, 0) << o.text;
  const std::string text = read_text(csv);
  EXPECT_EQ(text.rfind("collective,bytes,count,dtype,op,root,inplace,time_us", 0), 0u) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 5) << text;  // the header, 2 sizes x 2 placements
  std::remove(csv.c_str());
}

TEST(BenchNcclTests, TimeoutFailsTheSizeWithoutHanging) {
  if (bench_bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const Output o =
      run(bench_bin() + " launch -n 2 -- " + bench_bin() + " bench all_reduce_perf -b 8M -e 8M -n 1000000 -T 1", 60);
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("took longer than -T 1 s"), std::string::npos) << o.text;
}

TEST(BenchNcclTests, GpuFlagsAndUnknownValuesAreRefusedByName) {
  if (bench_bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const std::pair<const char*, const char*> refused[] = {
      {"all_reduce_perf -b 8 -e 128M -f 2 -g 8", "tandem launch -n N"},
      {"all_reduce_perf -t 2", "one rank per process"},
      {"all_reduce_perf -G 1", "CUDA graphs need a GPU"},
      {"all_reduce_perf -y 1", "no CUDA streams"},
      {"all_reduce_perf -o mulsum", "mulsum"},
      {"all_reduce_perf -a 4", "-a/--average must be 0"},
      {"all_reduce_perf -F out.csv", "-J FILE.csv"},
      {"all_to_all_perf", "nccl-tests' names"},
  };
  for (const auto& [line, says] : refused) {
    const Output o = run(bench_bin() + " bench " + line);
    EXPECT_EQ(o.status, 2) << line << ": " << o.text;
    EXPECT_NE(o.text.find(says), std::string::npos) << line << ": " << o.text;
  }
  const Output cube = run(bench_bin() + " launch -n 3 -- " + bench_bin() + " bench hypercube_perf -b 1K -e 1K");
  EXPECT_NE(cube.status, 0) << cube.text;
  EXPECT_NE(cube.text.find("power-of-two number of ranks"), std::string::npos) << cube.text;
}

// Two crafted runs: one size alike, one slower, one faster beyond both spreads,
// and one only in A; the table says which, and the exit status stays 0.
TEST(BenchCompare, SaysSizeBySizeWhetherRunsDifferBeyondTheirSpread) {
  if (bench_bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const auto row = [](size_t bytes, double p50, double min, double p99) {
    nlohmann::json j = {{"collective", "allreduce"},
                        {"nranks", 2},
                        {"bytes", bytes},
                        {"dtype", "f32"},
                        {"op", "sum"},
                        {"root", -1},
                        {"inplace", true},
                        {"time_us", p50},
                        {"time_p50_us", p50},
                        {"time_min_us", min},
                        {"time_p99_us", p99}};
    return j.dump() + "\n";
  };
  const std::string a = scratch("a.json"), b = scratch("b.json");
  std::ofstream(a) << row(1024, 10, 9, 12) << row(4096, 20, 19, 22) << row(16384, 40, 38, 44) << row(65536, 80, 75, 90);
  // A launcher's "[0] " prefix is skipped.
  std::ofstream(b) << "[0] " << row(1024, 11, 9.5, 13) << row(4096, 30, 28, 33) << row(16384, 30, 29, 31);
  const Output o = run(bench_bin() + " bench --compare " + a + " " + b);
  ASSERT_EQ(o.status, 0) << o.text;
  const auto line_of = [&](const char* size) {
    const size_t at = o.text.find(size);
    return at == std::string::npos ? std::string() : o.text.substr(at, o.text.find('\n', at) - at);
  };
  EXPECT_NE(line_of(" 1024 ").find("same within noise"), std::string::npos) << o.text;
  EXPECT_NE(line_of(" 4096 ").find("B slower"), std::string::npos) << o.text;
  EXPECT_NE(line_of(" 4096 ").find("1.500"), std::string::npos) << o.text;
  EXPECT_NE(line_of(" 16384 ").find("B faster"), std::string::npos) << o.text;
  EXPECT_NE(line_of(" 65536 ").find("only in A"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("2 size(s) differ, 1 the same within noise"), std::string::npos) << o.text;

  std::ofstream(b) << "{\"collective\": \"allreduce\", \"bytes\": 8}\n";
  const Output bad = run(bench_bin() + " bench --compare " + a + " " + b);
  EXPECT_EQ(bad.status, 2) << bad.text;
  EXPECT_NE(bad.text.find(":1: not a tandem bench JSON row"), std::string::npos) << bad.text;
  const Output missing = run(bench_bin() + " bench --compare " + a + " " + scratch("none.json"));
  EXPECT_EQ(missing.status, 2) << missing.text;
  EXPECT_NE(missing.text.find("cannot read"), std::string::npos) << missing.text;
  std::remove(a.c_str());
  std::remove(b.c_str());
}

}  // namespace
