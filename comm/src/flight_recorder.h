// Flight recorder: each communicator keeps its last N collectives (sequence
// number, kind, dtype, count, op, root, peers, state, timestamps) in a ring of
// entries, and writes them as JSON when a collective times out or fails, when
// the communicator is aborted, or when the process gets SIGUSR1.
// `tandem doctor DUMP...` reads the dumps of a job's ranks and names the first
// call where they diverge and the ranks that never entered it.
//
// Terms: an *entry* is one collective on one rank; its *state* is "running"
// (entered, not finished), "completed" or "failed". A *dump* is one rank's
// JSON file: {"rank", "size", "host", "pid", "job", "reason", "dumped_at_us",
// "entries": [oldest first]}. Times are microseconds since the epoch.
//
// SIGUSR1: the handler only writes a byte to a pipe; one thread per process
// reads it and dumps every live recorder. That pipe, the thread and the list
// of live recorders are the only process-wide state, as a signal needs; the
// handler is installed only where SIGUSR1 still has its default action.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tandem/communicator.h"

namespace tandem {

class FlightRecorder {
 public:
  // Recording costs a lock and a few stores per call (no allocation): the
  // strings are static, and the peers are derived from the path when dumping.
  struct Entry {
    uint64_t seq = 0;
    Collective kind{};
    std::optional<DataType> dtype;
    std::optional<ReduceOp> op;
    uint64_t count = 0;
    int root = -1;
    bool shared_memory = false;   // else UCX
    const char* state = "";       // running | completed | failed
    int64_t started_us = 0, finished_us = 0;
    std::string error;
  };

  // `capacity` entries (0: record nothing, never dump); dumps go to `dir`.
  FlightRecorder(const CommOptions& options, size_t capacity, std::string dir);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // What a call is: its kind, dtype and op when it has them, count and root.
  struct Call {
    Collective kind{};
    std::optional<DataType> dtype;
    std::optional<ReduceOp> op;
    size_t count = 0;
    int root = -1;
  };
  void begin(uint64_t seq, const Call& what, bool shared_memory);
  void end(uint64_t seq, bool ok, const std::string& error = {});
  // The peer a running call waits for now (shown in the dump).
  void waiting_on(int peer) { waiting_on_.store(peer, std::memory_order_relaxed); }

  std::string json(const std::string& reason) const;
  // Writes the dump (to a temporary name, then renamed) and returns its path;
  // empty if recording is off or the file cannot be written (logged).
  std::string dump(const std::string& reason) const;
  std::string path() const { return file_; }

 private:
  int rank_, size_;
  std::string job_;
  size_t capacity_;
  std::string file_;
  mutable std::mutex mu_;
  std::vector<Entry> ring_;  // entry for seq s at s % capacity_
  uint64_t last_ = 0;        // highest seq begun
  std::atomic<int> waiting_on_{-1};
};

}  // namespace tandem
