// SGD, Adam and AdamW as LibTorch 1.13 computes them (torch/csrc/api/src/optim), Adadelta as PyTorch does,
// restricted to a row block: each is elementwise, so the same operations on a
// narrowed view give the same bits as on the whole parameter.
#include "optimizer.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <stdexcept>

#include "adadelta.h"

namespace tandem::trainer {
namespace {

// Rows [begin, begin + rows) of t; a 0-dim tensor is its own single row.
torch::Tensor rows_of(const torch::Tensor& t, int64_t begin, int64_t rows) {
  return t.dim() == 0 ? t : t.narrow(0, begin, rows);
}

std::string state_key(const torch::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

int64_t length_in_steps(const ExperimentConfig& c, const Length& l, int64_t steps_per_epoch) {
  if (!l.set()) return 0;
  const int64_t g = std::max<int64_t>(1, c.effective_global_batch());
  switch (l.unit) {
    case LengthUnit::batches: return l.value;
    case LengthUnit::records: return (l.value + g - 1) / g;
    case LengthUnit::epochs: return l.value * steps_per_epoch;
  }
  return l.value;
}

const torch::optim::OptimizerParamGroup& group_of(const torch::optim::Optimizer& o, const torch::Tensor& p) {
  for (const auto& g : o.param_groups())
    for (const auto& q : g.params())
      if (q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return g;
  throw std::invalid_argument("update_rows: the parameter is not one of the optimizer's");
}

void sgd_rows(torch::optim::Optimizer& optimizer, const torch::optim::SGDOptions& o, const torch::Tensor& p,
              int64_t begin, int64_t rows) {
  const bool whole = p.dim() == 0 || (begin == 0 && rows == p.size(0));
  auto param = rows_of(p.data(), begin, rows);
  auto d_p = rows_of(p.grad().data(), begin, rows);
  if (o.weight_decay() != 0) d_p = d_p.add(param, o.weight_decay());
  if (o.momentum() != 0) {
    auto& state = optimizer.state();
    const auto found = state.find(state_key(p));
    const bool fresh = found == state.end();
    torch::Tensor buf;  // the whole parameter's
    if (fresh && whole) {
      buf = torch::clone(d_p).detach();
    } else {
      // SGD's first step copies the gradient; a zero buffer times momentum plus it is the same with dampening 0.
      if (fresh && o.dampening() != 0) throw std::logic_error("row-block SGD updates need dampening 0");
      buf = fresh ? torch::zeros_like(p.data())
                  : static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
      rows_of(buf, begin, rows).mul_(o.momentum()).add_(d_p, 1 - o.dampening());
    }
    if (fresh) {
      auto entry = std::make_unique<torch::optim::SGDParamState>();
      entry->momentum_buffer(buf);
      state[state_key(p)] = std::move(entry);
    }
    buf = rows_of(buf, begin, rows);
    d_p = o.nesterov() ? d_p.add(buf, o.momentum()) : buf;
  }
  param.add_(d_p, -1 * o.lr());
}

// Adam and AdamW share their moments; AdamW decays the weights directly instead of through the gradient.
template <class State, class Options>
void adam_rows(torch::optim::Optimizer& optimizer, const Options& o, bool decoupled, const torch::Tensor& p,
               int64_t begin, int64_t rows, int64_t step) {
  if (o.amsgrad()) throw std::logic_error("row-block Adam updates do not support amsgrad");
  auto param = rows_of(p.data(), begin, rows);
  auto grad = rows_of(p.grad().data(), begin, rows);
  if (decoupled && o.weight_decay() != 0) param.mul_(1 - o.lr() * o.weight_decay());
  auto& states = optimizer.state();
  auto found = states.find(state_key(p));
  if (found == states.end()) {
    auto entry = std::make_unique<State>();
    entry->step(0);
    entry->exp_avg(torch::zeros_like(p.data(), torch::MemoryFormat::Preserve));
    entry->exp_avg_sq(torch::zeros_like(p.data(), torch::MemoryFormat::Preserve));
    found = states.emplace(state_key(p), std::move(entry)).first;
  }
  auto& state = static_cast<State&>(*found->second);
  state.step(step);
  auto exp_avg = rows_of(state.exp_avg(), begin, rows);
  auto exp_avg_sq = rows_of(state.exp_avg_sq(), begin, rows);
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double bias_correction1 = 1 - std::pow(beta1, state.step());
  const double bias_correction2 = 1 - std::pow(beta2, state.step());
  if (!decoupled && o.weight_decay() != 0) grad = grad.add(param, o.weight_decay());
  exp_avg.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  auto denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
  param.addcdiv_(exp_avg, denom, -(o.lr() / bias_correction1));
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const ExperimentConfig& c,
                                                        const std::vector<torch::Tensor>& params) {
  if (c.optimizer == "adam")
    return std::make_unique<torch::optim::Adam>(
        params,
        torch::optim::AdamOptions(c.learning_rate).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  if (c.optimizer == "adamw")
    return std::make_unique<torch::optim::AdamW>(
        params,
        torch::optim::AdamWOptions(c.learning_rate).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(c.weight_decay));
  if (c.optimizer == "adadelta")
    return std::make_unique<Adadelta>(params, AdadeltaOptions(c.learning_rate).weight_decay(c.weight_decay));
  if (c.optimizer != "sgd")
    throw std::invalid_argument("hyperparameters.optimizer: unknown optimizer '" + c.optimizer + "'");
  return std::make_unique<torch::optim::SGD>(
      params,
      torch::optim::SGDOptions(c.learning_rate).momentum(c.momentum).nesterov(c.nesterov).weight_decay(c.weight_decay));
}

double learning_rate_at(const ExperimentConfig& c, int64_t step, int64_t total_steps, int64_t steps_per_epoch) {
  const auto& s = c.lr_schedule;
  const double lr = c.learning_rate;
  const int64_t warmup = length_in_steps(c, s.warmup, steps_per_epoch);
  if (warmup > 0 && step <= warmup) return lr * static_cast<double>(step) / static_cast<double>(warmup);
  const int64_t after = step - warmup;  // 1-based step after the warm-up
  if (s.type == "step") {
    const int64_t size = std::max<int64_t>(1, length_in_steps(c, s.step_size, steps_per_epoch));
    return lr * std::pow(s.gamma, static_cast<double>((after - 1) / size));
  }
  if (s.type == "cosine") {
    const int64_t span = total_steps - warmup;
    if (span <= 0) return s.min_learning_rate;
    const double progress = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
    return s.min_learning_rate + (lr - s.min_learning_rate) * 0.5 * (1 + std::cos(M_PI * progress));
  }
  return lr;
}

void set_learning_rate(torch::optim::Optimizer& o, double lr) {
  for (auto& g : o.param_groups()) g.options().set_lr(lr);
}

void update_rows(torch::optim::Optimizer& o, const torch::Tensor& p, int64_t begin, int64_t rows, int64_t step) {
  torch::NoGradGuard no_grad;
  const auto& options = group_of(o, p).options();
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    sgd_rows(o, *sgd, p, begin, rows);
  } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    adam_rows<torch::optim::AdamWParamState>(o, *adamw, true, p, begin, rows, step);
  } else if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    adam_rows<torch::optim::AdamParamState>(o, *adam, false, p, begin, rows, step);
  } else if (const auto* adadelta = dynamic_cast<const AdadeltaOptions*>(&options)) {
    adadelta_rows(o, *adadelta, p, begin, rows, step);
  } else {
    throw std::invalid_argument("update_rows: only SGD, Adam, AdamW and Adadelta are supported");
  }
}

}  // namespace tandem::trainer
