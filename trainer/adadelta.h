// Adadelta (Zeiler 2012) as PyTorch 1.13's torch.optim.Adadelta computes it,
// which LibTorch's C++ API lacks: the optimizer of Determined's mnist_pytorch
// tutorial (learning_rate 1.0). Elementwise, so a row block of a parameter is
// updated with the same operations, and bits, as the whole.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <vector>

namespace tandem::trainer {

struct AdadeltaOptions : torch::optim::OptimizerCloneableOptions<AdadeltaOptions> {
  explicit AdadeltaOptions(double lr = 1.0) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1.0;
  TORCH_ARG(double, rho) = 0.9;  // PyTorch's defaults
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct AdadeltaParamState : torch::optim::OptimizerCloneableParamState<AdadeltaParamState> {
  TORCH_ARG(torch::Tensor, square_avg);  // running mean of the squared gradient
  TORCH_ARG(torch::Tensor, acc_delta);   // running mean of the squared update
  TORCH_ARG(int64_t, step) = 0;
};

class Adadelta : public torch::optim::Optimizer {
 public:
  Adadelta(const std::vector<torch::Tensor>& params, const AdadeltaOptions& defaults);
  torch::Tensor step(LossClosure closure = nullptr) override;
};

// The update of rows [begin, begin + rows) of p from its .grad, on the optimizer's own state
// (made for the whole parameter the first time).
void adadelta_rows(torch::optim::Optimizer& o, const AdadeltaOptions& options, const torch::Tensor& p, int64_t begin,
                   int64_t rows, int64_t step);

}  // namespace tandem::trainer
