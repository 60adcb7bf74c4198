// Flight recorder and `tandem doctor`: three ranks run four all-reduces, then
// rank 1 stalls before the fifth. Ranks 0 and 2 time out in call #5 and dump;
// rank 1 dumps on SIGUSR1 from the test. The dumps hold the calls with their
// states, and the doctor names call #5 and rank 1 as the one that never
// entered it. Hand-made dumps check the doctor's other verdicts, and abort()
// dumps too, and a dump taken while calls are recorded reads whole entries.
#include "flight_recorder.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "command.h"
#include "multiprocess.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"

namespace tandem::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using nlohmann::json;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tandem-flight-test-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::string doctor(const std::string& args, int* status) {
  const std::string bin = env("TANDEM_BIN");
  auto out = run(bin + " doctor " + args, 30);
  *status = out.status;
  return out.text;
}

TEST(FlightRecorder, TimeoutAndSigusr1DumpsAndTheDoctorNamesTheStalledRank) {
  if (env("TANDEM_BIN").empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  TempDir dir;
  const fs::path ready = dir.path / "rank1-stalled";
  CommOptions base;
  base.timeout = 2s;
  base.flight_dir = dir.path;
  base.job_id = "flight";
  RankGroup group(
      3,
      [&](const CommOptions& o) {
        auto comm = ring::connect(o, {});
        std::vector<float> x(1000);
        for (int i = 0; i < 4; ++i) {
          std::fill(x.begin(), x.end(), 1.0f);
          comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
          if (x[0] != 3.0f) return 9;
        }
        if (o.rank == 1) {
          std::ofstream(ready) << "stalled\n";
          std::this_thread::sleep_for(60s);  // stuck outside any collective; the test kills it
          return 8;
        }
        try {
          comm->allreduce(x.data(), x.size(), DataType::f32, ReduceOp::sum);
        } catch (const Timeout&) {
          return 0;
        }
        return 7;
      },
      base);
  const auto until = Clock::now() + 30s;
  while (!fs::exists(ready) && Clock::now() < until) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(fs::exists(ready)) << "rank 1 never got past call #4";
  const fs::path dump1 = dir.path / "tandem-flight-flight-rank1.json";
  kill(group.pid(1), SIGUSR1);
  while (!fs::exists(dump1) && Clock::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(fs::exists(dump1)) << "SIGUSR1 wrote no dump";
  auto codes = group.wait_for_all_but(1, 30s);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[2], 0);

  for (int r : {0, 2}) {
    json d = read_json(dir.path / ("tandem-flight-flight-rank" + std::to_string(r) + ".json"));
    EXPECT_EQ(d["rank"], r);
    EXPECT_EQ(d["size"], 3);
    EXPECT_EQ(d["reason"], "timeout at call #5");
    ASSERT_EQ(d["entries"].size(), 5u);
    for (int i = 0; i < 5; ++i) {
      const json& e = d["entries"][i];
      EXPECT_EQ(e["seq"], i + 1);
      EXPECT_EQ(e["kind"], "allreduce");
      EXPECT_EQ(e["dtype"], "f32");
      EXPECT_EQ(e["op"], "sum");
      EXPECT_EQ(e["count"], 1000);
      EXPECT_EQ(e["peers"].size(), 2u);
      EXPECT_EQ(e["state"], i < 4 ? "completed" : "failed");
      EXPECT_LE(e["started_us"].get<int64_t>(), e["finished_us"].get<int64_t>());
    }
    EXPECT_NE(d["entries"][4]["error"].get<std::string>().find("timed out"), std::string::npos);
  }
  json d1 = read_json(dump1);
  EXPECT_EQ(d1["reason"], "SIGUSR1");
  ASSERT_EQ(d1["entries"].size(), 4u);
  EXPECT_EQ(d1["entries"][3]["state"], "completed");

  int status = 0;
  const std::string text = doctor(dir.path.string() + "/tandem-flight-flight-rank*.json", &status);
  EXPECT_EQ(status, 1) << text;
  EXPECT_NE(text.find("first divergence: call #5, allreduce(1000 x f32, sum): entered by ranks 0, 2; rank 1 never "
                      "entered it"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("rank 1's last call: #4"), std::string::npos) << text;
}

// Hand-made dumps: one per rank, calls as the recorder writes them.
json call(int seq, const char* dtype, int count, const char* state = "completed") {
  return {{"seq", seq}, {"kind", "allreduce"}, {"dtype", dtype}, {"op", "sum"},    {"count", count},
          {"root", -1}, {"peers", {1}},        {"state", state}, {"started_us", 1}};
}

void write_dump(const fs::path& p, int rank, int size, json entries) {
  json d = {{"rank", rank},
            {"size", size},
            {"host", "h"},
            {"pid", 1},
            {"job", "j"},
            {"reason", "test"},
            {"entries", std::move(entries)}};
  std::ofstream(p) << d.dump();
}

TEST(Doctor, NamesTheFieldThatDiffers) {
  if (env("TANDEM_BIN").empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  TempDir dir;
  write_dump(dir.path / "a.json", 0, 2, {call(7, "f32", 10), call(8, "f32", 10), call(9, "f32", 10, "failed")});
  write_dump(dir.path / "b.json", 1, 2, {call(8, "f32", 10), call(9, "f16", 10, "failed")});
  int status = 0;
  const std::string text = doctor((dir.path / "a.json").string() + " " + (dir.path / "b.json").string(), &status);
  EXPECT_EQ(status, 1) << text;
  EXPECT_NE(text.find("first divergence: call #9: the dtype differs: rank 0 called allreduce(10 x f32, sum), rank 1 "
                      "called allreduce(10 x f16, sum)"),
            std::string::npos)
      << text;
}

TEST(Doctor, AgreeingDumpsAndAMissingRank) {
  if (env("TANDEM_BIN").empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  TempDir dir;
  write_dump(dir.path / "a.json", 0, 3, {call(1, "f32", 4), call(2, "f32", 4)});
  write_dump(dir.path / "b.json", 2, 3, {call(1, "f32", 4), call(2, "f32", 4)});
  int status = 0;
  std::string text = doctor((dir.path / "a.json").string() + " " + (dir.path / "b.json").string(), &status);
  EXPECT_EQ(status, 0) << text;
  EXPECT_NE(text.find("no dump from rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("every rank completed calls #1..#2"), std::string::npos) << text;

  std::ofstream(dir.path / "bad.json") << "{ not json";
  text = doctor((dir.path / "bad.json").string(), &status);
  EXPECT_EQ(status, 2) << text;
  EXPECT_NE(text.find("is not a flight-recorder dump"), std::string::npos) << text;
}

TEST(FlightRecorder, AbortDumpsWithTheReason) {
  TempDir dir;
  CommOptions o;
  o.rank = 0;
  o.size = 1;
  o.job_id = "abort-test";
  o.flight_dir = dir.path;
  auto comm = ring::connect(o, {});
  std::vector<double> x(8, 2.0);
  comm->allreduce(x.data(), x.size(), DataType::f64, ReduceOp::sum);
  comm->abort("stopping for a test");
  json d = read_json(dir.path / "tandem-flight-abort-test-rank0.json");
  EXPECT_EQ(d["reason"], "abort: stopping for a test");
  ASSERT_EQ(d["entries"].size(), 1u);
  EXPECT_EQ(d["entries"][0]["dtype"], "f64");
  EXPECT_EQ(d["entries"][0]["state"], "completed");
}

TEST(FlightRecorder, WithoutADirectoryDumpsIntoTmpdir) {
  TempDir dir;
  const char* saved = std::getenv("TMPDIR");
  const std::string previous = saved ? saved : "";
  ::setenv("TMPDIR", dir.path.c_str(), 1);
  CommOptions o;
  o.rank = 0;
  o.size = 1;
  o.job_id = "tmpdir-test";
  auto comm = ring::connect(o, {});
  comm->abort("stopping for a test");
  if (saved) {
    ::setenv("TMPDIR", previous.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  EXPECT_TRUE(fs::exists(dir.path / "tandem-flight-tmpdir-test-rank0.json"));
}

// Recording takes no lock: a dump from another thread (SIGUSR1, abort) must
// still see each entry whole. One thread records calls whose fields all
// derive from the sequence number; another dumps meanwhile. (The CI's
// ThreadSanitizer run includes this test.)
TEST(FlightRecorder, DumpWhileRecordingReadsWholeEntries) {
  CommOptions o;
  o.rank = 0;
  o.size = 2;
  FlightRecorder recorder(o, 16, fs::temp_directory_path().string());
  constexpr uint64_t kCalls = 200000;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    for (uint64_t seq = 1; seq <= kCalls; ++seq) {
      const bool fails = seq % 7 == 0;
      recorder.begin(seq,
                     {seq % 2 ? Collective::allreduce : Collective::alltoall, DataType::f32,
                      seq % 2 ? std::optional(ReduceOp::max) : std::nullopt, size_t(seq * 3), int(seq % 5) - 1},
                     seq % 3 == 0, Clock::now());
      if (seq % 11 != 0) recorder.end(seq, !fails, fails ? "error " + std::to_string(seq) : "");
    }
    done = true;
  });
  size_t dumps = 0, entries = 0;
  while (!done || dumps == 0) {
    const json d = json::parse(recorder.json("test"));
    ++dumps;
    uint64_t previous = 0;
    for (const json& e : d["entries"]) {
      ++entries;
      const uint64_t seq = e["seq"];
      EXPECT_GT(seq, previous);
      previous = seq;
      EXPECT_EQ(e["kind"], seq % 2 ? "allreduce" : "alltoall") << e;
      EXPECT_EQ(e["count"], seq * 3) << e;
      EXPECT_EQ(e["root"], int(seq % 5) - 1) << e;
      EXPECT_EQ(e["dtype"], "f32") << e;
      EXPECT_EQ(e.contains("op"), seq % 2 == 1) << e;
      EXPECT_EQ(e["path"], seq % 3 == 0 ? "shared_memory" : "ucx") << e;
      const std::string state = e["state"];
      if (state == "running") {
        EXPECT_FALSE(e.contains("finished_us")) << e;
      } else {
        EXPECT_NE(seq % 11, 0u) << e;
        EXPECT_EQ(state, seq % 7 == 0 ? "failed" : "completed") << e;
        if (state == "failed") {
          EXPECT_EQ(e["error"], "error " + std::to_string(seq)) << e;
        }
      }
    }
  }
  writer.join();
  const json last = json::parse(recorder.json("test"));
  ASSERT_EQ(last["entries"].size(), 16u);
  EXPECT_EQ(last["entries"][15]["seq"], kCalls);
  EXPECT_GT(entries, 0u);
}

}  // namespace
}  // namespace tandem::testing
