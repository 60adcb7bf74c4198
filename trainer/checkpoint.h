// Checkpoint files: `ckpt-<batch>.pt`, a LibTorch archive that Python's
// torch.load reads ({"model": {name: tensor}, "optimizer": its state,
// "meta": a JSON string}), and beside it `ckpt-<batch>.json`, the sidecar
// holding the file's size, CRC-32, batch and validation metrics.
//
// A checkpoint is written atomically: each file to `<name>.tmp`, fsync'd,
// renamed over its final name; the directory is fsync'd last. It counts only
// when its sidecar exists and the file's size and CRC-32 match it; anything
// else (torn by a crash, no sidecar, overwritten) is skipped with a warning
// naming the file and the check, and removed at the next prune.
//
// The chief takes a CheckpointSnapshot (copies of the tensors, no
// serialisation) and a CheckpointWriter serialises and writes it on its own
// thread, off the training loop's critical path.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config.h"

namespace torch::optim {
class Optimizer;
}

namespace tandem::trainer {

struct CorruptCheckpoint : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// In-memory copies: training may go on while the snapshot is written.
struct CheckpointSnapshot {
  int64_t batch = 0;
  std::vector<std::pair<std::string, at::Tensor>> model;  // cloned parameters, by module name
  // {"kind": sgd|adam|adamw|adadelta, "state": {index: {name: tensor or step}}, "param_groups": [{options, "params"}]},
  // PyTorch's optimizer.state_dict() layout, of cloned tensors.
  c10::IValue optimizer;
  nlohmann::json meta;           // batch, epoch, time, seed, ...; its "metrics" object is copied to the sidecar
  std::optional<double> metric;  // the searcher metric validated at this batch, if any
};

// The optimizer's state as CheckpointSnapshot::optimizer holds it (optimizer_state.cc).
c10::IValue optimizer_state(const torch::optim::Optimizer& o);

CheckpointSnapshot take_snapshot(int64_t batch, const std::vector<std::string>& names,
                                 const std::vector<at::Tensor>& params, const torch::optim::Optimizer& o,
                                 nlohmann::json meta, std::optional<double> metric);

// Which complete checkpoints a prune keeps: the `latest` newest and the `best` best by the searcher
// metric (Determined's save_trial_latest and save_trial_best). The newest is always kept.
struct KeepPolicy {
  int latest = 1;
  int best = 1;
  bool smaller_is_better = false;
};
// checkpoint_storage.save_trial_latest and save_trial_best, ranked in searcher.smaller_is_better's direction.
KeepPolicy keep_policy(const ExperimentConfig& c);

// One background thread: serialises, writes, fsyncs, renames, then prunes to
// the KeepPolicy. Never two writes in flight: submit() first waits for the
// previous one. A failed write's error is raised by the next submit() or drain().
class CheckpointWriter {
 public:
  // kill_after_bytes >= 0 (a test's fault injection): the process raises SIGKILL on itself after
  // writing that many bytes of a temporary file, as a worker dying mid-write.
  CheckpointWriter(std::string dir, KeepPolicy keep, int64_t kill_after_bytes = -1);
  ~CheckpointWriter();  // drains; a pending error is reported on stderr
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void submit(CheckpointSnapshot s);
  void drain();  // waits for the write in flight

  double wait_seconds() const;   // the submitting thread's waits in submit() and drain()
  double write_seconds() const;  // the writer thread's serialising, writing and pruning
  int64_t written() const;       // checkpoints completed

 private:
  void run();
  void write(const CheckpointSnapshot& s);
  void wait_idle(std::unique_lock<std::mutex>& lock);

  const std::string dir_;
  const KeepPolicy keep_;
  const int64_t kill_after_bytes_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<CheckpointSnapshot> pending_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  double wait_seconds_ = 0, write_seconds_ = 0;
  int64_t written_ = 0;
  std::thread thread_;
};

struct LoadedCheckpoint {
  int64_t batch = 0;
  std::string path;
  nlohmann::json meta;
  std::map<std::string, at::Tensor> model;
  c10::IValue optimizer;  // as in CheckpointSnapshot; restore_optimizer() puts it back
  std::optional<double> metric;
};

// The newest complete checkpoint of `dir` (a .pt with a matching sidecar that reads back intact);
// skipped ones add a warning each naming the file and the failed check.
std::optional<LoadedCheckpoint> latest_checkpoint(const std::string& dir, std::vector<std::string>* warnings = nullptr);
// Puts the checkpoint's optimizer state (and learning rate) into `o`, whose parameters are the
// saved ones in the same order. Throws CorruptCheckpoint when the kinds or shapes disagree.
void restore_optimizer(const LoadedCheckpoint& c, torch::optim::Optimizer& o);
// The complete checkpoint with the best sidecar metric, by the policy's direction.
std::optional<std::string> best_checkpoint(const std::string& dir, const KeepPolicy& keep);
std::string checkpoint_file(const std::string& dir, int64_t batch);  // <dir>/ckpt-<batch, 12 digits>.pt

}  // namespace tandem::trainer
