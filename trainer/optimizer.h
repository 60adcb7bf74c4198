// The trainer's optimizer: LibTorch's SGD, Adam or AdamW, or tandem's
// Adadelta (adadelta.h), as the experiment configuration says, its learning-rate schedule, and the update of one row
// block of a parameter in the optimizer's own arithmetic and state.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "config.h"

namespace tandem::trainer {

// LibTorch's own optimizer (torch::optim::SGD / Adam / AdamW) or Adadelta over `params`, as the config says.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const ExperimentConfig& c,
                                                        const std::vector<torch::Tensor>& params);

// The learning rate of optimizer step `step` (1-based) of `total_steps`, `steps_per_epoch` steps an
// epoch: a linear warm-up (lr * step / warmup_steps), then constant | step decay (times gamma every
// step_size steps after the warm-up) | cosine from lr at the warm-up's end to min_learning_rate at total_steps.
double learning_rate_at(const ExperimentConfig& c, int64_t step, int64_t total_steps, int64_t steps_per_epoch);

// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& o, double lr);

// The update of rows [begin, begin + rows) of parameter p (its .grad holds the reduced gradient), in
// the optimizer's own arithmetic and on its own state, so updating a parameter block by block equals
// optimizer.step() bitwise. `step` is the 1-based optimizer step (Adam's bias correction; the state's
// step is set to it). A state first made for part of a parameter starts at zero for the whole of it;
// a 0-dim parameter is one row.
void update_rows(torch::optim::Optimizer& o, const torch::Tensor& p, int64_t begin, int64_t rows, int64_t step);

}  // namespace tandem::trainer
