// The trainer's optimizers: update_rows over row blocks, in any order, equals
// LibTorch's optimizer.step() bitwise for SGD (momentum, Nesterov, weight
// decay), Adam, AdamW and Adadelta over several steps; learning_rate_at's closed forms.
#include "optimizer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "config.h"

namespace tandem::trainer {
namespace {

ExperimentConfig config_of(const std::string& yaml_hyperparameters) {
  return parse_config("hyperparameters: {global_batch_size: 64, learning_rate: 0.05" + yaml_hyperparameters +
                      "}\nsearcher: {name: single, max_length: {batches: 100}}\n");
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() &&
         std::memcmp(a.data_ptr<float>(), b.data_ptr<float>(), a.numel() * sizeof(float)) == 0;
}

// Trains two copies of the same parameters with the same gradients: one with optimizer.step(),
// one by update_rows over random row blocks in a random order; after every step they must agree bitwise.
void expect_rows_equal_step(const ExperimentConfig& c, bool whole_blocks) {
  torch::manual_seed(7);
  const std::vector<std::vector<int64_t>> shapes = {{37, 11}, {64}, {9, 4, 3}, {1, 5}, {}};  // {}: a scalar
  std::vector<torch::Tensor> a, b;
  for (const auto& s : shapes) {
    auto t = torch::randn(s);
    a.push_back(t.clone().set_requires_grad(true));
    b.push_back(t.clone().set_requires_grad(true));
  }
  auto step_opt = make_optimizer(c, a);
  auto rows_opt = make_optimizer(c, b);
  std::mt19937 rng(11);
  for (int64_t step = 1; step <= 5; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      auto g = torch::randn(a[i].sizes());
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    step_opt->step();
    std::vector<std::pair<size_t, std::pair<int64_t, int64_t>>> blocks;  // parameter, [begin, rows)
    for (size_t i = 0; i < b.size(); ++i) {
      const int64_t n = b[i].dim() == 0 ? 1 : b[i].size(0);
      if (whole_blocks) {
        blocks.push_back({i, {0, n}});
        continue;
      }
      for (int64_t begin = 0; begin < n;) {
        const int64_t rows = std::min<int64_t>(n - begin, 1 + static_cast<int64_t>(rng() % 9));
        blocks.push_back({i, {begin, rows}});
        begin += rows;
      }
    }
    std::shuffle(blocks.begin(), blocks.end(), rng);
    for (const auto& [i, block] : blocks) update_rows(*rows_opt, b[i], block.first, block.second, step);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_TRUE(bitwise_equal(a[i].detach(), b[i].detach()))
          << c.optimizer << " step " << step << " parameter " << i << ": max difference "
          << (a[i] - b[i]).abs().max().item<float>();
  }
}

struct Case {
  const char* name;
  const char* hyperparameters;
};

class UpdateRows : public ::testing::TestWithParam<Case> {};

TEST_P(UpdateRows, BlockByBlockEqualsStepBitwise) {
  const auto c = config_of(GetParam().hyperparameters);
  expect_rows_equal_step(c, false);
  expect_rows_equal_step(c, true);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, UpdateRows,
    ::testing::Values(Case{"sgd", ", momentum: 0"}, Case{"sgd_momentum", ", momentum: 0.9"},
                      Case{"sgd_nesterov_decay", ", momentum: 0.9, nesterov: true, weight_decay: 0.01"},
                      Case{"adam", ", optimizer: adam"},
                      Case{"adam_decay", ", optimizer: adam, beta1: 0.8, beta2: 0.99, eps: 1e-6, weight_decay: 0.01"},
                      Case{"adamw", ", optimizer: adamw, weight_decay: 0.01"},
                      Case{"adadelta", ", optimizer: adadelta"},
                      Case{"adadelta_decay", ", optimizer: adadelta, weight_decay: 0.01"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Optimizer, MakeOptimizerFollowsTheConfig) {
  std::vector<torch::Tensor> params = {torch::zeros({2}, torch::requires_grad())};
  auto sgd = make_optimizer(config_of(", momentum: 0.5, nesterov: true, weight_decay: 0.1"), params);
  auto& so = static_cast<torch::optim::SGDOptions&>(sgd->param_groups()[0].options());
  EXPECT_EQ(so.lr(), 0.05);
  EXPECT_EQ(so.momentum(), 0.5);
  EXPECT_TRUE(so.nesterov());
  EXPECT_EQ(so.weight_decay(), 0.1);
  auto adamw = make_optimizer(config_of(", optimizer: adamw, beta1: 0.8, beta2: 0.95, eps: 1e-6"), params);
  ASSERT_NE(dynamic_cast<torch::optim::AdamW*>(adamw.get()), nullptr);
  auto& ao = static_cast<torch::optim::AdamWOptions&>(adamw->param_groups()[0].options());
  EXPECT_EQ(std::get<0>(ao.betas()), 0.8);
  EXPECT_EQ(std::get<1>(ao.betas()), 0.95);
  EXPECT_EQ(ao.eps(), 1e-6);
  EXPECT_EQ(ao.weight_decay(), 0.0);  // the config's default, not LibTorch's 1e-2
  set_learning_rate(*adamw, 0.125);
  EXPECT_EQ(ao.lr(), 0.125);
}

// Adadelta as PyTorch's torch.optim.Adadelta computes it (rho 0.9, eps 1e-6), step by step.
TEST(Optimizer, AdadeltaFollowsPyTorchsFormula) {
  torch::manual_seed(3);
  const auto start = torch::randn({5, 3});
  auto p = start.clone().set_requires_grad(true);
  auto optimizer = make_optimizer(config_of(", optimizer: adadelta, weight_decay: 0.1"), {p});
  auto expected = start.clone(), square_avg = torch::zeros_like(start), acc_delta = torch::zeros_like(start);
  const double lr = 0.05, rho = 0.9, eps = 1e-6, decay = 0.1;
  for (int step = 0; step < 4; ++step) {
    const auto g = torch::randn({5, 3});
    p.mutable_grad() = g.clone();
    optimizer->step();
    const auto grad = g + decay * expected;
    square_avg = rho * square_avg + (1 - rho) * grad * grad;
    const auto delta = torch::sqrt(acc_delta + eps) / torch::sqrt(square_avg + eps) * grad;
    acc_delta = rho * acc_delta + (1 - rho) * delta * delta;
    expected = expected - lr * delta;
    EXPECT_TRUE(torch::allclose(p.detach(), expected, 1e-6, 1e-7)) << "step " << step;
  }
}

TEST(Optimizer, LearningRateClosedForms) {
  const double lr = 0.05;
  // Constant with a warm-up of 10 batches: lr * step / 10, then lr.
  auto c = config_of(", lr_schedule: {type: constant, warmup: {batches: 10}}");
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 1, 100, 50), lr / 10);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 5, 100, 50), lr * 5 / 10);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 10, 100, 50), lr);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 77, 100, 50), lr);
  EXPECT_DOUBLE_EQ(learning_rate_at(config_of(""), 1, 100, 50), lr);  // no schedule
  // Step: times gamma every epoch (50 steps) after a warm-up of 128 records = 2 batches of 64.
  c = config_of(", lr_schedule: {type: step, warmup: {records: 128}, step_size: {epochs: 1}, gamma: 0.5}");
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 1, 200, 50), lr / 2);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 3, 200, 50), lr);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 52, 200, 50), lr);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 53, 200, 50), lr * 0.5);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 152, 200, 50), lr * 0.25);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 153, 200, 50), lr * 0.125);
  // Cosine from lr at the warm-up's end (step 20) to min at the last step (120); the midpoint is the mean.
  c = config_of(", lr_schedule: {type: cosine, warmup: {batches: 20}, min_learning_rate: 0.01}");
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 20, 120, 50), lr);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 70, 120, 50), (lr + 0.01) / 2);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 120, 120, 50), 0.01);
  EXPECT_DOUBLE_EQ(learning_rate_at(c, 45, 120, 50), 0.01 + (lr - 0.01) * 0.5 * (1 + std::cos(M_PI / 4)));
}

}  // namespace
}  // namespace tandem::trainer
