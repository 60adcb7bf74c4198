#include "adadelta.h"

#include <torch/torch.h>

namespace tandem::trainer {

Adadelta::Adadelta(const std::vector<torch::Tensor>& params, const AdadeltaOptions& defaults)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(params)},
                              std::make_unique<AdadeltaOptions>(defaults)) {}

torch::Tensor Adadelta::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups()) {
    const auto& options = static_cast<const AdadeltaOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto found = state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      const int64_t done = found == state().end() ? 0 : static_cast<AdadeltaParamState&>(*found->second).step();
      adadelta_rows(*this, options, p, 0, p.dim() == 0 ? 1 : p.size(0), done + 1);
    }
  }
  return loss;
}

void adadelta_rows(torch::optim::Optimizer& o, const AdadeltaOptions& options, const torch::Tensor& p, int64_t begin,
                   int64_t rows, int64_t step) {
  auto part = [&](const torch::Tensor& t) { return t.dim() == 0 ? t : t.narrow(0, begin, rows); };
  auto& states = o.state();
  const std::string key = c10::guts::to_string(p.unsafeGetTensorImpl());
  auto found = states.find(key);
  if (found == states.end()) {
    auto entry = std::make_unique<AdadeltaParamState>();
    entry->square_avg(torch::zeros_like(p.data(), torch::MemoryFormat::Preserve));
    entry->acc_delta(torch::zeros_like(p.data(), torch::MemoryFormat::Preserve));
    found = states.emplace(key, std::move(entry)).first;
  }
  auto& state = static_cast<AdadeltaParamState&>(*found->second);
  state.step(step);
  auto param = part(p.data());
  auto grad = part(p.grad().data());
  auto square_avg = part(state.square_avg());
  auto acc_delta = part(state.acc_delta());
  const double rho = options.rho();
  if (options.weight_decay() != 0) grad = grad.add(param, options.weight_decay());
  square_avg.mul_(rho).addcmul_(grad, grad, 1 - rho);
  const auto rms_gradient = square_avg.add(options.eps()).sqrt_();
  const auto delta = acc_delta.add(options.eps()).sqrt_().div_(rms_gradient).mul_(grad);
  acc_delta.mul_(rho).addcmul_(delta, delta, 1 - rho);
  param.add_(delta, -options.lr());
}

}  // namespace tandem::trainer
