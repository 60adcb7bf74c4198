// The models `hyperparameters.model` names, in LibTorch.
//  - convnet: the dataset package's benchmark/convnet.py (conv 32 5x5 same,
//    max-pool 2, conv 64 5x5 same, max-pool 2, fc 1024, dropout, fc 10;
//    3,274,634 parameters; the convolutions' weights kept channels-last).
//  - mlp: 784 -> hidden -> hidden -> 10, ReLU.
// `slices` > 1 computes each hidden fully-connected layer (the convnet's fc1,
// the mlp's fc1 and fc2) in that many row blocks of its weight (blocks of
// output features). The parameters stay those of nn::Linear, whole (the same
// model, state and checkpoints as with slices = 1), but backward produces the
// weight's gradient block by block, one GEMM each, adds each block into
// weight.grad itself and hands it to the model's gradient sink, so the
// gradient-sync engine can send the first blocks while the others compute
// (autograd alone would hand over the whole gradient after the last GEMM).
// Such a layer's bias gradient goes to the sink first, whole.
//
// Each forward passes every parameter (and each block of a sliced weight)
// through the model's gate just before using it, so a parameter can be
// updated as late as its first use (the trainer's deferred updates). A sliced
// layer computes its blocks last first: the order their reductions land in
// after backward (fusion's register_gradient_parts).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem::trainer {

// (parameter, part): part k of a sliced layer's weight is its k-th row block;
// every other parameter is one part, 0.
using ParameterHook = std::function<void(const torch::Tensor&, int part)>;
// Called with each parameter part just before forward uses it; empty = nothing.
using ParameterGate = std::shared_ptr<ParameterHook>;
// Called from backward once a sliced layer's parameter part has been added into .grad.
using GradientSink = std::shared_ptr<ParameterHook>;

// y = x W^T + b, with W and b initialised and named as nn::Linear's. With
// slices > 1, W is computed in row blocks (see above; bounds: row_blocks.h).
struct SlicedLinearImpl : torch::nn::Module {
  SlicedLinearImpl(int64_t in, int64_t out, int slices, ParameterGate gate = nullptr, GradientSink sink = nullptr);
  torch::Tensor forward(const torch::Tensor& x);
  bool sliced() const { return bounds.size() > 2; }
  // Element counts of W's blocks (one entry when whole).
  std::vector<size_t> weight_parts() const;
  torch::Tensor weight, bias;
  std::vector<int64_t> bounds;  // row boundaries, blocks + 1 of them
  ParameterGate gate;
  GradientSink sink;
};
TORCH_MODULE(SlicedLinear);

struct ConvNetImpl : torch::nn::Module {
  ConvNetImpl(double dropout, int slices, ParameterGate gate = nullptr, GradientSink sink = nullptr);
  torch::Tensor forward(torch::Tensor x);
  ParameterGate gate;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  SlicedLinear fc1{nullptr};
  torch::nn::Linear fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(ConvNet);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int hidden, double dropout, int slices, ParameterGate gate = nullptr, GradientSink sink = nullptr);
  torch::Tensor forward(torch::Tensor x);
  ParameterGate gate;
  SlicedLinear fc1{nullptr}, fc2{nullptr};
  torch::nn::Linear fc3{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

// A model by name, or a TorchScript module: forward takes [N, 1, 28, 28]
// floats and returns [N, 10] logits.
struct Model {
  std::function<torch::Tensor(torch::Tensor)> forward;
  std::function<void(bool)> set_training;                         // train (dropout on) or eval
  std::vector<std::pair<std::string, torch::Tensor>> parameters;  // named, in the module's order
  // Whether forward passes each parameter through the gate (tandem's own
  // models; a TorchScript module does not, so its updates cannot be deferred).
  bool gated = true;
  ParameterGate gate;  // set *gate to act on each parameter part before its use
  GradientSink sink;   // set *sink to learn when backward has added a sliced layer's part
  // The parameters whose gradients backward hands to the sink rather than to
  // autograd's accumulation (by TensorImpl), with their parts' element counts.
  std::unordered_map<const void*, std::vector<size_t>> sunk_parts;
  // A TorchScript module's str attribute `optimizer`: the optimizer its training
  // code used, taken when hyperparameters.optimizer is not given; "" = none.
  std::string optimizer;
  // The hyperparameters given to load_torchscript that name no attribute of the module.
  std::vector<std::string> unused_hyperparameters;
};
Model make_model(const std::string& name, int mlp_hidden, double dropout, int slices = 1);
// A module saved with torch.jit.save (Python) or torch::jit::Module::save;
// throws std::runtime_error naming the file and what is wrong with it. Each
// hyperparameter (name, value as YAML text) whose name is an int, float, bool
// or str attribute of the module sets that attribute; other names are left.
Model load_torchscript(const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& hyperparameters = {});

}  // namespace tandem::trainer
