// Sharded parameter server (BytePS / ps-lite style) over a Communicator.
//
// Terms:
//  - worker, server: the ranks of one communicator split in two; the last
//    `servers` ranks are servers, the others workers. Servers run serve();
//    workers make a Client.
//  - key: a named tensor of `rows` x `cols` elements of one dtype (a 1-D
//    tensor is rows = elements, cols = 1). Every worker declares the same keys
//    in the same order; the servers check that they agree.
//  - part: a run of whole rows of one key, at most Options::part_bytes
//    (4 MiB, as BytePS). Parts of all keys, in declaration order, are dealt to
//    the servers round-robin, so large tensors spread evenly.
//  - shard: the parts of one key that one server owns.
//  - step: a worker's t-th push of a key is its step t (from 1). The server
//    applies step t of a shard once every worker has pushed it, in step order.
//    `applied` is the last applied step (0 before any).
//  - update rule, per key: `sum` (the server's value after step t is the sum of
//    the workers' pushes of step t; workers run the optimizer) or `sgd`
//    (f32 only: g = mean of the step's pushes, m = momentum * m + g,
//    w = w - lr * m; the value is w, starting at 0 or at what set() wrote).
//    Sparse pushes touch only their rows: under `sum` the rows no worker pushed
//    in step t read 0; under `sgd` untouched rows and their momentum stay as
//    they are (lazy momentum, as sparse SGD in PyTorch/TensorFlow).
//  - staleness s: a pull issued after a worker's t-th push of a key returns
//    once the server has applied step t - s or later, and returns the value of
//    the last applied step, which it reports. s = 0 is synchronous: the pull
//    sees exactly the sum of every worker's step-t pushes. With s > 0 no
//    worker gets past its pull of step t before every worker has pushed step
//    t - s: the fastest runs at most s steps ahead of the slowest. Pushes
//    alone never wait.
//
// Every call takes the communicator's deadline (Options::timeout overrides).
// Messages go through Communicator::exchange (the collectives' UCX layer and
// store); a dead server makes every waiting worker fail with PeerFailure
// naming it. Requests of one worker run in issue order on its communicator's
// engine: like collectives, workers should issue pushes and pulls in the same
// order (a pull waits for other workers' pushes issued before it).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/communicator.h"
#include "tandem/settings.h"
#include "tandem/types.h"

namespace tandem::ps {

enum class UpdateRule : uint8_t { sum, sgd };

struct KeySpec {
  std::string name;
  size_t rows = 0;
  size_t cols = 1;
  DataType dtype = DataType::f32;
  UpdateRule rule = UpdateRule::sum;
  float lr = 0.01f;       // sgd only
  float momentum = 0.9f;  // sgd only

  size_t elements() const { return rows * cols; }
};

struct Options {
  int servers = 1;                                   // the last `servers` ranks (TANDEM_SERVERS)
  size_t part_bytes = 4u << 20;                      // at least one row per part
  int staleness = 0;                                 // 0 = synchronous (TANDEM_PS_STALENESS)
  std::optional<std::chrono::milliseconds> timeout;  // per call; default: the communicator's
  // How long serve() may run in all (its deadline).
  std::chrono::milliseconds serve_timeout{std::chrono::hours(24)};
};

// The parameter server's table: TANDEM_SERVERS, TANDEM_PS_STALENESS, TANDEM_PS_PART_BYTES.
const SettingTable<Options>& settings();

// Options from the variables of settings() (read once, at start); servers is 0
// without TANDEM_SERVERS. Throws InvalidArgument naming a malformed one.
Options ps_options_from_env(const EnvLookup& env = process_env());

// Whether `rank` is a server of a communicator of `size` ranks.
bool is_server(int rank, int size, const Options& options);
int worker_count(int size, const Options& options);

// Where a key's parts live (identical on every rank).
struct Part {
  size_t first_row = 0, rows = 0;
  int server = 0;        // 0..servers-1
  size_t shard_row = 0;  // where the part starts inside its server's shard
};
struct KeyLayout {
  KeySpec spec;
  size_t rows_per_part = 0;
  std::vector<Part> parts;
  std::vector<size_t> shard_rows;  // per server
};
std::vector<KeyLayout> plan(const std::vector<KeySpec>& keys, const Options& options);

// The server role: answers the workers until each has closed its Client (or
// the job fails). Returns the number of steps it applied, summed over shards.
uint64_t serve(Communicator& comm, const Options& options);

class Client {
 public:
  // Declares the keys (every worker the same, same order); throws
  // InvalidArgument naming the first difference between workers.
  Client(Communicator& comm, std::vector<KeySpec> keys, const Options& options);
  // Closes (tells the servers this worker is done); errors are logged, not thrown.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Dense: `count` must equal the key's rows x cols, `dtype` its dtype.
  void push(const std::string& key, const void* data, size_t count, DataType dtype);
  Request push_async(const std::string& key, const void* data, size_t count, DataType dtype);
  // Sparse: rows[i] (cols elements) is added to row ids[i]; ids may repeat and
  // may be empty (the push still counts as this worker's step).
  void push_rows(const std::string& key, const int64_t* ids, size_t n, const void* rows, DataType dtype);
  Request push_rows_async(const std::string& key, const int64_t* ids, size_t n, const void* rows, DataType dtype);
  // Returns the applied step whose value was read (the smallest over servers).
  uint64_t pull(const std::string& key, void* out, size_t count, DataType dtype);
  Request pull_async(const std::string& key, void* out, size_t count, DataType dtype, uint64_t* step = nullptr);
  uint64_t pull_rows(const std::string& key, const int64_t* ids, size_t n, void* out, DataType dtype);
  Request pull_rows_async(const std::string& key, const int64_t* ids, size_t n, void* out, DataType dtype,
                          uint64_t* step = nullptr);
  // Sum-rule keys: the rows the last applied step wrote (every row some
  // worker pushed in it; all rows after a dense push), as global ids and
  // rows (cols elements each, in the key's dtype), grouped by server. The
  // sparse counterpart of pull: only touched rows cross the network.
  uint64_t pull_touched(const std::string& key, std::vector<int64_t>& ids, std::vector<std::byte>& rows);
  // Overwrites the server's value of a key (worker 0 initialising parameters);
  // not a step. Ordered with this worker's other requests only.
  void set(const std::string& key, const void* data, size_t count, DataType dtype);

  // Pushes of `key` this worker has issued (its current step).
  uint64_t step(const std::string& key) const;
  const std::vector<KeyLayout>& layout() const { return layout_; }
  void close();

 private:
  const KeyLayout& find(const std::string& key, const char* call, size_t count, DataType dtype) const;
  size_t index(const std::string& key, const char* call) const;
  CollectiveOptions call_options() const;

  Communicator& comm_;
  Options options_;
  int workers_;
  std::vector<KeyLayout> layout_;
  std::vector<uint64_t> steps_;
  uint32_t next_request_ = 1;
  bool closed_ = false;
};

}  // namespace tandem::ps
