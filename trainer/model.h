// The models `hyperparameters.model` names, in LibTorch.
//  - convnet: the dataset package's benchmark/convnet.py (conv 32 5x5 same,
//    max-pool 2, conv 64 5x5 same, max-pool 2, fc 1024, dropout, fc 10;
//    3,274,634 parameters).
//  - mlp: 784 -> hidden -> hidden -> 10, ReLU.
#pragma once

#include <torch/torch.h>

#include <string>

namespace tandem::trainer {

struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(double dropout);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(ConvNet);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int hidden, double dropout);
  torch::Tensor forward(torch::Tensor x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

// A model by name: forward takes [N, 1, 28, 28] floats and returns [N, 10] logits.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(torch::Tensor)> forward;
};
Model make_model(const std::string& name, int mlp_hidden, double dropout);

}  // namespace tandem::trainer
