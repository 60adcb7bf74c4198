// The entrypoint line: a TorchScript file, relative to the YAML's directory,
// then the training length as a Determined 0.38 training script takes it
// (`model.pt --epochs 1`, or `--batches N`), since 0.38 moved the length from
// searcher.max_length into the script's arguments.
#pragma once

#include <yaml-cpp/yaml.h>

#include "config.h"
#include "config_reader.h"

namespace tandem::trainer {

// Sets entrypoint (the file's absolute path) and, from --epochs or --batches,
// max_length (an error when searcher.max_length gives it too). A Python
// script or launcher is refused with how to export the model instead.
void read_entrypoint(const YAML::Node& n, ConfigReader& r, ExperimentConfig& c);

}  // namespace tandem::trainer
