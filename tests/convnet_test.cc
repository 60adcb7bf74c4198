// The trainer's convnet computes the dataset package's convnet.py exactly:
// its forward (pooling before the ReLUs; evaluation's strided-view pooling)
// equals conv -> relu -> max_pool2d bitwise, in training (same dropout draw)
// and evaluation, whole and in row blocks of fc1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model.h"

namespace tandem::trainer {
namespace {

namespace F = torch::nn::functional;

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.contiguous(), y = b.contiguous();
  return x.sizes() == y.sizes() &&
         std::memcmp(x.data_ptr<float>(), y.data_ptr<float>(), x.numel() * sizeof(float)) == 0;
}

// convnet.py's forward over the model's own parameters.
torch::Tensor reference(const Model& m, const torch::Tensor& x, bool training, double dropout) {
  std::map<std::string, torch::Tensor> p(m.parameters.begin(), m.parameters.end());
  auto y = torch::max_pool2d(torch::relu(torch::conv2d(x, p.at("conv1.weight"), p.at("conv1.bias"), 1, 2)), 2);
  y = torch::max_pool2d(torch::relu(torch::conv2d(y, p.at("conv2.weight"), p.at("conv2.bias"), 1, 2)), 2);
  y = torch::relu(torch::addmm(p.at("fc1.bias"), y.flatten(1), p.at("fc1.weight").t()));
  y = F::dropout(y, F::DropoutFuncOptions().p(dropout).training(training));
  return torch::addmm(p.at("fc2.bias"), y, p.at("fc2.weight").t());
}

TEST(ConvNet, ForwardEqualsConvReluPoolBitwise) {
  torch::NoGradGuard no_grad;
  for (const bool training : {false, true}) {
    torch::manual_seed(3);
    Model m = make_model("convnet", 0, 0.4, 1);
    m.set_training(training);
    const auto x = torch::randn({7, 1, 28, 28});
    torch::manual_seed(9);
    const auto got = m.forward(x);
    torch::manual_seed(9);
    const auto want = reference(m, x, training, 0.4);
    EXPECT_TRUE(bitwise_equal(got, want))
        << (training ? "training" : "evaluation") << ": max difference " << (got - want).abs().max().item<float>();
  }
}

TEST(ConvNet, RowBlocksEvaluateAsTheWholeLayer) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  Model whole = make_model("convnet", 0, 0.4, 1);
  torch::manual_seed(3);
  Model sliced = make_model("convnet", 0, 0.4, 16);
  whole.set_training(false);
  sliced.set_training(false);
  const auto x = torch::randn({5, 1, 28, 28});
  // Blocks of a GEMM may round differently from the whole one: equal within float rounding.
  EXPECT_TRUE(torch::allclose(whole.forward(x), sliced.forward(x), 1e-5, 1e-6));
}

}  // namespace
}  // namespace tandem::trainer
