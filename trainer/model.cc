#include "model.h"

namespace tandem::trainer {

namespace nn = torch::nn;

ConvNetImpl::ConvNetImpl(double dropout) {
  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 5).padding(2)));
  conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 5).padding(2)));
  fc1 = register_module("fc1", nn::Linear(7 * 7 * 64, 1024));
  fc2 = register_module("fc2", nn::Linear(1024, 10));
  drop = register_module("drop", nn::Dropout(dropout));
}

torch::Tensor ConvNetImpl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(conv1(x)), 2);
  x = torch::max_pool2d(torch::relu(conv2(x)), 2);
  x = torch::relu(fc1(x.flatten(1)));
  return fc2(drop(x));
}

MlpImpl::MlpImpl(int hidden, double dropout) {
  fc1 = register_module("fc1", nn::Linear(28 * 28, hidden));
  fc2 = register_module("fc2", nn::Linear(hidden, hidden));
  fc3 = register_module("fc3", nn::Linear(hidden, 10));
  drop = register_module("drop", nn::Dropout(dropout));
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = torch::relu(fc1(x.flatten(1)));
  x = torch::relu(fc2(x));
  return fc3(drop(x));
}

Model make_model(const std::string& name, int mlp_hidden, double dropout) {
  if (name == "mlp") {
    Mlp m(mlp_hidden, dropout);
    return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(x); }};
  }
  ConvNet m(dropout);
  return {m.ptr(), [m](torch::Tensor x) mutable { return m->forward(x); }};
}

}  // namespace tandem::trainer
