#include "model.h"

#include <stdexcept>

namespace tandem::trainer {

namespace nn = torch::nn;

namespace {
void pass(const ParameterGate& gate, const torch::Tensor& p) {
  if (gate && *gate) (*gate)(p);
}
// A whole layer's parameters through the gate.
template <class Layer>
Layer& gated(const ParameterGate& gate, Layer& layer) {
  for (const auto& p : layer->parameters()) pass(gate, p);
  return layer;
}
}  // namespace

SlicedLinearImpl::SlicedLinearImpl(int64_t in, int64_t out, int slices, ParameterGate gate) : gate(std::move(gate)) {
  if (slices < 1 || slices > out) throw std::invalid_argument("a layer of " + std::to_string(out) + " outputs cannot be cut into " + std::to_string(slices) + " slices");
  nn::Linear whole(in, out);  // draws the initial values exactly as an unsliced layer would
  torch::NoGradGuard no_grad;
  for (int k = 0; k < slices; ++k) {
    const int64_t begin = out * k / slices, rows = out * (k + 1) / slices - begin;
    const std::string suffix = slices == 1 ? "" : "_" + std::to_string(k);
    weights.push_back(register_parameter("weight" + suffix, whole->weight.narrow(0, begin, rows).clone()));
    biases.push_back(register_parameter("bias" + suffix, whole->bias.narrow(0, begin, rows).clone()));
  }
}

torch::Tensor SlicedLinearImpl::forward(const torch::Tensor& x) {
  std::vector<torch::Tensor> parts;
  for (size_t k = 0; k < weights.size(); ++k) {
    pass(gate, weights[k]);
    pass(gate, biases[k]);
    parts.push_back(torch::nn::functional::linear(x, weights[k], biases[k]));
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts, 1);
}

ConvNetImpl::ConvNetImpl(double dropout, int slices, ParameterGate gate) : gate(gate) {
  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 5).padding(2)));
  conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 5).padding(2)));
  fc1 = register_module("fc1", SlicedLinear(7 * 7 * 64, 1024, slices, gate));
  fc2 = register_module("fc2", nn::Linear(1024, 10));
  drop = register_module("drop", nn::Dropout(dropout));
}

torch::Tensor ConvNetImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(gated(gate, conv1)(x)), 2);
  x = torch::max_pool2d(torch::relu(gated(gate, conv2)(x)), 2);
  x = torch::relu(fc1(x.flatten(1)));
  return gated(gate, fc2)(drop(x));
}

MlpImpl::MlpImpl(int hidden, double dropout, int slices, ParameterGate gate) : gate(gate) {
  fc1 = register_module("fc1", SlicedLinear(28 * 28, hidden, slices, gate));
  fc2 = register_module("fc2", SlicedLinear(hidden, hidden, slices, gate));
  fc3 = register_module("fc3", nn::Linear(hidden, 10));
  drop = register_module("drop", nn::Dropout(dropout));
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = torch::relu(fc1(x.flatten(1)));
  x = torch::relu(fc2(x));
  return gated(gate, fc3)(drop(x));
}

Model make_model(const std::string& name, int mlp_hidden, double dropout, int slices) {
  auto gate = std::make_shared<std::function<void(const torch::Tensor&)>>();
  if (name == "mlp") {
    Mlp m(mlp_hidden, dropout, slices, gate);
    return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(x); }, gate};
  }
  ConvNet m(dropout, slices, gate);
  return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(x); }, gate};
}

}  // namespace tandem::trainer
