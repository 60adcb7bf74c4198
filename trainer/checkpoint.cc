// Checkpoints as LibTorch archives with a checksummed sidecar, written on a
// background thread (checkpoint.h). Terms: a checkpoint is complete when its
// .pt file and its .json sidecar both exist and the file's size (and, on
// loading, its CRC-32) match the sidecar; anything else in the directory named
// like a checkpoint is incomplete.
#include "checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <torch/serialize.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;
using Seconds = std::chrono::duration<double>;
using SteadyClock = std::chrono::steady_clock;

[[noreturn]] void sys_fail(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " '" + path + "': " + std::strerror(errno));
}

uint32_t crc32_of(const char* data, size_t size) {
  uLong crc = crc32(0, nullptr, 0);
  for (size_t done = 0; done < size;) {
    const auto n = static_cast<uInt>(std::min<size_t>(size - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Writes `data` to `<path>.tmp`, fsyncs it and renames it to `path`. With kill_after_bytes >= 0 the
// process kills itself once that many bytes are written (a worker dying mid-write).
void write_atomically(const std::string& path, const char* data, size_t size, int64_t kill_after_bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) sys_fail("cannot create checkpoint file", tmp);
  const size_t end = kill_after_bytes >= 0 ? std::min(size, static_cast<size_t>(kill_after_bytes)) : size;
  size_t done = 0;
  while (done < end) {
    const ssize_t n = ::write(fd, data + done, std::min<size_t>(end - done, 1 << 20));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      errno = e;
      sys_fail("cannot write checkpoint file", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (kill_after_bytes >= 0) ::raise(SIGKILL);  // before the fsync and the rename
  if (::fsync(fd) != 0) {
    ::close(fd);
    sys_fail("cannot fsync checkpoint file", tmp);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) sys_fail("cannot rename checkpoint file to", path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CorruptCheckpoint("cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Checkpoint files of a directory by batch: the .pt, its sidecar and leftovers.
struct Listed {
  int64_t batch = 0;
  std::string pt, sidecar;
  std::vector<std::string> leftovers;  // *.tmp of a write that never finished
};

std::optional<int64_t> batch_of(const std::string& name, const std::string& suffix) {
  if (name.size() != 5 + 12 + suffix.size() || !name.starts_with("ckpt-") || !name.ends_with(suffix))
    return std::nullopt;
  const std::string digits = name.substr(5, 12);
  if (!std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

std::vector<Listed> list_dir(const std::string& dir) {
  std::map<int64_t, Listed> by_batch;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string(), path = e.path().string();
    for (const char* suffix : {".pt", ".json", ".pt.tmp", ".json.tmp"}) {
      const auto batch = batch_of(name, suffix);
      if (!batch) continue;
      Listed& l = by_batch[*batch];
      l.batch = *batch;
      const std::string s = suffix;
      if (s == ".pt")
        l.pt = path;
      else if (s == ".json")
        l.sidecar = path;
      else
        l.leftovers.push_back(path);
    }
  }
  std::vector<Listed> out;
  for (auto& [batch, l] : by_batch) out.push_back(std::move(l));
  std::reverse(out.begin(), out.end());  // newest first
  return out;
}

// The sidecar of a listed checkpoint, when it and the file's size agree (the cheap check; loading also checks the
// CRC-32).
std::optional<nlohmann::json> complete_sidecar(const Listed& l, std::string* why) {
  if (l.pt.empty()) return std::nullopt;
  const std::string name = fs::path(l.pt).filename().string();
  if (l.sidecar.empty()) {
    if (why)
      *why = name + " skipped: no sidecar " + fs::path(l.pt).stem().string() + ".json (the write never finished)";
    return std::nullopt;
  }
  nlohmann::json side;
  try {
    side = nlohmann::json::parse(read_file(l.sidecar));
    (void)side.at("bytes").get<uint64_t>(), (void)side.at("crc32").get<uint32_t>();
  } catch (const std::exception& e) {
    if (why) *why = name + " skipped: its sidecar is unreadable (" + e.what() + ")";
    return std::nullopt;
  }
  std::error_code ec;
  const auto size = fs::file_size(l.pt, ec);
  if (ec || size != side["bytes"].get<uint64_t>()) {
    if (why)
      *why = name + " skipped: torn, " + std::to_string(ec ? 0 : size) + " bytes where its sidecar says " +
             std::to_string(side["bytes"].get<uint64_t>());
    return std::nullopt;
  }
  return side;
}

std::optional<double> metric_of(const nlohmann::json& side) {
  if (!side.contains("metric") || !side["metric"].is_number()) return std::nullopt;
  return side["metric"].get<double>();
}

c10::impl::GenericDict string_dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

std::vector<char> serialise(const CheckpointSnapshot& s) {
  c10::Dict<std::string, at::Tensor> model;
  for (const auto& [name, t] : s.model) model.insert(name, t);
  auto root = string_dict();
  root.insert("model", model);
  root.insert("optimizer", s.optimizer);
  root.insert("meta", s.meta.dump());
  return torch::pickle_save(root);
}

// Reads and checks a .pt against its sidecar; throws CorruptCheckpoint naming the file and the check.
LoadedCheckpoint load_pt(const Listed& l) {
  std::string why;
  const auto side = complete_sidecar(l, &why);
  if (!side) throw CorruptCheckpoint(why);
  const std::string name = fs::path(l.pt).filename().string();
  const std::string bytes = read_file(l.pt);
  if (crc32_of(bytes.data(), bytes.size()) != (*side)["crc32"].get<uint32_t>())
    throw CorruptCheckpoint(name + " skipped: CRC-32 mismatch with its sidecar (torn or overwritten)");
  LoadedCheckpoint c;
  c.batch = l.batch, c.path = l.pt, c.metric = metric_of(*side);
  try {
    const auto root = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end())).toGenericDict();
    for (const auto& kv : root.at("model").toGenericDict()) c.model[kv.key().toStringRef()] = kv.value().toTensor();
    c.optimizer = root.at("optimizer");
    c.meta = nlohmann::json::parse(root.at("meta").toStringRef());
  } catch (const std::exception& e) {
    throw CorruptCheckpoint(name + " skipped: not a tandem checkpoint archive (" + e.what() + ")");
  }
  return c;
}

void remove_files(const Listed& l) {
  std::error_code ec;
  for (const auto& f : {l.pt, l.sidecar})
    if (!f.empty()) fs::remove(f, ec);
  for (const auto& f : l.leftovers) fs::remove(f, ec);
}

// Keeps the newest `latest` (at least one) and the `best` best complete checkpoints; removes the
// rest and every incomplete one.
void prune(const std::string& dir, const KeepPolicy& keep) {
  struct Complete {
    const Listed* listed;
    std::optional<double> metric;
  };
  const auto listed = list_dir(dir);
  std::vector<Complete> complete;
  for (const auto& l : listed) {
    if (const auto side = complete_sidecar(l, nullptr))
      complete.push_back({&l, metric_of(*side)});
    else if (!l.pt.empty() || !l.sidecar.empty() || !l.leftovers.empty())
      remove_files(l);
  }
  std::vector<char> kept(complete.size(), 0);
  for (size_t i = 0; i < complete.size() && i < static_cast<size_t>(std::max(1, keep.latest)); ++i) kept[i] = 1;
  std::vector<size_t> ranked;
  for (size_t i = 0; i < complete.size(); ++i)
    if (complete[i].metric) ranked.push_back(i);
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t a, size_t b) {
    return keep.smaller_is_better ? *complete[a].metric < *complete[b].metric
                                  : *complete[a].metric > *complete[b].metric;
  });
  for (size_t i = 0; i < ranked.size() && i < static_cast<size_t>(std::max(0, keep.best)); ++i) kept[ranked[i]] = 1;
  for (size_t i = 0; i < complete.size(); ++i)
    if (!kept[i]) remove_files(*complete[i].listed);
}

}  // namespace

KeepPolicy keep_policy(const ExperimentConfig& c) {
  return KeepPolicy{c.save_trial_latest, c.save_trial_best, c.smaller_is_better};
}

std::string checkpoint_file(const std::string& dir, int64_t batch) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt-%012lld.pt", static_cast<long long>(batch));
  return (fs::path(dir) / name).string();
}

CheckpointSnapshot take_snapshot(int64_t batch, const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& params, const torch::optim::Optimizer& o,
                                 nlohmann::json meta, std::optional<double> metric) {
  if (names.size() != params.size()) throw std::invalid_argument("take_snapshot: one name per parameter");
  CheckpointSnapshot s;
  s.batch = batch;
  for (size_t i = 0; i < params.size(); ++i) s.model.emplace_back(names[i], params[i].detach().clone());
  s.optimizer = optimizer_state(o);
  s.meta = std::move(meta);
  s.metric = metric;
  return s;
}

CheckpointWriter::CheckpointWriter(std::string dir, KeepPolicy keep, int64_t kill_after_bytes)
    : dir_(std::move(dir)), keep_(keep), kill_after_bytes_(kill_after_bytes), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    drain();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem train: warning: checkpoint not written: %s\n", e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointWriter::wait_idle(std::unique_lock<std::mutex>& lock) {
  const auto start = SteadyClock::now();
  cv_.wait(lock, [&] { return !busy_; });
  wait_seconds_ += Seconds(SteadyClock::now() - start).count();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CheckpointWriter::submit(CheckpointSnapshot s) {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
  pending_ = std::move(s);
  busy_ = true;
  lock.unlock();
  cv_.notify_all();
}

void CheckpointWriter::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  wait_idle(lock);
}

double CheckpointWriter::wait_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return wait_seconds_;
}
double CheckpointWriter::write_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return write_seconds_;
}
int64_t CheckpointWriter::written() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return written_;
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || pending_.has_value(); });
    if (!pending_) return;
    CheckpointSnapshot s = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    const auto start = SteadyClock::now();
    std::exception_ptr error;
    try {
      write(s);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    write_seconds_ += Seconds(SteadyClock::now() - start).count();
    if (error)
      error_ = error;
    else
      ++written_;
    busy_ = false;
    cv_.notify_all();
  }
}

void CheckpointWriter::write(const CheckpointSnapshot& s) {
  fs::create_directories(dir_);
  const std::string path = checkpoint_file(dir_, s.batch);
  const std::vector<char> bytes = serialise(s);
  write_atomically(path, bytes.data(), bytes.size(), kill_after_bytes_);
  nlohmann::json side = {{"file", fs::path(path).filename().string()},
                         {"bytes", bytes.size()},
                         {"crc32", crc32_of(bytes.data(), bytes.size())},
                         {"batch", s.batch},
                         {"metrics", s.meta.contains("metrics") ? s.meta["metrics"] : nlohmann::json::object()},
                         {"metric", s.metric ? nlohmann::json(*s.metric) : nlohmann::json(nullptr)}};
  const std::string text = side.dump(1) + "\n";
  const std::string side_path = (fs::path(dir_) / fs::path(path).stem()).string() + ".json";
  write_atomically(side_path, text.data(), text.size(), -1);
  fsync_dir(dir_);
  prune(dir_, keep_);
}

std::optional<LoadedCheckpoint> latest_checkpoint(const std::string& dir, std::vector<std::string>* warnings) {
  for (const auto& l : list_dir(dir)) {
    if (l.pt.empty()) continue;
    try {
      return load_pt(l);
    } catch (const CorruptCheckpoint& e) {
      if (warnings) warnings->push_back(e.what());
    }
  }
  return std::nullopt;
}

std::optional<std::string> best_checkpoint(const std::string& dir, const KeepPolicy& keep) {
  std::optional<std::string> best;
  std::optional<double> best_metric;
  for (const auto& l : list_dir(dir)) {  // newest first: ties go to the newest
    const auto side = complete_sidecar(l, nullptr);
    const auto m = side ? metric_of(*side) : std::nullopt;
    if (!m) continue;
    if (!best_metric || (keep.smaller_is_better ? *m < *best_metric : *m > *best_metric)) best_metric = m, best = l.pt;
  }
  return best;
}

}  // namespace tandem::trainer
