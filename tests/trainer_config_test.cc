// The experiment configuration: every bad key or value names the key, the
// value and the fix; per-slot batch arithmetic; layouts; and the pieces of
// the trainer that need no LibTorch (batch plan, checkpoints, metrics).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "checkpoint.h"
#include "config.h"
#include "data.h"
#include "driver.h"
#include "metrics.h"

namespace tandem::trainer {
namespace {

const std::string kBase = R"(
name: t
hyperparameters: {global_batch_size: 64, learning_rate: 0.01, model: convnet}
resources: {slots_per_trial: 2}
searcher: {name: single, metric: validation_accuracy, max_length: {batches: 100}}
)";

std::string error_of(const std::string& yaml) {
  try {
    parse_config(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Expects parse_config to fail with a message containing every fragment.
void expect_error(const std::string& yaml, std::initializer_list<std::string> fragments) {
  const std::string msg = error_of(yaml);
  ASSERT_FALSE(msg.empty()) << "accepted:\n" << yaml;
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

TEST(TrainerConfig, ValidExampleParses) {
  auto c = parse_config(kBase);
  EXPECT_EQ(c.global_batch_size, 64);
  EXPECT_EQ(c.slots_per_trial, 2);
  EXPECT_EQ(c.per_slot_batch(), 32);
  EXPECT_EQ(c.max_length.value, 100);
  EXPECT_EQ(c.max_restarts, 5);  // Determined's default
  EXPECT_TRUE(c.warnings.empty());
  auto example = load_config(std::string(TANDEM_SOURCE_DIR) + "/trainer/examples/fashion_mnist.yaml");
  EXPECT_EQ(example.slots_per_trial, 2);
  EXPECT_EQ(example.checkpoint_dir, "checkpoints/fashion-mnist-convnet");
  EXPECT_EQ(checkpoint_storage_dir(example, "/runs/exp"), "/runs/exp/checkpoints/fashion-mnist-convnet");
}

TEST(TrainerConfig, CheckpointStorageIsUnderTheOutputUnlessAbsolute) {
  auto absolute = parse_config(kBase + "checkpoint_storage: {type: shared_fs, host_path: /mnt/ckpt, storage_path: exp}\n");
  EXPECT_EQ(absolute.checkpoint_dir, "/mnt/ckpt/exp");
  EXPECT_EQ(checkpoint_storage_dir(absolute, "/runs/exp"), "/mnt/ckpt/exp");
  auto relative = parse_config(kBase + "checkpoint_storage: {type: shared_fs, host_path: ckpt}\n");
  EXPECT_EQ(checkpoint_storage_dir(relative, "/runs/exp"), "/runs/exp/ckpt");
  EXPECT_EQ(checkpoint_storage_dir(parse_config(kBase), "/runs/exp"), "");  // the driver then uses <output>/checkpoints
  expect_error(kBase + "checkpoint_storage: {type: shared_fs}\n", {"checkpoint_storage.host_path", "missing"});
}

TEST(TrainerConfig, UnknownKeysGetDidYouMean) {
  expect_error(kBase + "max_restart: 3\n", {"max_restart: unknown key", "did you mean 'max_restarts'?"});
  expect_error(kBase + "optimizations: {agregation_frequency: 2}\n",
               {"optimizations.agregation_frequency", "did you mean 'aggregation_frequency'?"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64, learning_rat: 0.1}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.learning_rat", "did you mean 'learning_rate'?"});
  expect_error(kBase + "zzzz: 1\n", {"zzzz: unknown key (valid here:"});
}

TEST(TrainerConfig, BadValuesNameKeyValueAndFix) {
  expect_error(R"(
hyperparameters: {global_batch_size: -4}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.global_batch_size", "'-4' is out of range", "e.g. 64"});
  expect_error(R"(
hyperparameters: {global_batch_size: lots}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.global_batch_size", "'lots' is not an integer"});
  expect_error(kBase + "data: fashion_mnist\n", {"data: unknown value 'fashion_mnist'", "did you mean 'fashion-mnist'?",
                                                 "valid: fashion-mnist, synthetic"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64, model: resnet}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.model", "'resnet'", "valid: convnet, mlp"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64, layer_slices: 0}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.layer_slices", "'0' is out of range", "e.g. 8"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64, model: mlp, mlp_hidden: 8, layer_slices: 16}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.layer_slices", "16 slices of a 8-wide layer", "use at most 4"});
  expect_error(kBase + "optimizations: {gradient_compression: fp8}\n",
               {"optimizations.gradient_compression", "'fp8' is not a codec", "use true (fp16), fp16, bf16"});
  expect_error(kBase + "optimizations: {aggregation_frequency: 0}\n",
               {"optimizations.aggregation_frequency", "'0' is out of range", "use 1"});
  expect_error(kBase + "optimizations: {tensor_fusion_threshold: 0}\n",
               {"optimizations.tensor_fusion_threshold", "megabytes"});
  expect_error(kBase + "optimizations: {average_training_metrics: maybe}\n",
               {"optimizations.average_training_metrics", "'maybe' is not true or false"});
  expect_error(kBase + "optimizations: {error_feedback: true}\n",
               {"optimizations.error_feedback", "gradient_compression: fp16 or bf16"});
  expect_error(kBase + "max_restarts: -1\n", {"max_restarts", "'-1' is out of range", "Determined's default is 5"});
  expect_error(kBase + "min_validation_period: {batches: 10, epochs: 1}\n",
               {"min_validation_period", "not several"});
  expect_error(kBase + "min_validation_period: {bathces: 10}\n",
               {"min_validation_period.bathces", "did you mean 'batches'?"});
  expect_error(kBase + "checkpoint_storage: {type: s3}\n", {"checkpoint_storage.type", "'s3'", "valid: shared_fs"});
  expect_error(kBase + "reproducibility: {experiment_seed: 1.5}\n",
               {"reproducibility.experiment_seed", "'1.5' is not an integer"});
  expect_error("hyperparameters: 3\nsearcher: {max_length: {batches: 1}}\n", {"hyperparameters: expected a map of keys, got '3'"});
  expect_error(kBase + "max_restarts: 1\nmax_restarts: 2\n", {"max_restarts: given twice", "keep one"});
  expect_error("name: [unclosed\n", {"not valid YAML"});
}

TEST(TrainerConfig, GradientCompressionAsDetermined) {
  auto codec = [](const std::string& v) {
    return parse_config(kBase + "optimizations: {gradient_compression: " + v + "}\n").optimizations.gradient_compression;
  };
  EXPECT_EQ(parse_config(kBase).optimizations.gradient_compression, "none");
  EXPECT_EQ(codec("true"), "fp16");  // Determined's boolean
  EXPECT_EQ(codec("false"), "none");
  EXPECT_EQ(codec("fp16"), "fp16");
  EXPECT_EQ(codec("bf16"), "bf16");
  EXPECT_EQ(codec("BF16"), "bf16");
  EXPECT_EQ(codec("none"), "none");
  auto c = parse_config(kBase + "optimizations: {gradient_compression: bf16, gradient_predivide_factor: 2, error_feedback: true}\n");
  EXPECT_DOUBLE_EQ(c.optimizations.gradient_predivide_factor, 2.0);
  EXPECT_TRUE(c.optimizations.error_feedback);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_DOUBLE_EQ(parse_config(kBase).optimizations.gradient_predivide_factor, 1.0);  // Determined's default

  expect_error(kBase + "optimizations: {gradient_compression: [fp16]}\n",
               {"optimizations.gradient_compression", "a list is not a codec", "false or none"});
  expect_error(kBase + "optimizations: {gradient_compression: fp16, gradient_predivide_factor: 0}\n",
               {"optimizations.gradient_predivide_factor", "'0' is out of range", "use a positive factor"});
  expect_error(kBase + "optimizations: {gradient_compression: fp16, gradient_predivide_factor: half}\n",
               {"optimizations.gradient_predivide_factor", "'half' is not a number"});
  expect_error(kBase + "optimizations: {gradient_compression: false, error_feedback: true}\n",
               {"optimizations.error_feedback", "'true' needs a compressed gradient"});
  expect_error(kBase + "optimizations: {error_feedback: yes please}\n",
               {"optimizations.error_feedback", "'yes please' is not true or false"});
  expect_error(kBase + "optimizations: {gradient_compresion: true}\n",
               {"optimizations.gradient_compresion", "did you mean 'gradient_compression'?"});

  // A predivide factor without compression changes nothing: a warning, kept when the slot count changes.
  auto w = parse_config(kBase + "optimizations: {gradient_predivide_factor: 4}\n");
  ASSERT_EQ(w.warnings.size(), 1u);
  EXPECT_NE(w.warnings[0].find("gradient_predivide_factor acts only on compressed gradients"), std::string::npos);
  set_slots(w, 3);  // 64 over 3 slots adds the remainder warning
  ASSERT_EQ(w.warnings.size(), 2u);
  EXPECT_NE(w.warnings[0].find("gradient_predivide_factor"), std::string::npos);
  EXPECT_NE(w.warnings[1].find("1 dropped per step"), std::string::npos);
}

TEST(TrainerConfig, MissingRequiredKeys) {
  expect_error("name: x\nsearcher: {max_length: {batches: 10}}\n", {"hyperparameters: missing", "global_batch_size"});
  expect_error("hyperparameters: {global_batch_size: 8}\n", {"searcher.max_length: missing", "max_length: {epochs: 1}"});
}

TEST(TrainerConfig, SeveralProblemsAreAllListed) {
  const std::string msg = error_of(kBase + "max_restart: 1\noptimizations: {aggregation_frequency: x}\n");
  EXPECT_NE(msg.find("2 problems"), std::string::npos) << msg;
}

TEST(TrainerConfig, PerSlotBatchDropsTheRemainderWithAWarning) {
  auto c = parse_config(R"(
hyperparameters: {global_batch_size: 100}
resources: {slots_per_trial: 3}
searcher: {max_length: {batches: 10}}
)");
  EXPECT_EQ(c.per_slot_batch(), 33);
  EXPECT_EQ(c.effective_global_batch(), 99);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("33 samples per batch, 1 dropped per step"), std::string::npos) << c.warnings[0];
  set_slots(c, 4);
  EXPECT_EQ(c.per_slot_batch(), 25);
  EXPECT_TRUE(c.warnings.empty());
  set_slots(c, 3, 32);  // --per-slot-batch: the global batch follows the slots
  EXPECT_EQ(c.global_batch_size, 96);
  EXPECT_EQ(c.per_slot_batch(), 32);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(TrainerConfig, MoreSlotsThanSamplesIsAnError) {
  expect_error(R"(
hyperparameters: {global_batch_size: 4}
resources: {slots_per_trial: 8}
searcher: {max_length: {batches: 10}}
)",
               {"resources.slots_per_trial", "8 slots cannot share a global batch of 4", "at least 8"});
  auto c = parse_config(kBase);
  EXPECT_THROW(set_slots(c, 65), ConfigError);
}

TEST(TrainerConfig, MultiHostLayoutFailsAtOnceWithTheReason) {
  expect_error(R"(
hyperparameters: {global_batch_size: 64}
resources: {slots_per_trial: 6, slots_per_host: 4}
searcher: {max_length: {batches: 10}}
)",
               {"resources.slots_per_trial", "6 is not a multiple of resources.slots_per_host 4", "e.g. 8"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64}
resources: {slots_per_trial: 8, slots_per_host: 2, hosts: [a, b, c]}
searcher: {max_length: {batches: 10}}
)",
               {"need 4 hosts, resources.hosts lists 3"});
  auto ok = parse_config(R"(
hyperparameters: {global_batch_size: 64}
resources: {slots_per_trial: 4, slots_per_host: 2, hosts: [a, b]}
searcher: {max_length: {batches: 10}}
)");
  EXPECT_EQ(ok.hosts.size(), 2u);
}

TEST(TrainerConfig, LengthsInBatchesRecordsEpochs) {
  auto c = parse_config(kBase);
  EXPECT_EQ(c.to_batches({LengthUnit::batches, 7}, 60000), 7);
  EXPECT_EQ(c.to_batches({LengthUnit::records, 640}, 60000), 10);
  EXPECT_EQ(c.to_batches({LengthUnit::records, 641}, 60000), 11);
  EXPECT_EQ(c.to_batches({LengthUnit::epochs, 1}, 60000), 938);
}

TEST(TrainerConfig, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(did_you_mean("slots_per_trail", {"slots_per_trial", "slots_per_host"}), "slots_per_trial");
  EXPECT_EQ(did_you_mean("xyz", {"slots_per_trial"}), "");
  EXPECT_EQ(parse_slot_list("1,2,4"), (std::vector<int>{1, 2, 4}));
  EXPECT_THROW(parse_slot_list("1,,4"), ConfigError);
  EXPECT_THROW(parse_slot_list("0"), ConfigError);
}

TEST(TrainerData, SlotsSplitTheGlobalBatchOfOneEpochOrder) {
  BatchPlan one(1000, 64, 64, 7), two(1000, 64, 32, 7);
  EXPECT_EQ(one.batches_per_epoch(), 15);  // the partial global batch is dropped
  for (int64_t b : {0, 5, 14, 15, 31}) {
    auto whole = one.shard(b, 0);
    auto a = two.shard(b, 0), c = two.shard(b, 1);
    a.insert(a.end(), c.begin(), c.end());
    EXPECT_EQ(whole, a) << "batch " << b;
  }
  // Every record of an epoch at most once; a new order each epoch.
  std::set<int64_t> seen;
  for (int64_t b = 0; b < 15; ++b)
    for (auto i : one.shard(b, 0)) EXPECT_TRUE(seen.insert(i).second);
  EXPECT_NE(one.shard(0, 0), one.shard(15, 0));
  EXPECT_EQ(validation_range(10000, 1, 3), (std::pair<int64_t, int64_t>{3333, 6666}));
}

TEST(TrainerData, FashionMnistFromTheDebianPackage) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/t10k-images-idx3-ubyte.gz")) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto test = load_fashion_mnist(dir, false);
  EXPECT_EQ(test.size, 10000);
  EXPECT_EQ(test.rows, 28);
  std::vector<int> per_class(10);
  for (auto l : test.labels) ++per_class[l];
  for (int n : per_class) EXPECT_EQ(n, 1000);
  EXPECT_THROW(load_idx(dir + "/t10k-labels-idx1-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz"), std::runtime_error);
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tandem_trainer_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

using TrainerCheckpoint = TempDir;

TEST_F(TrainerCheckpoint, RoundTripAndTornFilesAreRejected) {
  Blobs blobs{{"model", std::string(100000, 'm')}, {"meta", "{\"batch\":20}"}};
  const std::string p20 = checkpoint_path(dir_.string(), 20), p40 = checkpoint_path(dir_.string(), 40);
  write_checkpoint(p20, blobs);
  EXPECT_EQ(read_checkpoint(p20), blobs);
  blobs["meta"] = "{\"batch\":40}";
  write_checkpoint(p40, blobs);
  EXPECT_FALSE(std::filesystem::exists(dir_ / ".ckpt-000000000040.tck.tmp"));

  // Torn: cut short, as by a crash mid-write without the rename.
  std::filesystem::resize_file(p40, std::filesystem::file_size(p40) - 1000);
  try {
    read_checkpoint(p40);
    FAIL() << "torn checkpoint loaded";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_NE(std::string(e.what()).find("torn"), std::string::npos) << e.what();
  }
  std::vector<std::string> warnings;
  auto found = latest_checkpoint(dir_.string(), &warnings);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->batch, 20);  // the older intact one
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ckpt-000000000040.tck"), std::string::npos);

  // Same length, one byte flipped: the checksum catches it.
  {
    std::fstream f(p20, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('x');
  }
  EXPECT_THROW(read_checkpoint(p20), CorruptCheckpoint);
  EXPECT_FALSE(latest_checkpoint(dir_.string()));
  std::ofstream(dir_ / "ckpt-000000000060.tck") << "garbage";
  EXPECT_THROW(read_checkpoint(checkpoint_path(dir_.string(), 60)), CorruptCheckpoint);
}

TEST_F(TrainerCheckpoint, PruneKeepsTheNewest) {
  for (int b : {10, 20, 30}) write_checkpoint(checkpoint_path(dir_.string(), b), {{"x", "y"}});
  prune_checkpoints(dir_.string(), 2);
  EXPECT_FALSE(std::filesystem::exists(checkpoint_path(dir_.string(), 10)));
  EXPECT_TRUE(std::filesystem::exists(checkpoint_path(dir_.string(), 30)));
}

using TrainerMetrics = TempDir;

TEST_F(TrainerMetrics, FileSummaryAndResumeTruncation) {
  const std::string path = (dir_ / "metrics.jsonl").string();
  {
    MetricsWriter w(path, -1);
    w.line(R"({"kind":"start","batch":0,"slots":2,"global_batch":64,"resumed_from":-1})");
    for (int b = 1; b <= 10; ++b) {
      TrainRecord r;
      r.batch = b, r.time = b, r.loss = 1.0 / b, r.samples_per_s = 100, r.step = 0.5, r.exposed = 0.1, r.communication = 0.4;
      w.train(r);
    }
    w.validation({5, 5.0, 0.5, 0.80, 10000});
    w.validation({10, 10.0, 0.4, 0.86, 10000});
  }
  auto s = read_metrics(path);
  EXPECT_EQ(s.train.size(), 10u);
  EXPECT_DOUBLE_EQ(s.hidden_fraction(), 0.75);
  EXPECT_DOUBLE_EQ(s.time_to_accuracy(0.85), 10.0);
  EXPECT_LT(s.time_to_accuracy(0.9), 0);
  EXPECT_DOUBLE_EQ(s.samples_per_s(), 100);
  const std::string table = summary_table(s, 0.85);
  EXPECT_NE(table.find("time to 85.0% validation accuracy  10.0 s"), std::string::npos) << table;
  EXPECT_NE(table.find("communication hidden               75.0%"), std::string::npos) << table;
  { MetricsWriter resumed(path, 6); }  // a restart from batch 6 drops what came after
  s = read_metrics(path);
  EXPECT_EQ(s.train.size(), 6u);
  EXPECT_EQ(s.validation.size(), 1u);
}

TEST(TrainerStall, SlowStepAgainstTheRunningMedian) {
  StallDetector d(3.0, 50);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(d.add(0.1 + 0.001 * (i % 3)));
  EXPECT_FALSE(d.add(0.25));
  EXPECT_TRUE(d.add(0.5));
  EXPECT_NEAR(d.median(), 0.101, 1e-9);
}

}  // namespace
}  // namespace tandem::trainer
