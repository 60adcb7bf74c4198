// Gradient sync over two routes in one step: gradients chosen by name (or by
// a rule on name and shape) go to the parameter server, the rest to the
// all-reduce buckets of a fusion::GradientSync. This is where the two meet
// (trainer/ composes fusion/ and paramserver/, which never include each other).
//
// Terms: a routed gradient is one sent to the parameter server as a key of
// the same name (rows x cols f32, the sum rule). At mark_ready it is pushed at
// once (from the hook's thread; the transfer runs on the world communicator's
// engine while backward continues): all rows, or with sparse_rows only the
// rows holding a non-zero element (an embedding's gradient touches the rows
// of the batch). wait() waits for the buckets, then pulls every routed
// gradient's sum (with sparse_rows only the rows some worker pushed, by
// Client::pull_touched) and divides by the workers if averaging, so every
// gradient leaves wait() reduced in place, as with GradientSync alone. With
// sparse_rows a routed gradient must be all zeros outside the rows this
// worker wrote (zero_gradients() after each step, as usual).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/fusion/gradient_sync.h"
#include "tandem/paramserver.h"

namespace tandem::trainer {

struct RoutedSyncOptions {
  fusion::GradientSyncOptions sync;  // for the all-reduce route (sync.average applies to both)
  ps::Options ps;
  std::vector<std::string> ps_names;                                               // route these by name
  std::function<bool(const std::string& name, size_t rows, size_t cols)> ps_rule;  // or when this says so
  bool sparse_rows = true;
};

class RoutedSync {
 public:
  // `workers`: the workers' own communicator (all-reduce route); `world`:
  // workers and servers (parameter-server route). Both outlive the sync.
  RoutedSync(Communicator& workers, Communicator& world, RoutedSyncOptions options);
  ~RoutedSync();

  int register_gradient(const std::string& name, size_t rows, size_t cols = 1);  // f32
  void finalize(Deadline deadline);
  float* data(int id) const;
  bool routed(int id) const { return entries_.at(size_t(id)).routed; }
  // Routed gradients: throws InvalidArgument when marked twice in a step.
  void mark_ready(int id);
  void wait(Deadline deadline);
  void zero_gradients();
  fusion::GradientSync& sync() { return sync_; }
  ps::Client& client() { return *client_; }

 private:
  struct Entry {
    std::string name;
    size_t rows = 0, cols = 0;
    bool routed = false;
    bool marked = false;       // this step
    int sync_id = -1;          // in the GradientSync
    std::vector<float> data;   // routed only
    std::vector<int64_t> ids;  // rows pushed this step (sparse_rows)
    std::vector<float> rows_buffer;
    Request push;
  };

  Communicator& world_;
  RoutedSyncOptions options_;
  fusion::GradientSync sync_;
  std::vector<Entry> entries_;
  std::unique_ptr<ps::Client> client_;
  std::mutex mu_;  // client calls come from hook threads
  int workers_ = 1;
};

}  // namespace tandem::trainer
