// Whole trials through tandem-train (the driver, `tandem launch`, real rank
// processes): synchronous data parallelism is the same SGD at any slot count,
// gradient aggregation equals a larger batch, a killed worker's trial restarts
// from its checkpoint and ends where an uninterrupted one does, an elastic
// trial goes on without one (its chief included), admits a replacement (on
// one host or across two namespaces) and trains every record once, --resume
// continues a stopped run, and a torn checkpoint is never loaded.
// Small MLP on synthetic data, no dropout: seconds per trial. Every command
// runs under `timeout` so a hang fails the test instead of stalling CI.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "checkpoint.h"
#include "metrics.h"
#include "netns.h"

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;

std::string trainer_bin() {
  const char* b = std::getenv("TANDEM_TRAIN_BIN");
  return b ? b : TANDEM_TRAIN_BIN_DEFAULT;
}

const fs::path& work_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tandem_trainer_test_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// `optimizations` adds keys to that map, `extra` top-level lines.
std::string config(int slots, int global_batch, int aggregation, const std::string& extra = "",
                   const std::string& optimizations = "") {
  std::ostringstream o;
  o << "name: t\n"
    << "hyperparameters: {global_batch_size: " << global_batch
    << ", learning_rate: 0.05, momentum: 0.9, model: mlp, mlp_hidden: 64, dropout: 0}\n"
    << "resources: {slots_per_trial: " << slots << "}\n"
    << "searcher: {name: single, metric: validation_accuracy, max_length: {batches: 20}}\n"
    << "records_per_epoch: 2048\n"
    << "optimizations: {aggregation_frequency: " << aggregation << optimizations << "}\n"
    << "reproducibility: {experiment_seed: 3}\n"
    << "data: synthetic\n"
    << extra;
  return o.str();
}

// 3 slots, global batch 63, epochs of 10 batches; `batches` long.
std::string config_3x63(const std::string& extra, int batches = 20) {
  std::string y = config(3, 63, 1, extra);
  y.replace(y.find("records_per_epoch: 2048"), 23, "records_per_epoch: 630");
  y.replace(y.find("{batches: 20}"), 13, "{batches: " + std::to_string(batches) + "}");
  return y;
}

struct Trial {
  int exit_code = -1;
  std::string output;
  std::vector<float> params;
  fs::path dir;
};

// Runs tandem-train on `yaml` in its own directory named `name`.
// `prefix` runs before the command (e.g. entering a network namespace).
Trial train(const std::string& name, const std::string& yaml, const std::string& flags = "",
            const std::string& prefix = "") {
  Trial r;
  r.dir = work_dir() / name;
  fs::create_directories(r.dir);
  std::ofstream(r.dir / "exp.yaml") << yaml;
  const std::string cmd = prefix + "timeout -k 5 150 " + trainer_bin() + " " + (r.dir / "exp.yaml").string() +
                          " --output " + (r.dir / "out").string() + " --dump-params " +
                          (r.dir / "params.bin").string() + " --quiet " + flags + " > " + (r.dir / "log.txt").string() +
                          " 2>&1";
  fs::remove(r.dir / "params.bin");
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream log(r.dir / "log.txt");
  r.output.assign(std::istreambuf_iterator<char>(log), {});
  std::ifstream p(r.dir / "params.bin", std::ios::binary);
  std::vector<char> bytes(std::istreambuf_iterator<char>(p), {});
  r.params.resize(bytes.size() / sizeof(float));
  std::memcpy(r.params.data(), bytes.data(), r.params.size() * sizeof(float));
  return r;
}

// The reference runs several tests compare against, trained once.
const Trial& reference(const std::string& name) {
  static std::map<std::string, Trial> runs;
  auto it = runs.find(name);
  if (it != runs.end()) return it->second;
  Trial r;
  if (name == "1slot-b32")
    r = train(name, config(1, 32, 1));
  else if (name == "2slot-b32")
    r = train(name, config(2, 32, 1));
  else if (name == "3slot-b63")
    r = train(name, config_3x63(""), "--slots 3");
  else if (name == "3slot-b63-1500")
    r = train(name, config_3x63("", 1500), "--slots 3");
  return runs.emplace(name, std::move(r)).first->second;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

void expect_same_params(const Trial& a, const Trial& b, double tolerance) {
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  ASSERT_EQ(a.params.size(), 784u * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10);
  ASSERT_EQ(a.params.size(), b.params.size());
  const double d = max_abs_diff(a.params, b.params);
  EXPECT_LE(d, tolerance) << a.dir << " vs " << b.dir;
  // Training moved the parameters away from their start (the test is not vacuous).
  std::vector<float> zero(a.params.size(), 0.0f);
  EXPECT_GT(max_abs_diff(a.params, zero), 0.01);
}

TEST(Trainer, OneSlotAndTwoSlotsTrainTheSameParameters) {
  const Trial& one = reference("1slot-b32");
  const Trial& two = reference("2slot-b32");
  expect_same_params(one, two, 1e-4);
  auto s = read_metrics((two.dir / "out/metrics.jsonl").string());
  ASSERT_EQ(s.train.size(), 20u);
  EXPECT_EQ(s.slots, 2);
  EXPECT_EQ(s.global_batch, 32);
  ASSERT_EQ(s.validation.size(), 1u);
  EXPECT_EQ(s.validation[0].records, 10000);  // the whole test set, split over the slots
  EXPECT_GT(s.validation[0].accuracy, 0.5);   // synthetic classes are easy
  auto s1 = read_metrics((one.dir / "out/metrics.jsonl").string());
  // Averaged training metrics over 2 slots equal the 1-slot loss on the same global batch.
  EXPECT_NEAR(s.train[0].loss, s1.train[0].loss, 1e-4);
  EXPECT_NEAR(s.validation[0].accuracy, s1.validation[0].accuracy, 2e-4);
}

// resources.hosts: two "hosts" (network namespaces on one LAN), one slot
// each, started by `tandem launch -H` through `ip netns exec`, the driver in
// host 0, gradients over TCP: the same parameters as two slots on one host.
TEST(Trainer, TwoHostsTrainTheSameParametersAsOneHost) {
  const std::string why = tandem::testing::netns_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  tandem::testing::NetnsLab lab({"node-0", "node-1"});
  lab.add_lan("l", "10.74.1", {"eth0", "eth0"});
  lab.wait_up("eth0");
  std::string yaml = config(2, 32, 1);
  const std::string one_host = "resources: {slots_per_trial: 2}";
  yaml.replace(yaml.find(one_host), one_host.size(),
               "resources: {slots_per_trial: 2, slots_per_host: 1, hosts: [" + lab.ns(0) + ", " + lab.ns(1) + "]}");
  const Trial two_hosts = train("2hosts", yaml, "--rsh 'ip netns exec {host} sh -c' --store-addr 10.74.1.1",
                                "ip netns exec " + lab.ns(0) + " env UCX_TLS=tcp,self ");
  expect_same_params(reference("2slot-b32"), two_hosts, 1e-4);
  EXPECT_NE(two_hosts.output.find("2 ranks on " + lab.ns(0) + ":1, " + lab.ns(1) + ":1"), std::string::npos)
      << two_hosts.output;
  EXPECT_NE(two_hosts.output.find("chosen: eth0 on rank 0, eth0 on rank 1"), std::string::npos)
      << "the interface the ranks chose is printed\n"
      << two_hosts.output;
}

// elastic across resources.hosts: two namespaces of two slots each, joined at
// 1 Gbit/s, gradients over TCP. Slot 3, in the second namespace, is killed at
// batch 8; the three survivors (two hosts still) shrink and redo the step, and
// the launcher starts process 4 through --rsh on the lost slot's namespace,
// reaching the store at the launcher's address, where it joins and takes the
// state. No restart, every record once, the slots end equal to each other and
// to the failure-free trial over the same hosts.
TEST(Trainer, ElasticTrialAcrossHostsReplacesASlotOnItsHost) {
  const std::string why = tandem::testing::netns_unavailable();
  if (!why.empty()) GTEST_SKIP() << why;
  tandem::testing::NetnsLab lab({"node-0", "node-1"});
  lab.add_lan("e", "10.74.2", {"eth0", "eth0"}, "1gbit");
  lab.wait_up("eth0");
  // The remote shell writes down each host it starts a process on.
  const fs::path dir = work_dir() / "hosts-elastic";
  fs::create_directories(dir);
  const fs::path rsh = dir / "rsh.sh", started = dir / "started-on.txt";
  std::ofstream(rsh) << "#!/bin/sh\necho \"$1\" >> " << started.string()
                     << "\nexec ip netns exec \"$1\" sh -c \"$2\"\n";
  fs::permissions(rsh, fs::perms::owner_all);
  auto yaml = [&](const std::string& extra) {
    std::string y = config(4, 64, 1, extra);
    y.replace(y.find("records_per_epoch: 2048"), 23, "records_per_epoch: 640");  // 10 batches an epoch
    y.replace(y.find("{batches: 20}"), 13, "{batches: 1000}");                   // time for the replacement
    const std::string one_host = "resources: {slots_per_trial: 4}";
    y.replace(y.find(one_host), one_host.size(),
              "resources: {slots_per_trial: 4, slots_per_host: 2, hosts: [" + lab.ns(0) + ", " + lab.ns(1) + "]}");
    return y;
  };
  const std::string flags = "--slots 4 --rsh '" + rsh.string() + " {host}' --store-addr 10.74.2.1";
  const std::string in_host0 = "ip netns exec " + lab.ns(0) + " env UCX_TLS=tcp,self ";
  fs::remove(started);
  Trial r = train("hosts-elastic", yaml("elastic: {min_slots: 3}\nmax_restarts: 1\n"),
                  flags + " --fail-at-batch 8 --fail-rank 3", in_host0);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fault injection: rank 3 killed at batch 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("starting rank 4 on rank 3's slot to join the job"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("a worker failed"), std::string::npos) << r.output;  // no restart
  std::ifstream hosts_file(started);
  std::map<std::string, int> per_host;
  for (std::string h; std::getline(hosts_file, h);) ++per_host[h];
  EXPECT_EQ(per_host[lab.ns(0)], 2);
  EXPECT_EQ(per_host[lab.ns(1)], 3) << "the replacement starts on the lost slot's host";
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 0);
  std::ifstream metrics(r.dir / "out/metrics.jsonl");
  std::string start_line;
  std::getline(metrics, start_line);
  // The two hosts' slicing, on every slot through the shrink and the join.
  EXPECT_NE(start_line.find("\"layer_slices\":16"), std::string::npos) << start_line;
  ASSERT_EQ(s.train.size(), 1000u);
  ASSERT_EQ(s.membership.size(), 2u) << r.output;
  EXPECT_EQ(s.membership[0].batch, 8);
  EXPECT_EQ(s.membership[0].lost, std::vector<int>{3});
  EXPECT_EQ(s.membership[0].slots, 3);
  EXPECT_EQ(s.membership[1].joined, std::vector<int>{4});
  EXPECT_EQ(s.membership[1].slots, 4);
  ASSERT_EQ(s.epochs.size(), 100u);
  for (const auto& e : s.epochs) EXPECT_EQ(e.records, 640) << "epoch " << e.epoch;
  fs::remove(started);
  expect_same_params(train("hosts-b64", yaml(""), flags, in_host0), r, 1e-4);
}

// hyperparameters.layer_slices: the hidden layers computed in row blocks are
// the same model (the same parameters, start and SGD), and backward hands the
// engine each block of the weight's gradient on its own.
TEST(Trainer, SlicedLayersTrainTheSameParameters) {
  std::string yaml = config(2, 32, 1);
  const std::string whole = "dropout: 0}";
  yaml.replace(yaml.find(whole), whole.size(), "dropout: 0, layer_slices: 4}");
  Trial sliced = train("2slot-b32-sliced", yaml, "--timeline");
  ASSERT_EQ(sliced.exit_code, 0) << sliced.output;
  expect_same_params(reference("2slot-b32"), sliced, 1e-4);
  std::ifstream t(sliced.dir / "out/timeline-rank0.json");
  const std::string trace(std::istreambuf_iterator<char>(t), {});
  for (const char* g : {"fc1.weight[0]", "fc1.weight[3]", "fc2.weight[2]", "fc2.bias"})
    EXPECT_NE(trace.find(g), std::string::npos) << g << " is a gradient of its own";
  EXPECT_EQ(trace.find("fc1.bias["), std::string::npos) << "a bias goes whole";
  auto s = read_metrics((sliced.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.train.size(), 20u);

  // Without overlap (one all-reduce after backward) the blocks land in the same gradient.
  Trial plain = train("2slot-b32-sliced-plain", yaml, "--no-overlap");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  expect_same_params(reference("2slot-b32"), plain, 1e-4);
}

// Deferred updates (the default with overlap): each parameter is updated as
// the next forward first uses it, with the input-side bucket reduced ahead.
// The same SGD arithmetic in the same order as updating after the last
// bucket: bitwise the same parameters, with and without aggregation.
TEST(Trainer, DeferredUpdatesTrainBitwiseTheSameParameters) {
  for (int aggregation : {1, 2}) {
    // Hidden 512 in 4 slices with 1 MB buckets: several buckets, the last moved ahead of one.
    std::string yaml = config(2, 32 / aggregation, aggregation, "", ", tensor_fusion_threshold: 1");
    const std::string whole = "mlp_hidden: 64, dropout: 0}";
    yaml.replace(yaml.find(whole), whole.size(), "mlp_hidden: 512, dropout: 0, layer_slices: 4}");
    const std::string tag = "-agg" + std::to_string(aggregation);
    const Trial deferred = train("deferred" + tag, yaml, "--input-layers-ahead 1100000 --timeline");
    const Trial after = train("after-backward" + tag, yaml, "--no-deferred-updates");
    ASSERT_EQ(deferred.exit_code, 0) << deferred.output;
    ASSERT_EQ(after.exit_code, 0) << after.output;
    ASSERT_EQ(deferred.params.size(), 784u * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
    EXPECT_EQ(max_abs_diff(deferred.params, after.params), 0.0);
    EXPECT_GT(max_abs_diff(deferred.params, std::vector<float>(deferred.params.size(), 0.0f)), 0.01);
    auto s = read_metrics((deferred.dir / "out/metrics.jsonl").string());
    ASSERT_EQ(s.train.size(), 20u);
    for (size_t i = 0; i < s.train.size(); ++i) EXPECT_EQ(s.train[i].batch, int64_t(i + 1));
    auto a = read_metrics((after.dir / "out/metrics.jsonl").string());
    ASSERT_EQ(a.train.size(), 20u);
    EXPECT_EQ(s.train.back().loss, a.train.back().loss);
  }
}

TEST(Trainer, AggregationFrequencyTwoEqualsTwiceTheBatch) {
  // Two slots, global batch 16, two batches per optimizer step == one slot at 32.
  Trial agg = train("2slot-b16-agg2", config(2, 16, 2), "--max-batches 40");
  expect_same_params(reference("1slot-b32"), agg, 1e-4);
  auto s = read_metrics((agg.dir / "out/metrics.jsonl").string());
  ASSERT_EQ(s.train.size(), 40u);
  EXPECT_FALSE(s.train[0].communicated);
  EXPECT_TRUE(s.train[1].communicated);
}

TEST(Trainer, GradientCompressionPutsHalfTheBytesOnTheWire) {
  // fp16 through the overlapped engine, with error feedback and a predivide factor; the
  // same SGD as the f32 run up to fp16's rounding of the averaged gradients.
  Trial fp16 =
      train("2slot-fp16",
            config(2, 32, 1, "", ", gradient_compression: true, gradient_predivide_factor: 2, error_feedback: true"));
  expect_same_params(reference("1slot-b32"), fp16, 1e-3);                    // measured 2.3e-4
  EXPECT_GT(max_abs_diff(reference("1slot-b32").params, fp16.params), 0.0);  // rounded, so not bitwise equal
  auto s = read_metrics((fp16.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.compression, "fp16");
  ASSERT_GT(s.gradient_bytes, 0u);
  EXPECT_EQ(s.gradient_bytes % (20 * 4), 0u);  // 20 steps of f32 gradients
  // Half, give or take the 16-bit staging's alignment.
  EXPECT_GE(s.wire_bytes * 2, s.gradient_bytes);
  EXPECT_LE(s.wire_bytes * 2, s.gradient_bytes + s.gradient_bytes / 100);
  EXPECT_EQ(s.compression_fallbacks, 0u);

  // Without overlap (the same buckets, reduced after backward), bf16.
  Trial bf16 = train("2slot-bf16-plain", config(2, 32, 1, "", ", gradient_compression: bf16"), "--no-overlap");
  expect_same_params(reference("1slot-b32"), bf16, 1e-2);  // measured 2.4e-3
  auto b = read_metrics((bf16.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(b.compression, "bf16");
  EXPECT_GE(b.wire_bytes * 2, b.gradient_bytes);
  EXPECT_LE(b.wire_bytes * 2, b.gradient_bytes + b.gradient_bytes / 100);
}

TEST(Trainer, KilledWorkerRestartsFromTheCheckpointAndEndsAtTheSameStep) {
  Trial r = train("2slot-killed", config(2, 32, 1, "min_checkpoint_period: {batches: 10}\nmax_restarts: 2\n"),
                  "--fail-at-batch 15 --fail-rank 1");
  EXPECT_NE(r.output.find("fault injection: rank 1 killed at batch 15"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 2 from the checkpoint at batch 10"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  ASSERT_FALSE(s.train.empty());
  EXPECT_EQ(s.train.back().batch, 20);
  EXPECT_EQ(s.train.size(), 20u);  // batches 11..14 of the failed attempt are not counted twice
  EXPECT_EQ(s.restarts, 1);
  // Same data position, optimizer state and randomness: the uninterrupted run's parameters.
  expect_same_params(reference("2slot-b32"), r, 1e-6);
}

// elastic: slot 1 of 3 is killed (SIGKILL) at batch 8. Slots 0 and 2 shrink,
// redo batch 8 with the global batch of 63 split 31 + 32 (unequal shares:
// weighted losses) and go on without a restart or a checkpoint; every record
// of both epochs is trained once, and the parameters are those of the
// uninterrupted trial up to the sums' order.
TEST(Trainer, ElasticTrialGoesOnWithoutAKilledSlot) {
  auto yaml = [](const std::string& extra) {
    std::string y = config(3, 63, 1, extra);
    y.replace(y.find("records_per_epoch: 2048"), 23, "records_per_epoch: 630");  // 10 batches an epoch
    return y;
  };
  Trial r = train("3slot-elastic", yaml("elastic: {min_slots: 2}\nmax_restarts: 0\n"),
                  "--slots 3 --fail-at-batch 8 --fail-rank 1");  // --slots: 3 even on 2 cores
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fault injection: rank 1 killed at batch 8"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("a worker failed"), std::string::npos) << r.output;  // no restart
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 0);
  ASSERT_EQ(s.train.size(), 20u);  // batch 8 logged once, when redone
  for (size_t i = 0; i < s.train.size(); ++i) EXPECT_EQ(s.train[i].batch, int64_t(i) + 1);
  ASSERT_EQ(s.membership.size(), 1u);
  const MembershipRecord& m = s.membership[0];
  EXPECT_EQ(m.batch, 8);
  EXPECT_EQ(m.lost, std::vector<int>{1});
  EXPECT_EQ(m.slots, 2);
  EXPECT_EQ(m.batches_redone, 1);
  EXPECT_NE(m.reason.find("rank 1"), std::string::npos) << m.reason;
  EXPECT_GT(m.recovery_seconds, 0.0);
  EXPECT_LT(m.recovery_seconds, 10.0);
  EXPECT_NE(summary_table(s, 0.5).find("slot 1 lost at batch 8"), std::string::npos) << summary_table(s, 0.5);
  ASSERT_EQ(s.epochs.size(), 2u);
  for (const auto& e : s.epochs) EXPECT_EQ(e.records, 630) << "epoch " << e.epoch;
  EXPECT_NE(summary_table(s, 0.5).find("every record of 2 epochs (630 each)"), std::string::npos)
      << summary_table(s, 0.5);
  ASSERT_FALSE(s.validation.empty());
  EXPECT_GT(s.validation.back().accuracy, 0.5);
  expect_same_params(reference("3slot-b63"), r, 1e-4);
}

// elastic with a replacement: slot 1 of 3 is killed at batch 8; the launcher
// starts process 3 in its place, the two survivors go on and admit it at a
// step boundary, hand it their state from memory, and the three finish
// without a restart or a checkpoint read. Every record of every epoch is
// trained once, and the trial's end check finds every slot, the joiner
// included, with the same parameters bit for bit.
TEST(Trainer, ElasticTrialAdmitsAReplacementForAKilledSlot) {
  // 1500 batches: time for the replacement to start.
  const std::string y = config_3x63("elastic: {min_slots: 2, max_slots: 3}\nmax_restarts: 1\n", 1500);
  Trial r = train("3slot-elastic-join", y, "--slots 3 --fail-at-batch 8 --fail-rank 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starting rank 3 on rank 1's slot to join the job"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("a worker failed"), std::string::npos) << r.output;  // no restart
  EXPECT_EQ(r.output.find("resuming from"), std::string::npos) << r.output;    // no checkpoint read
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 0);
  ASSERT_EQ(s.train.size(), 1500u);
  ASSERT_EQ(s.membership.size(), 2u) << r.output;
  EXPECT_EQ(s.membership[0].lost, std::vector<int>{1});
  EXPECT_EQ(s.membership[0].slots, 2);
  const MembershipRecord& join = s.membership[1];
  EXPECT_EQ(join.joined, std::vector<int>{3});
  EXPECT_EQ(join.slots, 3);
  EXPECT_GE(join.batch, 8);  // at the redone batch itself when the replacement is ready by then
  EXPECT_GT(join.state_bytes, 4 * int64_t(r.params.size()));  // the parameters and the momentum
  EXPECT_GT(join.recovery_seconds, 0.0);
  EXPECT_LT(join.recovery_seconds, 30.0);
  const std::string table = summary_table(s, 0.5);
  EXPECT_NE(table.find("slot 3 joined at batch " + std::to_string(join.batch)), std::string::npos) << table;
  EXPECT_NE(table.find("3, 3 at the end (2 at the fewest)"), std::string::npos) << table;
  ASSERT_EQ(s.epochs.size(), 150u);
  for (const auto& e : s.epochs) EXPECT_EQ(e.records, 630) << "epoch " << e.epoch;
  ASSERT_FALSE(s.validation.empty());
  EXPECT_GT(s.validation.back().accuracy, 0.9);
  // The same steps as the uninterrupted trial, up to the sums' order.
  expect_same_params(reference("3slot-b63-1500"), r, 1e-4);
}

// elastic growing onto an offered slot: the trial starts with 3 of
// max_slots 4 and a discovery script offers 4 slots here; the launcher starts
// process 3 (TANDEM_JOIN=1), the chief sees it waiting and sends the count
// with a step's metrics, and the members admit it at the next step boundary.
// The global batch stays 63 (split 16, 16, 16, 15), so the trial ends where
// one of 3 slots throughout does. Without elastic the script is refused.
TEST(Trainer, ElasticTrialGrowsOntoAnOfferedSlot) {
  const std::string y = config_3x63("elastic: {min_slots: 2, max_slots: 4}\n", 1500);
  Trial r = train("3to4slot-elastic-grow", y, "--slots 3 --host-discovery-script 'echo localhost:4'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starting rank 3 on a slot of this host offered by --host-discovery-script"),
            std::string::npos)
      << r.output;
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 0);
  ASSERT_EQ(s.membership.size(), 1u) << r.output;
  EXPECT_EQ(s.membership[0].joined, std::vector<int>{3});
  EXPECT_EQ(s.membership[0].slots, 4);
  ASSERT_EQ(s.epochs.size(), 150u);
  for (const auto& e : s.epochs) EXPECT_EQ(e.records, 630) << "epoch " << e.epoch;
  expect_same_params(reference("3slot-b63-1500"), r, 1e-4);

  const Trial refused = train("3slot-grow-refused", config_3x63(""), "--slots 3 --host-discovery-script 'echo x:3'");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("--host-discovery-script adds slots to an elastic trial"), std::string::npos)
      << refused.output;
}

// The chief (slot 0) killed at batch 8 with a replacement: slot 1 takes the
// chief's duties, process 3 starts on slot 0's placement and joins, taking
// the state from the new chief, and the three finish with the same parameters.
TEST(Trainer, ElasticTrialAdmitsAReplacementForItsChief) {
  const std::string y = config_3x63("elastic: {min_slots: 2, max_slots: 3}\nmax_restarts: 1\n", 1500);
  Trial r = train("3slot-elastic-chief-join", y, "--slots 3 --fail-at-batch 8 --fail-rank 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("starting rank 3 on rank 0's slot to join the job"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("slot 1 takes over as the chief"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("a worker failed"), std::string::npos) << r.output;  // no restart
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 0);
  ASSERT_EQ(s.train.size(), 1500u);
  ASSERT_EQ(s.membership.size(), 2u) << r.output;
  EXPECT_EQ(s.membership[0].lost, std::vector<int>{0});
  EXPECT_EQ(s.membership[1].joined, std::vector<int>{3});
  EXPECT_EQ(s.membership[1].slots, 3);
  ASSERT_EQ(s.epochs.size(), 150u);
  for (const auto& e : s.epochs) EXPECT_EQ(e.records, 630) << "epoch " << e.epoch;
  expect_same_params(reference("3slot-b63-1500"), r, 1e-4);
}

// With aggregation_frequency 2 a slot killed at batch 7 (a local batch) is
// seen at batch 8's exchange: both batches of the optimizer step are redone.
TEST(Trainer, ElasticTrialRedoesAWholeAggregatedStep) {
  auto yaml = [](const std::string& extra) {
    std::string y = config(3, 63, 2, extra);
    y.replace(y.find("records_per_epoch: 2048"), 23, "records_per_epoch: 630");
    return y;
  };
  Trial r = train("3slot-elastic-k2", yaml("elastic: {min_slots: 2}\nmax_restarts: 0\n"),
                  "--slots 3 --fail-at-batch 7 --fail-rank 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  ASSERT_EQ(s.membership.size(), 1u);
  EXPECT_EQ(s.membership[0].batch, 8);
  EXPECT_EQ(s.membership[0].batches_redone, 2);
  ASSERT_EQ(s.epochs.size(), 2u);
  for (const auto& e : s.epochs) EXPECT_EQ(e.records, 630) << "epoch " << e.epoch;
  expect_same_params(train("3slot-b63-k2", yaml(""), "--slots 3"), r, 1e-4);
}

// elastic: the chief (slot 0 of 3) is killed at batch 8. Slot 1, rank 0 of
// the survivors, takes its duties: it keeps the metrics file's lines up to
// the agreed batch and writes on, writes the checkpoints due after it and
// dumps the parameters, and the trial ends without a restart.
TEST(Trainer, ElasticTrialGoesOnWithoutItsChief) {
  const std::string y = config_3x63("elastic: {min_slots: 2}\nmin_checkpoint_period: {batches: 5}\nmax_restarts: 0\n");
  Trial r = train("3slot-elastic-chief", y, "--slots 3 --fail-at-batch 8 --fail-rank 0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fault injection: rank 0 killed at batch 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("slot 1 takes over as the chief after batch 7"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("a worker failed"), std::string::npos) << r.output;  // no restart
  std::ifstream lines(r.dir / "out/metrics.jsonl");
  int starts = 0;
  for (std::string l; std::getline(lines, l);) starts += l.find("\"kind\":\"start\"") != std::string::npos;
  EXPECT_EQ(starts, 1);
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 0);
  ASSERT_EQ(s.train.size(), 20u);  // batch 8 logged once, by the new chief
  for (size_t i = 0; i < s.train.size(); ++i) EXPECT_EQ(s.train[i].batch, int64_t(i) + 1);
  for (size_t i = 1; i < s.train.size(); ++i) EXPECT_GE(s.train[i].time, s.train[i - 1].time);  // one trial clock
  ASSERT_EQ(s.membership.size(), 1u);
  EXPECT_EQ(s.membership[0].batch, 8);
  EXPECT_EQ(s.membership[0].lost, std::vector<int>{0});
  EXPECT_EQ(s.membership[0].slots, 2);
  EXPECT_EQ(s.membership[0].batches_redone, 1);
  const std::string table = summary_table(s, 0.5);
  EXPECT_NE(table.find("slot 0 lost at batch 8"), std::string::npos) << table;
  EXPECT_NE(table.find("every record of 2 epochs (630 each)"), std::string::npos) << table;
  ASSERT_EQ(s.epochs.size(), 2u);
  for (const auto& e : s.epochs) EXPECT_EQ(e.records, 630) << "epoch " << e.epoch;
  ASSERT_FALSE(s.validation.empty());
  EXPECT_EQ(s.validation.back().batch, 20);
  const auto last = latest_checkpoint((r.dir / "out/checkpoints").string());
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->batch, 20);
  EXPECT_EQ(last->meta.at("slots").get<int>(), 2);
  expect_same_params(reference("3slot-b63"), r, 1e-4);
}

// elastic, but fewer than min_slots are left: the survivors stop and the
// trial restarts from its checkpoint, ending with the uninterrupted trial's
// parameters.
TEST(Trainer, ElasticTrialRestartsBelowMinSlots) {
  Trial r = train("3slot-elastic-min",
                  config(3, 48, 1, "elastic: {min_slots: 3}\nmin_checkpoint_period: {batches: 5}\nmax_restarts: 1\n"),
                  "--slots 3 --fail-at-batch 8 --fail-rank 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("below elastic.min_slots 3"), std::string::npos) << r.output;
  // From batch 5's checkpoint, or the start while its write is still in flight.
  EXPECT_NE(r.output.find("restart 1 of 1 from"), std::string::npos) << r.output;
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 1);
  EXPECT_TRUE(s.membership.empty());
  expect_same_params(train("3slot-b48", config(3, 48, 1), "--slots 3"), r, 1e-6);
}

// With no checkpoint yet, a restart starts over; the summary still counts it,
// and the trial clock runs on across attempts (wall time includes the lost work).
TEST(Trainer, ARestartFromTheStartIsCountedAndItsTimeKept) {
  Trial r = train("2slot-killed-early", config(2, 32, 1, "max_restarts: 1\n"), "--fail-at-batch 5 --fail-rank 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 from the start"), std::string::npos) << r.output;
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 1);
  EXPECT_EQ(s.train.size(), 20u);
  EXPECT_GT(s.lost_time, 0.0);
  ASSERT_FALSE(s.validation.empty());
  // The validation at the end comes after the failed attempt's time.
  EXPECT_GT(s.validation.back().time, s.lost_time);
  EXPECT_GE(s.wall_time, s.validation.back().time);
  EXPECT_GT(s.validation.back().seconds, 0.0);
  EXPECT_LE(s.validation.back().forward_seconds, s.validation.back().seconds);
  EXPECT_NE(summary_table(s, 0.5).find("1, "), std::string::npos) << summary_table(s, 0.5);
  expect_same_params(reference("2slot-b32"), r, 1e-6);
}

// The chief dies while its background thread writes the checkpoint of batch 15:
// the restart resumes from batch 10's, the newest complete one, and ends where
// an uninterrupted run does.
TEST(Trainer, KilledDuringABackgroundCheckpointWriteResumesFromTheLastComplete) {
  Trial r = train("2slot-killed-writing", config(2, 32, 1, "min_checkpoint_period: {batches: 5}\nmax_restarts: 1\n"),
                  "--fail-checkpoint-batch 15");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 from the checkpoint at batch 10"), std::string::npos) << r.output;
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.restarts, 1);
  expect_same_params(reference("2slot-b32"), r, 1e-6);
}

// entrypoint: a model of the user's own, saved from Python with torch.jit.save,
// trains through the same gradient sync: 1 and 2 slots agree.
TEST(Trainer, ATorchScriptEntrypointTrainsTheSameAtOneAndTwoSlots) {
  const fs::path dir = work_dir() / "torchscript";
  fs::create_directories(dir);
  const std::string make = "timeout 120 /usr/bin/python3 " + std::string(TANDEM_SOURCE_DIR) +
                           "/trainer/examples/torchscript_model.py " + (dir / "model.pt").string() + " --hidden 32 > " +
                           (dir / "make.txt").string() + " 2>&1";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "python3-torch cannot save a TorchScript model here";
  auto yaml = [&](int slots) {
    std::string y = config(slots, 32, 1, "entrypoint: " + (dir / "model.pt").string() + "\n");
    // The built-in model's keys have no say with an entrypoint.
    const std::string hp = ", model: mlp, mlp_hidden: 64";
    y.replace(y.find(hp), hp.size(), "");
    return y;
  };
  Trial one = train("torchscript-1", yaml(1)), two = train("torchscript-2", yaml(2));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_EQ(one.params.size(), 784u * 32 + 32 + 32 * 10 + 10);
  EXPECT_LE(max_abs_diff(one.params, two.params), 1e-4);
  auto s = read_metrics((two.dir / "out/metrics.jsonl").string());
  ASSERT_FALSE(s.validation.empty());
  EXPECT_GT(s.validation.back().accuracy, 0.5);  // it learned the synthetic classes
}

// trainer/ddp_anchor.py (PyTorch DDP) trains tandem's trajectory: the same
// initial values, epoch order (two epochs) and dropout draws give the same
// training loss at every batch, bitwise, on the real data.
TEST(Trainer, TheDdpAnchorTrainsTandemsTrajectory) {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(data + "/train-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  if (std::system("timeout 60 /usr/bin/python3 -c 'import torch, yaml' > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "the anchor needs python3-torch and python3-yaml under /usr/bin/python3";
  std::string yaml = config(2, 64, 1, "", "");
  yaml.replace(yaml.find("dropout: 0"), 10, "dropout: 0.3");
  yaml.replace(yaml.find("records_per_epoch: 2048"), 23, "records_per_epoch: 640");
  yaml.replace(yaml.find("data: synthetic"), 15, "data: fashion-mnist");
  Trial t = train("anchor-tandem", yaml);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const fs::path ddp = work_dir() / "anchor-ddp";
  const std::string cmd = "timeout -k 5 150 /usr/bin/python3 " + std::string(TANDEM_SOURCE_DIR) +
                          "/trainer/ddp_anchor.py " + (t.dir / "exp.yaml").string() + " --output " + ddp.string() +
                          " > " + (t.dir / "anchor.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto ours = read_metrics((t.dir / "out/metrics.jsonl").string()),
       theirs = read_metrics((ddp / "metrics.jsonl").string());
  ASSERT_EQ(ours.train.size(), 20u);
  ASSERT_EQ(theirs.train.size(), 20u);
  for (size_t i = 0; i < ours.train.size(); ++i)
    EXPECT_EQ(ours.train[i].loss, theirs.train[i].loss) << "batch " << ours.train[i].batch;
  EXPECT_LT(ours.train.back().loss, ours.train.front().loss);  // it learned
}

// A trial whose workers cannot set it up (here a model file that is not
// TorchScript) fails at once, naming why, without burning its restarts.
TEST(Trainer, ATrialThatCannotBeSetUpIsNotRestarted) {
  const fs::path model = work_dir() / "not-a-module.pt";
  std::ofstream(model) << "not a TorchScript module";
  std::string yaml = config(2, 32, 1, "entrypoint: " + model.string() + "\nmax_restarts: 3\n");
  const std::string hp = ", model: mlp, mlp_hidden: 64";
  yaml.replace(yaml.find(hp), hp.size(), "");
  Trial t = train("setup-error", yaml);
  EXPECT_NE(t.exit_code, 0);
  EXPECT_NE(t.output.find("cannot set up the trial: entrypoint"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("so none is made"), std::string::npos) << t.output;
  EXPECT_EQ(t.output.find("restart 1 of"), std::string::npos) << t.output;
}

TEST(Trainer, NoRestartsLeftFailsTheTrial) {
  Trial r = train("2slot-no-restarts", config(2, 32, 1, "max_restarts: 0\n"), "--fail-at-batch 3 --fail-rank 0");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("after 0 restarts (max_restarts 0)"), std::string::npos) << r.output;
}

TEST(Trainer, ResumeContinuesAStoppedRunAndNeverLoadsATornCheckpoint) {
  const std::string yaml =
      config(2, 32, 1, "min_checkpoint_period: {batches: 5}\ncheckpoint_storage: {save_trial_latest: 2}\n");
  Trial first = train("2slot-resume", yaml, "--max-batches 10");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  Trial resumed = train("2slot-resume", yaml, "--max-batches 20 --resume");
  EXPECT_NE(resumed.output.find("(batch 10)"), std::string::npos) << resumed.output;
  expect_same_params(reference("2slot-b32"), resumed, 1e-6);

  // Tear the newest checkpoint (batch 20): a resume skips it for the one at 15.
  const std::string newest = checkpoint_file((resumed.dir / "out/checkpoints").string(), 20);
  ASSERT_TRUE(fs::exists(newest));
  fs::resize_file(newest, fs::file_size(newest) / 2);
  Trial again = train("2slot-resume", yaml, "--max-batches 20 --resume");
  EXPECT_NE(again.output.find("ckpt-000000000020.pt"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("(batch 15)"), std::string::npos) << again.output;
  expect_same_params(reference("2slot-b32"), again, 1e-6);
}

TEST(Trainer, PerSlotBatchOverridesTheGlobalBatchAndCompareTabulatesRuns) {
  // 16 per slot on 2 slots is the global batch of 32 whatever the file says.
  Trial r = train("2slot-per-slot-16", config(2, 64, 1), "--per-slot-batch 16");
  expect_same_params(reference("2slot-b32"), r, 1e-6);
  auto s = read_metrics((r.dir / "out/metrics.jsonl").string());
  EXPECT_EQ(s.global_batch, 32);

  // Efficiency against the first run whose label is a prefix: 2 slots at the same samples/s as 1 slot is 0.50.
  const std::string one = (reference("1slot-b32").dir / "out").string(), two = (r.dir / "out").string();
  const fs::path dir = work_dir() / "compare";
  const std::string cmd = "timeout -k 5 60 " + trainer_bin() + " " + (r.dir / "exp.yaml").string() +
                          " --compare 'tandem=" + one + "' --compare 'tandem, 2 slots=" + two + "' --output " +
                          dir.string() + " > " + (dir.string() + ".txt") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream table(dir / "scaling.md");
  std::string text((std::istreambuf_iterator<char>(table)), {});
  EXPECT_NE(text.find("| tandem | 1 | 32 |"), std::string::npos) << text;
  EXPECT_NE(text.find("| tandem, 2 slots | 2 | 32 |"), std::string::npos) << text;
  EXPECT_NE(text.find("| 1.00 | 1.00 |"), std::string::npos) << text;  // the base against itself
}

// Determined 0.38's mnist_pytorch tutorial experiments, as published but for
// the entrypoint, train the tutorial's Net on Fashion-MNIST: Adadelta (the
// module's) at their learning_rate 1.0, 64 samples a slot, const.yaml on 1
// slot and distributed.yaml on 2; the earlier 8-slot version runs on the
// cores this host has. A few batches each (the whole epoch: docs/training.md).
TEST(Trainer, DeterminedTutorialExperimentsTrain) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const fs::path dir = work_dir() / "tutorial";
  fs::create_directories(dir);
  const std::string examples = std::string(TANDEM_SOURCE_DIR) + "/trainer/examples/";
  const std::string make = "timeout 120 /usr/bin/python3 " + examples + "mnist_tutorial_model.py " +
                           (dir / "mnist_net.pt").string() + " > " + (dir / "make.txt").string() + " 2>&1";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "python3-torch cannot save a TorchScript model here";
  auto run = [&](const std::string& yaml, const std::string& name, int batches) {
    const fs::path out = dir / name;
    const std::string cmd = "timeout -k 5 150 " + trainer_bin() + " " + yaml + " --max-batches " +
                            std::to_string(batches) + " --output " + out.string() + " --quiet > " + out.string() +
                            ".txt 2>&1";
    Trial r;
    r.dir = out;
    const int status = std::system(cmd.c_str());
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream log(out.string() + ".txt");
    r.output.assign(std::istreambuf_iterator<char>(log), {});
    return r;
  };
  auto start_line = [](const Trial& r) {
    std::ifstream in(r.dir / "metrics.jsonl");
    std::string first;
    std::getline(in, first);
    return first;
  };
  for (const std::string name : {"const", "distributed"}) {
    fs::copy_file(examples + "determined_tutorial_" + name + ".yaml", dir / (name + ".yaml"),
                  fs::copy_options::overwrite_existing);
    const Trial r = run((dir / (name + ".yaml")).string(), name, 40);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const int slots = name == "const" ? 1 : 2;
    EXPECT_NE(r.output.find("optimizer: adadelta, as the entrypoint's module names it"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("each slot trains 64 samples"), std::string::npos) << r.output;
    EXPECT_NE(start_line(r).find("\"optimizer\":\"adadelta\""), std::string::npos) << start_line(r);
    const auto s = read_metrics((r.dir / "metrics.jsonl").string());
    EXPECT_EQ(s.slots, slots);
    EXPECT_EQ(s.global_batch, 64 * slots);
    ASSERT_FALSE(s.validation.empty()) << r.output;
    EXPECT_GT(s.validation.back().accuracy, 0.5) << name << " learned little in 40 batches";
  }
  // The earlier distributed.yaml: 8 slots, global batch 512, max_length and data.url.
  std::ifstream published(examples + "determined_tutorial_distributed.yaml");
  std::string old((std::istreambuf_iterator<char>(published)), {});
  old.replace(old.find("  learning_rate: 1.0\n"), 20, "  learning_rate: 1.0\n  global_batch_size: 512\n");
  old.replace(old.find("slots_per_trial: 2"), 18, "slots_per_trial: 8");
  old.replace(old.find(" --epochs 1"), 11, "");
  old.replace(old.find("  smaller_is_better"), 0, "  max_length:\n    batches: 117\n");
  old += "data:\n  url: https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz\n";
  std::ofstream(dir / "old.yaml") << old;
  const Trial r = run((dir / "old.yaml").string(), "old", 4);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("data.url: ignored: tandem downloads nothing"), std::string::npos) << r.output;
  cpu_set_t cpus;
  ASSERT_EQ(::sched_getaffinity(0, sizeof cpus, &cpus), 0);
  const int cores = std::min(8, CPU_COUNT(&cpus));
  if (cores < 8) {
    EXPECT_NE(r.output.find("resources.slots_per_trial 8 is more than the " + std::to_string(cores) + " cores"),
              std::string::npos)
        << r.output;
  }
  const auto s = read_metrics((r.dir / "metrics.jsonl").string());
  EXPECT_EQ(s.slots, cores);
  EXPECT_EQ(s.global_batch, 512 - 512 % cores);
}

TEST(Trainer, BadConfigFailsBeforeAnyWorkerStarts) {
  Trial r = train("bad", config(2, 32, 1, "max_restart: 1\n"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("max_restart: unknown key; did you mean 'max_restarts'?"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[0]"), std::string::npos) << "a worker started: " << r.output;
}

// The trials' directories go when the suite ends.
struct CleanUp : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(work_dir(), ec);
  }
};
const auto* const kCleanUp = ::testing::AddGlobalTestEnvironment(new CleanUp);

}  // namespace
}  // namespace tandem::trainer
