#include "entrypoint.h"

#include <filesystem>
#include <sstream>

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;

const std::string kHowToExport =
    "tandem trains TorchScript models: save one with torch.jit.save(torch.jit.script(model), \"model.pt\") and set "
    "entrypoint: model.pt";

fs::path resolve(const std::string& file, const ConfigReader& r) {
  fs::path path(file);
  if (path.is_relative()) path = fs::absolute(r.base_dir.empty() ? fs::current_path() : fs::path(r.base_dir)) / path;
  return path.lexically_normal();
}

std::vector<std::string> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// A Python interpreter or script: Determined's `python3 train.py`, or its launcher `python3 -m determined.launch...`.
bool runs_python(const std::vector<std::string>& words) {
  for (const std::string& w : words) {
    const std::string base = fs::path(w).filename().string();
    if (base.rfind("python", 0) == 0 || (base.size() > 3 && base.compare(base.size() - 3, 3, ".py") == 0)) return true;
  }
  return false;
}

// The training script's own length arguments: --epochs N or --batches N (also --epochs=N).
void read_length_arguments(const std::vector<std::string>& args, const std::string& entry, ConfigReader& r,
                           Length& length) {
  const std::string usage =
      "the line is the TorchScript file, then --epochs N or --batches N (the training length, "
      "as a Determined 0.38 training script takes it)";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string given = args[i];
    std::string flag = given, value;
    if (const size_t eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1), flag = flag.substr(0, eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    }
    if (flag != "--epochs" && flag != "--batches")
      return r.error("entrypoint", "'" + entry + "': '" + given + "' is not an argument tandem reads; " + usage);
    if (length.set())
      return r.error("entrypoint", "'" + entry + "' gives the length twice; keep one of --epochs and --batches");
    const std::string unit = flag.substr(2);
    size_t used = 0;
    long long n = 0;
    try {
      n = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != value.size() || n < 1)
      return r.error("entrypoint", "'" + entry + "': " + flag + " '" + value + "' is not a count of " + unit +
                                       "; use a positive number, e.g. " + flag + " 1");
    length.unit = unit == "epochs" ? LengthUnit::epochs : LengthUnit::batches;
    length.value = n;
  }
}

}  // namespace

void read_entrypoint(const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
  std::string entry;
  if (!r.text(n, "entrypoint", entry, "a TorchScript file (e.g. model.pt --epochs 1)")) return;
  // The whole line as one path first, so a file name with spaces needs no quoting.
  if (const fs::path whole = resolve(entry, r); fs::is_regular_file(whole)) {
    c.entrypoint = whole.string();
    return;
  }
  const std::vector<std::string> words = words_of(entry);
  if (words.empty()) return r.error("entrypoint", "empty; " + kHowToExport);
  if (runs_python(words))
    return r.error("entrypoint",
                   "'" + entry +
                       "' runs a Python training script, which tandem does not: export the script's model to "
                       "TorchScript (torch.jit.save(torch.jit.script(model), \"model.pt\"); "
                       "trainer/examples/mnist_tutorial_model.py does it for Determined's mnist_pytorch tutorial) "
                       "and set entrypoint: model.pt --epochs 1, keeping the script's --epochs or --batches");
  Length length;
  read_length_arguments({words.begin() + 1, words.end()}, entry, r, length);
  if (length.set() && c.max_length.set())
    r.error("entrypoint", "'" + entry + "' and searcher.max_length both give the training length; keep one of them");
  else if (length.set())
    c.max_length = length;
  const fs::path path = resolve(words[0], r);
  if (fs::is_regular_file(path)) {
    c.entrypoint = path.string();
  } else if (words[0].find(':') != std::string::npos) {
    r.error("entrypoint", "'" + words[0] + "' is Determined's module:TrialClass form; " + kHowToExport);
  } else {
    r.error("entrypoint", "'" + words[0] + "': no file at " + path.string() +
                              " (a relative path is taken from the YAML's directory); " + kHowToExport);
  }
}

}  // namespace tandem::trainer
