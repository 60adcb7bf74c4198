// The communicator: a group of ranks connected by UCX, running collectives
// in the order they are issued (the same order on every rank, as in NCCL and
// Horovod). Every collective is asynchronous underneath: a per-communicator
// engine thread owns the UCX worker and executes them one at a time; blocking
// calls are the async call followed by wait().
//
// Errors are sticky (as in Gloo): after a peer failure, a timeout or abort(),
// the communicator is unusable and every pending and later call throws.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tandem/errors.h"
#include "tandem/transport.h"
#include "tandem/types.h"

namespace tandem {

// Where a rank finds its peers; see bootstrap.h for reading it from the environment.
struct CommOptions {
  int rank = -1;
  int size = -1;
  int local_rank = -1;
  int local_size = -1;
  std::string store_address;  // "host:port" of the bootstrap store
  bool host_store = false;    // this rank (rank 0) starts the store itself (mpirun, Slurm)
  std::string prefix = "tandem";  // namespace for this communicator's store keys
  // Default deadline of every collective; each call may override it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // Ring pipelining: segment size and how many segments are in flight per step.
  size_t segment_bytes = 1 << 20;
  int segments_in_flight = 4;
  // How often a waiting rank asks the store whether some rank died. The store
  // learns of a death when the rank's connection drops, on any transport.
  std::chrono::milliseconds failure_poll{std::chrono::milliseconds(200)};
  // UCX peer error handling on every endpoint. Off by default: UCX 1.13
  // excludes its shared-memory transports from endpoints in that mode, which
  // forces TCP even between processes on one host; the store already names
  // dead ranks. Turn it on for multi-host runs that want UCX keepalive too.
  bool ucx_peer_error_handling = false;
  // UCX_NET_DEVICES for this communicator's context; empty leaves UCX's choice.
  std::string ucx_net_devices;
};

struct CollectiveOptions {
  std::optional<std::chrono::milliseconds> timeout;  // default: CommOptions::timeout
};

struct AllreduceArgs {
  const void* input = nullptr;  // == output for in-place
  void* output = nullptr;
  size_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  MemoryType memory = MemoryType::host;
};

// The collective algorithms a communicator runs (ring/ provides them). They
// see only a Channel, never the transport behind it.
class Algorithms {
 public:
  virtual ~Algorithms() = default;
  virtual void allreduce(Channel& channel, const AllreduceArgs& args) = 0;
};

// Handle of an asynchronous collective. Copyable; all copies share the state.
class Request {
 public:
  Request() = default;
  // True once finished; rethrows the collective's error.
  bool test();
  // Waits until finished (bounded by the collective's own deadline); rethrows its error.
  void wait();
  // As wait(), but throws Timeout if not finished by `deadline` (the collective keeps running).
  void wait(Deadline deadline);

  struct State;
  explicit Request(std::shared_ptr<State> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<State> state_;
};

class Communicator {
 public:
  // Connects to every peer; throws Timeout past options.connect_timeout.
  static std::unique_ptr<Communicator> create(const CommOptions& options, std::shared_ptr<Algorithms> algorithms);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const CommOptions& options() const;

  // Out-of-place when input != output; in-place when they are equal.
  void allreduce(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                 const CollectiveOptions& opts = {});
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const CollectiveOptions& opts = {}) {
    allreduce(data, data, count, dtype, op, opts);
  }
  Request allreduce_async(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                          const CollectiveOptions& opts = {});

  // Unblocks every pending call on this communicator with Aborted; sticky.
  void abort(const std::string& reason = "abort() called");
  bool aborted() const;

  // The UCX transports in use, e.g. "sysv/memory cma/memory" (for logs and `tandem info`).
  std::string transport_summary() const;

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
