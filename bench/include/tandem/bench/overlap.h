// `tandem bench overlap`: how much gradient communication the gradient-sync
// engine hides behind a backward pass. A synthetic model (a list of gradient
// sizes) runs a backward pass of real CPU work per layer, producing gradients
// last layer first, in several modes:
//   none          reduce after backward (same buckets, no overlap)
//   overlap       buckets launched as backward produces them, fixed settings
//   autotune      overlap, settings tuned online from autotune_start
//   per-gradient  overlap, one all-reduce per gradient (no fusion)
//   grid          overlap at every point of a coarse grid of settings (the autotuner's reference)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tandem/fusion/gradient_sync.h"

namespace tandem::bench {

struct OverlapOptions {
  std::string model = "resnet50";  // resnet50, vgg16, uniform:COUNT:MIN:MAX (bytes), or a file of sizes
  double scale = 1.0;              // multiplies every gradient's size
  double compute_ms = -1;          // backward compute per step; < 0: as long as the no-overlap communication
  int steps = 20;
  int warmup = 3;
  std::vector<std::string> modes = {"none", "overlap", "autotune"};
  fusion::FusionSettings fixed;                                       // overlap, none, per-gradient
  fusion::FusionSettings autotune_start{1 << 20, 4 << 20, 64 << 10};  // deliberately poor
  int steps_per_sample = 2;
  int autotune_samples = 16;
  int grid_steps = 2;  // steps per grid point
  std::string compress =
      "none";                    // fp16 or bf16 on the wire for every mode; a list (none,fp16) runs each (compression/)
  std::string format = "table";  // table or json
  std::string plot;              // PNG: step time split into compute and exposed communication
  std::string timeline;          // Chrome trace of the overlap mode (rank 0)
  std::string autotune_log;      // JSON lines of the autotuner's trials
};

struct GradientSpec {
  std::string name;
  size_t count = 0;  // f32 elements
};

// The gradients of a model, in registration (forward) order; throws
// InvalidArgument naming what is wrong with a spec or file.
std::vector<GradientSpec> model_gradients(const std::string& model, double scale);

// Runs as one rank of a job (environment from bootstrap.h); rank 0 prints.
int run_overlap(const OverlapOptions& options);

}  // namespace tandem::bench
