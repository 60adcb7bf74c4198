// The tandem tool's own parsing: sizes through CLI11's AsSizeValue, the
// launch command through CLI11's prefix command, `tandem bench`'s nccl-tests
// flags and names, and the log levels of TANDEM_LOG_LEVEL end to end under `tandem launch`.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "command.h"
#include "flags.h"
#include "launch_command.h"
#include "tandem/errors.h"
#include "tandem/settings.h"

namespace tandem::cli {
namespace {

using testing::Output;
using testing::run;
using Words = std::vector<std::string>;

TEST(CliSizes, NcclTestsFormsReadAsBefore) {
  constexpr size_t K = 1024, M = K * K, G = M * K;
  const std::pair<const char*, size_t> good[] = {{"0", 0},       {"8", 8},   {"4K", 4 * K},   {"4k", 4 * K},
                                                 {"4KB", 4 * K}, {"1M", M},  {"64M", 64 * M}, {"128mb", 128 * M},
                                                 {"1G", G},      {"1GB", G}, {"1GiB", G},     {"010", 10}};
  for (const auto& [text, bytes] : good) {
    EXPECT_EQ(parse_byte_size(text), std::optional<size_t>(bytes)) << text;
  }
  for (const char* bad :
       {"", "K", "4X", "-1", "1.5", "0x10", " 4K", "20000000000G", "18446744073709551616", "4BB", "4BiB", "4iB"}) {
    EXPECT_EQ(parse_byte_size(bad), std::nullopt) << "'" << bad << "'";
  }
  try {
    size_flag("-b/--minbytes", "4X");
    ADD_FAILURE() << "accepted 4X";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("-b/--minbytes: '4X' is not a size"), std::string::npos) << e.what();
  }
}

// `args` as main() passes them (after the program name): the launcher's flags and the command.
std::pair<launch::LaunchOptions, Words> parse_launch(Words args) {
  CLI::App app;
  LaunchFlags flags;
  add_launch(app, flags);
  const auto after = set_aside_after_separator(args);
  std::vector<char*> argv{const_cast<char*>("tandem")};
  for (auto& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return {flags.options, launch_command_words(*app.get_subcommand("launch"), after)};
}

TEST(CliLaunch, TheCommandIsSplitOffAsBefore) {
  auto [o, command] = parse_launch({"launch", "-n", "2", "--", "tandem", "bench", "allreduce", "-n", "3"});
  EXPECT_EQ(o.nprocs, 2);
  EXPECT_EQ(command, (Words{"tandem", "bench", "allreduce", "-n", "3"}));
  std::tie(o, command) = parse_launch({"launch", "-n", "3", "--grace=1", "tandem", "bench", "-n", "5"});
  EXPECT_EQ(o.nprocs, 3);
  EXPECT_EQ(command, (Words{"tandem", "bench", "-n", "5"}));
  std::tie(o, command) = parse_launch({"launch", "-n2", "sh", "-c", "echo x", "--", "y"});
  EXPECT_EQ(o.nprocs, 2);
  EXPECT_EQ(command, (Words{"sh", "-c", "echo x", "--", "y"}));
  std::tie(o, command) = parse_launch({"launch", "--", "-starts-with-dash", "a"});
  EXPECT_EQ(command, (Words{"-starts-with-dash", "a"}));
  std::tie(o, command) = parse_launch({"launch", "-n", "2"});
  EXPECT_TRUE(command.empty());
  EXPECT_THROW(parse_launch({"launch", "--bogus", "x"}), UsageError);
}

// `tandem bench` flags as main() reads them, into SweepOptions.
tandem::bench::SweepOptions parse_bench(Words args) {
  CLI::App app;
  BenchFlags flags;
  add_bench(app, flags);
  args.insert(args.begin(), "bench");
  std::vector<char*> argv{const_cast<char*>("tandem")};
  for (auto& a : args) argv.push_back(a.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return to_sweep_options(flags);
}

TEST(CliBench, NcclTestsFlagsAndNames) {
  using tandem::bench::RankTime;
  auto o = parse_bench({"all_reduce_perf", "-b", "8", "-e", "128M", "-f", "2", "-g", "1"});
  EXPECT_EQ(o.collective, "allreduce");
  EXPECT_EQ(o.max_bytes, size_t(128) << 20);
  EXPECT_EQ(o.rank_time, RankTime::avg) << "nccl-tests' default -a 1";
  o = parse_bench({"all_gather", "-d", "all", "-o", "all", "-r", "all", "-a", "3",  "-m", "4",  "-z",     "1",
                   "-N",         "2",  "-T",  "30", "-C",  "1",  "-S",  "1",  "-R", "2",  "-J", "out.csv"});
  EXPECT_EQ(o.collective, "allgather");
  EXPECT_EQ(o.dtypes.size(), std::size(tandem::kAllDataTypes));
  EXPECT_EQ(o.ops.size(), std::size(tandem::kAllReduceOps));
  EXPECT_TRUE(o.every_root);
  EXPECT_EQ(o.rank_time, RankTime::max);
  EXPECT_EQ(o.agg_iters, 4);
  EXPECT_TRUE(o.blocking);
  EXPECT_EQ(o.cycles, 2);
  EXPECT_EQ(o.timeout_s, 30);
  EXPECT_TRUE(o.cpu_time && o.timestamps && o.registered);
  EXPECT_EQ(o.output_file, "out.csv");
  EXPECT_EQ(parse_bench({"hypercube_perf"}).collective, "hypercube");
  EXPECT_EQ(parse_bench({"reduce_scatter_perf"}).collective, "reduce_scatter");
  EXPECT_EQ(parse_bench({"sendrecv"}).collective, "sendrecv");
  for (const Words& bad :
       {Words{"allreduce", "-g", "8"}, Words{"allreduce", "-a", "4"}, Words{"allreduce", "-m", "0"},
        Words{"allreduce", "-r", "x"}, Words{"allreduce", "-o", "mulsum"}, Words{"allreduce", "-R", "3"}}) {
    EXPECT_THROW(parse_bench(bad), UsageError) << bad[1] << " " << bad[2];
  }
  EXPECT_THROW(parse_bench({"send_recv"}), tandem::InvalidArgument);
}

std::string bin() { return testing::env("TANDEM_BIN"); }

Output two_ranks_with(const std::string& levels) {
  return run("TANDEM_LOG_LEVEL=" + levels + " " + bin() + " launch -n 2 -- " + bin() +
             " bench allreduce -b 1K -e 1K -n 1 -w 0");
}

TEST(CliLogLevels, TandemLogLevelSetsEachSubsystemsLevel) {
  if (bin().empty()) GTEST_SKIP() << "TANDEM_BIN is not set (run under ctest)";
  const Output plain = two_ranks_with("");
  ASSERT_EQ(plain.status, 0) << plain.text;
  EXPECT_NE(plain.text.find("[netif] [info]"), std::string::npos) << plain.text;
  EXPECT_EQ(plain.text.find("[debug]"), std::string::npos) << plain.text;

  const Output quiet = two_ranks_with("warn");
  ASSERT_EQ(quiet.status, 0) << quiet.text;
  EXPECT_EQ(quiet.text.find("[info]"), std::string::npos) << quiet.text;

  const Output netif = two_ranks_with("warn,netif=debug");
  ASSERT_EQ(netif.status, 0) << netif.text;
  EXPECT_NE(netif.text.find("[netif] [debug]"), std::string::npos) << netif.text;
  EXPECT_EQ(netif.text.find("[store] [info]"), std::string::npos) << netif.text;

  const Output bad = two_ranks_with("loud");
  EXPECT_EQ(bad.status, 2) << bad.text;
  EXPECT_NE(bad.text.find("TANDEM_LOG_LEVEL='loud' is invalid"), std::string::npos) << bad.text;
  EXPECT_NE(bad.text.find("trace, debug, info, warn, error, critical or off"), std::string::npos) << bad.text;
}

}  // namespace
}  // namespace tandem::cli
