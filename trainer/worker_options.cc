// Saving and loading a slot's options (see worker_options.h).
#include "worker_options.h"

#include <fstream>
#include <stdexcept>

#include "config.h"

namespace tandem::trainer {

void save_worker_options(const WorkerOptions& options, const std::string& path) {
  std::ofstream out(path, std::ios::trunc);
  out << nlohmann::json(options).dump(2) << '\n';
  out.close();
  if (!out) throw std::runtime_error("cannot write the worker options to " + path);
}

WorkerOptions load_worker_options(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read the worker options " + path);
  try {
    return nlohmann::json::parse(in).get<WorkerOptions>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError("the worker options " + path + " are invalid: " + e.what());
  }
}

}  // namespace tandem::trainer
