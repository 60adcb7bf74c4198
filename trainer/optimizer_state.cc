// The optimizer's state in PyTorch's optimizer.state_dict() layout, and back:
// what a checkpoint holds of SGD, Adam, AdamW and Adadelta.
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include <filesystem>

#include "adadelta.h"
#include "checkpoint.h"

namespace tandem::trainer {
namespace {

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// PyTorch's layout: param_groups' parameters numbered in order, state by number.
std::vector<at::Tensor> flat_params(const torch::optim::Optimizer& o) {
  std::vector<at::Tensor> out;
  for (const auto& g : o.param_groups())
    for (const auto& p : g.params()) out.push_back(p);
  return out;
}

std::string kind_of(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "sgd";
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "adam";
  if (dynamic_cast<const Adadelta*>(&o)) return "adadelta";
  throw std::invalid_argument("checkpoints hold SGD, Adam, AdamW or Adadelta state only");
}

c10::IValue group_options(const torch::optim::OptimizerOptions& options) {
  auto g = string_dict();
  g.insert("lr", options.get_lr());
  if (const auto* o = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    g.insert("momentum", o->momentum()), g.insert("dampening", o->dampening());
    g.insert("weight_decay", o->weight_decay()), g.insert("nesterov", o->nesterov());
  }
  auto adam_like = [&](const auto& o) {
    g.insert("betas", c10::List<double>({std::get<0>(o.betas()), std::get<1>(o.betas())}));
    g.insert("eps", o.eps()), g.insert("weight_decay", o.weight_decay()), g.insert("amsgrad", o.amsgrad());
  };
  if (const auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) adam_like(*o);
  if (const auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) adam_like(*o);
  if (const auto* o = dynamic_cast<const AdadeltaOptions*>(&options)) {
    g.insert("rho", o->rho()), g.insert("eps", o->eps()), g.insert("weight_decay", o->weight_decay());
  }
  return g;
}

c10::IValue param_state(const torch::optim::OptimizerParamState& state) {
  auto s = string_dict();
  auto copy = [](const at::Tensor& t) { return t.detach().clone(); };
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(&state)) {
    if (sgd->momentum_buffer().defined()) s.insert("momentum_buffer", copy(sgd->momentum_buffer()));
  }
  auto adam_like = [&](const auto& a) {
    s.insert("step", a.step());
    s.insert("exp_avg", copy(a.exp_avg())), s.insert("exp_avg_sq", copy(a.exp_avg_sq()));
    if (a.max_exp_avg_sq().defined()) s.insert("max_exp_avg_sq", copy(a.max_exp_avg_sq()));
  };
  if (const auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&state)) adam_like(*a);
  if (const auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) adam_like(*a);
  if (const auto* a = dynamic_cast<const AdadeltaParamState*>(&state)) {
    s.insert("step", a->step());
    s.insert("square_avg", copy(a->square_avg())), s.insert("acc_delta", copy(a->acc_delta()));
  }
  return s;
}

}  // namespace

c10::IValue optimizer_state(const torch::optim::Optimizer& o) {
  const auto params = flat_params(o);
  c10::impl::GenericDict state(c10::IntType::get(), c10::AnyType::get());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto found = o.state().find(c10::guts::to_string(params[i].unsafeGetTensorImpl()));
    if (found != o.state().end()) state.insert(static_cast<int64_t>(i), param_state(*found->second));
  }
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& g : o.param_groups()) {
    auto options = group_options(g.options()).toGenericDict();
    c10::List<int64_t> numbers;
    for (size_t k = 0; k < g.params().size(); ++k) numbers.push_back(index++);
    options.insert("params", numbers);
    groups.push_back(options);
  }
  auto out = string_dict();
  out.insert("kind", kind_of(o));
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void restore_optimizer(const LoadedCheckpoint& c, torch::optim::Optimizer& o) {
  const std::string name = std::filesystem::path(c.path).filename().string();
  if (c.optimizer.isNone()) throw CorruptCheckpoint(name + ": holds no optimizer state");
  const auto root = c.optimizer.toGenericDict();
  const std::string kind = root.at("kind").toStringRef();
  if (kind != kind_of(o))
    throw CorruptCheckpoint(name + ": holds " + kind + " state but the optimizer is " + kind_of(o) +
                            "; set hyperparameters.optimizer: " + kind + " or train afresh without --resume");
  const auto params = flat_params(o);
  auto& states = o.state();
  for (const auto& kv : root.at("state").toGenericDict()) {
    const int64_t index = kv.key().toInt();
    if (index < 0 || index >= static_cast<int64_t>(params.size()))
      throw CorruptCheckpoint(name + ": optimizer state for parameter " + std::to_string(index) + " of " +
                              std::to_string(params.size()));
    const auto& p = params[static_cast<size_t>(index)];
    const auto saved = kv.value().toGenericDict();
    auto tensor = [&](const std::string& key) {
      at::Tensor t = saved.at(key).toTensor();
      if (t.sizes() != p.sizes())
        throw CorruptCheckpoint(name + ": optimizer state '" + key + "' of parameter " + std::to_string(index) +
                                " has another shape than the parameter (a different model?)");
      return t.clone();
    };
    std::unique_ptr<torch::optim::OptimizerParamState> state;
    auto adam_like = [&](auto entry) {
      entry->step(saved.at("step").toInt());
      entry->exp_avg(tensor("exp_avg"));
      entry->exp_avg_sq(tensor("exp_avg_sq"));
      if (saved.contains("max_exp_avg_sq")) entry->max_exp_avg_sq(tensor("max_exp_avg_sq"));
      state = std::move(entry);
    };
    if (kind == "sgd") {
      auto entry = std::make_unique<torch::optim::SGDParamState>();
      if (saved.contains("momentum_buffer")) entry->momentum_buffer(tensor("momentum_buffer"));
      state = std::move(entry);
    } else if (kind == "adadelta") {
      auto entry = std::make_unique<AdadeltaParamState>();
      entry->step(saved.at("step").toInt());
      entry->square_avg(tensor("square_avg")), entry->acc_delta(tensor("acc_delta"));
      state = std::move(entry);
    } else if (kind == "adam") {
      adam_like(std::make_unique<torch::optim::AdamParamState>());
    } else {
      adam_like(std::make_unique<torch::optim::AdamWParamState>());
    }
    states[c10::guts::to_string(p.unsafeGetTensorImpl())] = std::move(state);
  }
  const auto groups = root.at("param_groups").toList();
  for (size_t i = 0; i < groups.size() && i < o.param_groups().size(); ++i)
    o.param_groups()[i].options().set_lr(groups.get(i).toGenericDict().at("lr").toDouble());
}

}  // namespace tandem::trainer
