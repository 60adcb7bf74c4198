// The models `hyperparameters.model` names, in LibTorch.
//  - convnet: the dataset package's benchmark/convnet.py (conv 32 5x5 same,
//    max-pool 2, conv 64 5x5 same, max-pool 2, fc 1024, dropout, fc 10;
//    3,274,634 parameters).
//  - mlp: 784 -> hidden -> hidden -> 10, ReLU.
// `slices` > 1 computes each hidden fully-connected layer (the convnet's fc1,
// the mlp's fc1 and fc2) as that many slices of its output features: the same
// function and initial parameters, but backward then produces the layer's
// weight gradient in pieces, one GEMM each, so the gradient-sync engine can
// send the first pieces while the others are still computing.
//
// Each forward passes every parameter through the model's gate just before
// using it, so a parameter can be updated as late as its first use (the
// trainer's deferred updates).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem::trainer {

// Called with each parameter just before forward uses it; empty = nothing.
using ParameterGate = std::shared_ptr<std::function<void(const torch::Tensor&)>>;

// y = x W^T + b with W and b held as `slices` row blocks (parameters weight,
// bias when slices = 1, else weight_k, bias_k), initialised as nn::Linear.
struct SlicedLinearImpl : torch::nn::Module {
  SlicedLinearImpl(int64_t in, int64_t out, int slices, ParameterGate gate = nullptr);
  torch::Tensor forward(const torch::Tensor& x);
  std::vector<torch::Tensor> weights, biases;
  ParameterGate gate;
};
TORCH_MODULE(SlicedLinear);

struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl(double dropout, int slices, ParameterGate gate = nullptr);
  torch::Tensor forward(torch::Tensor x);
  ParameterGate gate;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  SlicedLinear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(ConvNet);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int hidden, double dropout, int slices, ParameterGate gate = nullptr);
  torch::Tensor forward(torch::Tensor x);
  ParameterGate gate;
  SlicedLinear fc1{nullptr}, fc2{nullptr};
  torch::nn::Linear fc3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

// A model by name: forward takes [N, 1, 28, 28] floats and returns [N, 10] logits.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
  ParameterGate gate;  // set *gate to act on each parameter before its use
};
Model make_model(const std::string& name, int mlp_hidden, double dropout, int slices = 1);

}  // namespace tandem::trainer
