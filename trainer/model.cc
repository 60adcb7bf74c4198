#include "model.h"

#include <torch/script.h>

#include "row_blocks.h"

namespace tandem::trainer {

namespace nn = torch::nn;
namespace ag = torch::autograd;

namespace {
void pass(const ParameterGate& gate, const torch::Tensor& p, int part = 0) {
  if (gate && *gate) (*gate)(p, part);
}
// 2x2 max pooling, stride 2. Training keeps max_pool2d (its backward's
// tie rule is the anchor's); evaluation takes the max of the four strided
// views: the same values without max_pool2d's indices, about 2x faster on
// the convnet's channels-last activations.
torch::Tensor max_pool_2x2(const torch::Tensor& x, bool training) {
  if (training) return torch::max_pool2d(x, 2);
  const int64_t h = x.size(2) / 2 * 2, w = x.size(3) / 2 * 2;
  auto at = [&](int64_t dy, int64_t dx) { return x.slice(2, dy, h, 2).slice(3, dx, w, 2); };
  return torch::maximum(torch::maximum(at(0, 0), at(0, 1)), torch::maximum(at(1, 0), at(1, 1)));
}

// A whole layer's parameters through the gate.
template <class Layer>
Layer& gated(const ParameterGate& gate, Layer& layer) {
  for (const auto& p : layer->parameters()) pass(gate, p);
  return layer;
}

// A sliced layer's forward and backward (model.h). Backward adds the bias
// gradient, then each weight block's, into the parameters' .grad itself and
// reports each to the sink; autograd gets no gradient for them, so nothing
// is added twice.
struct BlockLinear : ag::Function<BlockLinear> {
  static torch::Tensor forward(ag::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const torch::Tensor& bias, SlicedLinearImpl* layer) {
    ctx->save_for_backward({x});
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);  // outlives the graph: the model owns it
    const auto& b = layer->bounds;
    const size_t blocks = b.size() - 1;
    pass(layer->gate, bias);
    std::vector<torch::Tensor> out(blocks);
    for (size_t k = blocks; k-- > 0;) {  // the last block first, as their reductions land
      pass(layer->gate, weight, int(k));
      out[k] = torch::addmm(bias.narrow(0, b[k], b[k + 1] - b[k]), x, weight.narrow(0, b[k], b[k + 1] - b[k]).t());
    }
    return torch::cat(out, 1);
  }

  static ag::variable_list backward(ag::AutogradContext* ctx, ag::variable_list grads) {
    auto* layer = reinterpret_cast<SlicedLinearImpl*>(ctx->saved_data["layer"].toInt());
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor g = grads[0].contiguous();
    torch::NoGradGuard no_grad;
    auto sink = [&](const torch::Tensor& p, int part) {
      if (layer->sink && *layer->sink) (*layer->sink)(p, part);
    };
    auto grad_of = [](torch::Tensor& p) -> torch::Tensor& {
      auto& grad = p.mutable_grad();
      if (!grad.defined()) grad = torch::zeros_like(p);
      return grad;
    };
    grad_of(layer->bias).add_(g.sum(0));
    sink(layer->bias, 0);
    torch::Tensor& gw = grad_of(layer->weight);
    const auto& b = layer->bounds;
    for (size_t k = 0; k + 1 < b.size(); ++k) {
      const int64_t rows = b[k + 1] - b[k];
      gw.narrow(0, b[k], rows).addmm_(g.narrow(1, b[k], rows).t(), x);
      sink(layer->weight, int(k));
    }
    torch::Tensor gx = ctx->needs_input_grad(0) ? g.mm(layer->weight) : torch::Tensor();
    return {gx, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

SlicedLinearImpl::SlicedLinearImpl(int64_t in, int64_t out, int slices, ParameterGate gate, GradientSink sink)
    : bounds(row_block_bounds(in, out, slices)), gate(std::move(gate)), sink(std::move(sink)) {
  nn::Linear whole(in, out);  // draws the initial values exactly as nn::Linear
  weight = register_parameter("weight", whole->weight.detach().clone());
  bias = register_parameter("bias", whole->bias.detach().clone());
}

std::vector<size_t> SlicedLinearImpl::weight_parts() const {
  std::vector<size_t> parts;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) parts.push_back(size_t((bounds[k + 1] - bounds[k]) * weight.size(1)));
  return parts;
}

torch::Tensor SlicedLinearImpl::forward(const torch::Tensor& x) {
  if (sliced()) return BlockLinear::apply(x, weight, bias, this);
  pass(gate, weight);
  pass(gate, bias);
  return torch::nn::functional::linear(x, weight, bias);
}

ConvNetImpl::ConvNetImpl(double dropout, int slices, ParameterGate gate, GradientSink sink) : gate(gate) {
  conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, 32, 5).padding(2)));
  conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 5).padding(2)));
  fc1 = register_module("fc1", SlicedLinear(7 * 7 * 64, 1024, slices, gate, sink));
  fc2 = register_module("fc2", nn::Linear(1024, 10));
  drop = register_module("drop", nn::Dropout(dropout));
  // Channels-last kernels take oneDNN's convolutions: a validation pass 1.34x
  // faster here, training 3% (DDP on both layouts, quiet VM); the same values
  // (a layout is not state: checkpoints and broadcasts see the same numbers).
  torch::NoGradGuard no_grad;
  for (auto* conv : {&conv1, &conv2})
    (*conv)->weight.set_data((*conv)->weight.data().contiguous(at::MemoryFormat::ChannelsLast));
}

torch::Tensor ConvNetImpl::forward(torch::Tensor x) {
  // Pooling before the ReLU: the same values and gradients (both are monotone;
  // ReLU's gradient is 0 wherever the window's max is <= 0), on a quarter of the elements.
  x = torch::relu(max_pool_2x2(gated(gate, conv1)(x), is_training()));
  x = torch::relu(max_pool_2x2(gated(gate, conv2)(x), is_training()));
  x = torch::relu(fc1(x.flatten(1)));
  return gated(gate, fc2)(drop(x));
}

MlpImpl::MlpImpl(int hidden, double dropout, int slices, ParameterGate gate, GradientSink sink) : gate(gate) {
  fc1 = register_module("fc1", SlicedLinear(28 * 28, hidden, slices, gate, sink));
  fc2 = register_module("fc2", SlicedLinear(hidden, hidden, slices, gate, sink));
  fc3 = register_module("fc3", nn::Linear(hidden, 10));
  drop = register_module("drop", nn::Dropout(dropout));
}

torch::Tensor MlpImpl::forward(torch::Tensor x) {
  x = torch::relu(fc1(x.flatten(1)));
  x = torch::relu(fc2(x));
  return gated(gate, fc3)(drop(x));
}

Model make_model(const std::string& name, int mlp_hidden, double dropout, int slices) {
  auto gate = std::make_shared<ParameterHook>();
  auto sink = std::make_shared<ParameterHook>();
  Model model;
  model.gate = gate, model.sink = sink;
  auto sunk = [&](const SlicedLinear& layer) {
    if (!layer->sliced()) return;
    model.sunk_parts[layer->weight.unsafeGetTensorImpl()] = layer->weight_parts();
    model.sunk_parts[layer->bias.unsafeGetTensorImpl()] = {size_t(layer->bias.numel())};
  };
  auto adopt = [&](auto m) {
    model.forward = [m](torch::Tensor x) mutable { return m->forward(x); };
    model.set_training = [m](bool on) mutable { m->train(on); };
    for (const auto& p : m->named_parameters()) model.parameters.emplace_back(p.key(), p.value());
  };
  if (name == "mlp") {
    Mlp m(mlp_hidden, dropout, slices, gate, sink);
    sunk(m->fc1), sunk(m->fc2);
    adopt(m);
  } else {
    ConvNet m(dropout, slices, gate, sink);
    sunk(m->fc1);
    adopt(m);
  }
  return model;
}

namespace {

// The module's attribute `name` set from a hyperparameter's text, in the attribute's own type.
void set_attribute(torch::jit::Module& module, const std::string& path, const std::string& name,
                   const std::string& text) {
  const c10::IValue current = module.attr(name);
  const std::string where = "entrypoint '" + path + "': hyperparameters." + name + " '" + text + "'";
  try {
    size_t used = 0;
    if (current.isBool() && (text == "true" || text == "false")) return module.setattr(name, text == "true");
    if (current.isInt() && (std::stoll(text, &used), used == text.size()))
      return module.setattr(name, static_cast<int64_t>(std::stoll(text)));
    if (current.isDouble() && (std::stod(text, &used), used == text.size()))
      return module.setattr(name, std::stod(text));
    if (current.isString()) return module.setattr(name, text);
  } catch (const std::exception&) {
  }
  throw std::runtime_error(where + " does not fit the module's attribute of type " + current.type()->str() +
                           "; give a value of that type (int, float, bool and str attributes are set)");
}

}  // namespace

Model load_torchscript(const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& hyperparameters) {
  auto module = std::make_shared<torch::jit::Module>();
  try {
    *module = torch::jit::load(path);
  } catch (const c10::Error& e) {
    throw std::runtime_error("entrypoint '" + path +
                             "' is not a TorchScript module (save one with "
                             "torch.jit.save(torch.jit.script(model), path)): " +
                             e.what_without_backtrace());
  }
  Model model;
  for (const auto& [name, text] : hyperparameters) {
    if (module->hasattr(name))
      set_attribute(*module, path, name, text);
    else
      model.unused_hyperparameters.push_back(name);
  }
  model.gated = false;
  model.gate = std::make_shared<ParameterHook>(), model.sink = std::make_shared<ParameterHook>();
  model.forward = [module](torch::Tensor x) { return module->forward({std::move(x)}).toTensor(); };
  model.set_training = [module](bool on) { module->train(on); };
  for (const auto& p : module->named_parameters(/*recurse=*/true)) {
    if (p.value.scalar_type() != torch::kFloat32)
      throw std::runtime_error("entrypoint '" + path + "': parameter '" + p.name + "' is " +
                               std::string(c10::toString(p.value.scalar_type())) +
                               "; tandem trains float32 parameters");
    model.parameters.emplace_back(p.name, p.value);
  }
  if (model.parameters.empty())
    throw std::runtime_error("entrypoint '" + path + "': the module has no parameters to train");
  if (module->hasattr("optimizer") && module->attr("optimizer").isString())
    model.optimizer = module->attr("optimizer").toStringRef();
  return model;
}

}  // namespace tandem::trainer
