// Checkpoints written by CheckpointWriter: model and optimizer state round
// trip; torn, sidecar-less and CRC-mismatched files are skipped with a warning
// naming the file and the check; a process killed mid-write leaves the
// previous checkpoint to resume from; KeepPolicy in both metric directions;
// Python's torch.load reads the model; never two writes in flight.
#include "checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "adadelta.h"

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tandem_checkpoints_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string sidecar(int64_t batch) const {
    return (dir_ / fs::path(checkpoint_file(dir(), batch)).stem()).string() + ".json";
  }
  fs::path dir_;
};

const std::vector<std::string> kNames = {"conv1.weight", "conv1.bias", "fc.weight"};

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(3);
  return {torch::randn({4, 1, 3, 3}).set_requires_grad(true), torch::randn({4}).set_requires_grad(true),
          torch::randn({10, 36}).set_requires_grad(true)};
}

void train_steps(torch::optim::Optimizer& o, const std::vector<torch::Tensor>& params, int steps, int seed) {
  torch::manual_seed(seed);
  for (int s = 0; s < steps; ++s) {
    for (const auto& p : params) p.mutable_grad() = torch::randn(p.sizes());
    o.step();
  }
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() && torch::equal(a, b);
}

// A snapshot of a small model with an SGD optimizer (no state).
CheckpointSnapshot small_snapshot(int64_t batch, std::optional<double> metric = std::nullopt) {
  std::vector<torch::Tensor> params = {torch::full({3}, static_cast<float>(batch))};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  return take_snapshot(batch, {"w"}, params, sgd, {{"batch", batch}}, metric);
}

template <class Optimizer, class Options>
void expect_round_trip(const std::string& dir, Options options) {
  auto params = make_params();
  Optimizer live(params, options);
  train_steps(live, params, 3, 1);
  {
    CheckpointWriter writer(dir, KeepPolicy{});
    writer.submit(take_snapshot(3, kNames, params, live, {{"batch", 3}, {"epoch", 0}}, 0.75));
    // The snapshot is a copy: training on does not reach the file.
    train_steps(live, params, 1, 2);
    writer.drain();
    EXPECT_EQ(writer.written(), 1);
  }
  std::vector<std::string> warnings;
  auto found = latest_checkpoint(dir, &warnings);
  ASSERT_TRUE(found);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(found->batch, 3);
  EXPECT_EQ(found->meta.at("epoch"), 0);
  EXPECT_EQ(found->metric, 0.75);
  ASSERT_EQ(found->model.size(), kNames.size());

  // Replays the 4th step on the restored copy: it must land on the live parameters bitwise.
  std::vector<torch::Tensor> restored;
  for (const auto& n : kNames) restored.push_back(found->model.at(n).clone().set_requires_grad(true));
  Optimizer again(restored, options);
  restore_optimizer(*found, again);
  train_steps(again, restored, 1, 2);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(same_bits(params[i].detach(), restored[i].detach())) << kNames[i];
}

TEST_F(Checkpoints, ModelAndOptimizerStateRoundTrip) {
  expect_round_trip<torch::optim::SGD>(dir() + "/sgd", torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true));
  expect_round_trip<torch::optim::Adam>(dir() + "/adam", torch::optim::AdamOptions(0.01).weight_decay(0.01));
  expect_round_trip<torch::optim::AdamW>(dir() + "/adamw", torch::optim::AdamWOptions(0.01));
  expect_round_trip<Adadelta>(dir() + "/adadelta", AdadeltaOptions(1.0).weight_decay(0.01));
  // A state of another optimizer kind is refused, naming both.
  auto found = latest_checkpoint(dir() + "/adam");
  ASSERT_TRUE(found);
  auto params = make_params();
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
  try {
    restore_optimizer(*found, sgd);
    FAIL() << "adam state restored into sgd";
  } catch (const CorruptCheckpoint& e) {
    EXPECT_NE(std::string(e.what()).find("holds adam state but the optimizer is sgd"), std::string::npos) << e.what();
  }
}

// Writes batches 10 and 20, damages 20 with `damage`, and expects 10 back with one warning holding `check`.
void expect_skipped(const std::string& dir, const std::function<void()>& damage, const std::string& check) {
  {
    CheckpointWriter writer(dir, KeepPolicy{5, 0, false});
    writer.submit(small_snapshot(10));
    writer.submit(small_snapshot(20));
  }
  damage();
  std::vector<std::string> warnings;
  auto found = latest_checkpoint(dir, &warnings);
  ASSERT_TRUE(found) << check;
  EXPECT_EQ(found->batch, 10) << check;
  EXPECT_TRUE(same_bits(found->model.at("w"), torch::full({3}, 10.0f)));
  ASSERT_EQ(warnings.size(), 1u) << check;
  EXPECT_NE(warnings[0].find("ckpt-000000000020.pt"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find(check), std::string::npos) << warnings[0];
}

TEST_F(Checkpoints, TornSidecarLessAndCorruptFilesAreSkipped) {
  const std::string p20 = checkpoint_file(dir(), 20);
  expect_skipped(
      dir(), [&] { fs::resize_file(p20, fs::file_size(p20) - 100); }, "torn");
  expect_skipped(
      dir(), [&] { fs::remove(sidecar(20)); }, "no sidecar");
  expect_skipped(
      dir(),
      [&] {
        std::fstream f(p20, std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(600);
        const char c = static_cast<char>(f.get());
        f.seekp(600);
        f.put(static_cast<char>(c ^ 0x5a));
      },
      "CRC-32 mismatch");
  // The next prune removes a sidecar-less file (a CRC mismatch shows only on reading).
  fs::remove(sidecar(20));
  CheckpointWriter(dir(), KeepPolicy{5, 0, false}).submit(small_snapshot(30));
  EXPECT_FALSE(fs::exists(p20));
  EXPECT_TRUE(fs::exists(checkpoint_file(dir(), 10)));
  EXPECT_TRUE(fs::exists(checkpoint_file(dir(), 30)));
}

TEST_F(Checkpoints, KilledMidWriteLeavesThePreviousCheckpoint) {
  CheckpointWriter(dir(), KeepPolicy{}).submit(small_snapshot(10));
  CheckpointSnapshot next = small_snapshot(20);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(60);
    CheckpointWriter writer(dir(), KeepPolicy{}, /*kill_after_bytes=*/300);
    writer.submit(std::move(next));
    writer.drain();
    ::_exit(3);  // not reached: the writer killed the process
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      FAIL() << "the child did not die mid-write within 60 s";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_EQ(fs::file_size(checkpoint_file(dir(), 20) + ".tmp"), 300u);
  EXPECT_FALSE(fs::exists(checkpoint_file(dir(), 20)));
  std::vector<std::string> warnings;
  auto found = latest_checkpoint(dir(), &warnings);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->batch, 10);
  EXPECT_TRUE(warnings.empty());                                     // a temporary file is no checkpoint
  CheckpointWriter(dir(), KeepPolicy{}).submit(small_snapshot(30));  // the next prune removes the leftover
  EXPECT_FALSE(fs::exists(checkpoint_file(dir(), 20) + ".tmp"));
}

std::vector<int64_t> batches_in(const std::string& dir) {
  std::vector<int64_t> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".pt") out.push_back(std::stoll(e.path().stem().string().substr(5)));
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(Checkpoints, KeepPolicyKeepsLatestAndBestInBothDirections) {
  // Accuracy: larger is better. Batch 2 (0.9) stays best; 6 has no validation.
  {
    CheckpointWriter w(dir() + "/acc", KeepPolicy{1, 1, false});
    const std::vector<double> accuracy = {0.5, 0.9, 0.7, 0.6, 0.8};
    for (int b = 1; b <= 5; ++b) w.submit(small_snapshot(b, accuracy[b - 1]));
    w.submit(small_snapshot(6));
    w.drain();
    EXPECT_EQ(batches_in(dir() + "/acc"), (std::vector<int64_t>{2, 6}));
    EXPECT_EQ(best_checkpoint(dir() + "/acc", KeepPolicy{1, 1, false}), checkpoint_file(dir() + "/acc", 2));
    w.submit(small_snapshot(7, 0.95));  // a new best replaces the old
    w.drain();
    EXPECT_EQ(batches_in(dir() + "/acc"), (std::vector<int64_t>{7}));
  }
  // Loss: smaller is better; two latest and two best.
  CheckpointWriter w(dir() + "/loss", KeepPolicy{2, 2, true});
  const std::vector<double> loss = {0.5, 0.2, 0.4, 0.3, 0.6, 0.7};
  for (int b = 1; b <= 6; ++b) w.submit(small_snapshot(b, loss[b - 1]));
  w.drain();
  EXPECT_EQ(batches_in(dir() + "/loss"), (std::vector<int64_t>{2, 4, 5, 6}));
  EXPECT_EQ(best_checkpoint(dir() + "/loss", KeepPolicy{2, 2, true}), checkpoint_file(dir() + "/loss", 2));
  // The policy of the checkpoint_storage and searcher keys.
  const auto c = parse_config(
      "hyperparameters: {global_batch_size: 8}\n"
      "searcher: {metric: validation_loss, max_length: {batches: 1}}\n"
      "checkpoint_storage: {host_path: ck, save_trial_best: 3, save_trial_latest: 2}\n");
  const KeepPolicy from_config = keep_policy(c);
  EXPECT_EQ(from_config.latest, 2);
  EXPECT_EQ(from_config.best, 3);
  EXPECT_TRUE(from_config.smaller_is_better);
  // The newest is kept even with latest = 0.
  CheckpointWriter none(dir() + "/none", KeepPolicy{0, 0, false});
  for (int b = 1; b <= 3; ++b) none.submit(small_snapshot(b));
  none.drain();
  EXPECT_EQ(batches_in(dir() + "/none"), (std::vector<int64_t>{3}));
}

TEST_F(Checkpoints, PythonTorchLoadReadsTheModel) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no torch (python3-torch): torch.load not checked";
  std::vector<torch::Tensor> params = {torch::arange(6, torch::kFloat32).reshape({2, 3}), torch::tensor({0.5f, -1.5f})};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  CheckpointWriter(dir(), KeepPolicy{})
      .submit(take_snapshot(7, {"conv1.weight", "fc.bias"}, params, sgd, {{"batch", 7}}, 0.5));
  const std::string script = dir() + "/load.py", out = dir() + "/out.txt";
  std::ofstream(script) << "import json, sys, torch\n"
                           "d = torch.load(sys.argv[1])\n"
                           "m = d['model']\n"
                           "print(json.dumps({'names': list(m.keys()), 'w': m['conv1.weight'].tolist(),\n"
                           "  'b': m['fc.bias'].tolist(), 'batch': json.loads(d['meta'])['batch'],\n"
                           "  'kind': d['optimizer']['kind']}))\n";
  const std::string cmd = "timeout 120 /usr/bin/python3 " + script + " " + checkpoint_file(dir(), 7) + " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const auto got = nlohmann::json::parse(in);
  EXPECT_EQ(got["names"], nlohmann::json({"conv1.weight", "fc.bias"}));
  EXPECT_EQ(got["w"], nlohmann::json({{0.0, 1.0, 2.0}, {3.0, 4.0, 5.0}}));
  EXPECT_EQ(got["b"], nlohmann::json({0.5, -1.5}));
  EXPECT_EQ(got["batch"], 7);
  EXPECT_EQ(got["kind"], "sgd");
}

TEST_F(Checkpoints, SubmitNeverOverlapsTwoWritesAndRaisesErrorsLater) {
  std::vector<torch::Tensor> big = {torch::randn({4 << 20})};  // 16 MiB: a write takes a while
  torch::optim::SGD sgd(big, torch::optim::SGDOptions(0.1));
  CheckpointWriter w(dir(), KeepPolicy{10, 0, false});
  w.submit(take_snapshot(1, {"w"}, big, sgd, {}, std::nullopt));
  w.submit(take_snapshot(2, {"w"}, big, sgd, {}, std::nullopt));
  // The second submit returned only once the first write had finished, sidecar and all.
  EXPECT_TRUE(fs::exists(sidecar(1)));
  EXPECT_FALSE(fs::exists(checkpoint_file(dir(), 1) + ".tmp"));
  w.drain();
  EXPECT_EQ(w.written(), 2);
  EXPECT_GT(w.wait_seconds(), 0.0);
  EXPECT_GT(w.write_seconds(), w.wait_seconds() / 2);

  // A write that fails (the directory is a file) raises on the next call.
  std::ofstream(dir() + "/file") << "x";
  CheckpointWriter bad(dir() + "/file/sub", KeepPolicy{});
  bad.submit(small_snapshot(1));
  EXPECT_THROW(bad.drain(), std::exception);
  bad.drain();  // raised once
}

}  // namespace
}  // namespace tandem::trainer
