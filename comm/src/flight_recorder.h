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
// "entries": [oldest first]}. Times are microseconds since the epoch. An
// entry's are the coarse monotonic clock's (coarse_clock.h: the kernel's
// tick, 1-4 ms), set to the epoch when the recorder starts: its start is the
// read its deadline takes, and each read costs about 3 ns instead of 20.
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
  // One collective as a dump shows it.
  struct Entry {
    uint64_t seq = 0;
    Collective kind{};
    std::optional<DataType> dtype;
    std::optional<ReduceOp> op;
    uint64_t count = 0;
    int root = -1;
    bool shared_memory = false;  // else UCX
    const char* state = "";      // running | completed | failed
    int64_t started_us = 0, finished_us = 0;
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
  // `started`: when the call began (the caller has read the clock for its deadline).
  void begin(uint64_t seq, const Call& what, bool shared_memory, Clock::time_point started);
  void end(uint64_t seq, bool ok, const std::string& error = {});
  // The peer a running call waits for now (shown in the dump).
  void waiting_on(int peer) { waiting_on_.store(peer, std::memory_order_relaxed); }

  std::string json(const std::string& reason) const;
  // Writes the dump (to a temporary name, then renamed) and returns its path;
  // empty if recording is off or the file cannot be written (logged).
  std::string dump(const std::string& reason) const;
  std::string path() const { return file_; }

 private:
  // Recording takes no lock (a lock pair in begin and in end cost 0.03 us a
  // call: 2 ranks, 8-byte all-to-all, 0.70 against 0.67 us median): one
  // thread at a time records (the communicator runs one collective at a
  // time), and a dump from another (SIGUSR1, abort) reads each slot under a
  // sequence lock, retrying a slot caught mid-write. Error texts, written
  // only when a call fails, sit beside the slots under `mu_`, which a dump
  // holds throughout.
  struct Slot {
    std::atomic<uint64_t> version{0};  // odd while the words below change
    std::atomic<uint64_t> seq{0}, packed{0}, count{0};
    std::atomic<int64_t> started_us{0}, finished_us{0};
  };
  struct Error {
    uint64_t seq = 0;
    std::string text;
  };
  template <class Change>
  void write(Slot& slot, Change change);
  std::optional<Entry> read(const Slot& slot) const;
  Slot& slot_of(uint64_t seq);  // ring_[seq % capacity_]
  int64_t epoch_us(Clock::time_point t) const;

  int rank_, size_;
  std::string job_;
  size_t capacity_;
  std::string file_;
  int64_t epoch_offset_us_;        // the epoch's time minus the steady clock's, at construction
  std::vector<Slot> ring_;         // entry for seq s at s % capacity_
  std::atomic<uint64_t> last_{0};  // highest seq begun
  // The slot of the call begun last (the recording thread's): its end and
  // the next call's begin find theirs without a division.
  uint64_t begun_seq_ = 0;
  Slot* begun_slot_ = nullptr;
  std::atomic<int> waiting_on_{-1};
  mutable std::mutex mu_;
  std::vector<Error> errors_;  // by slot, under mu_
};

}  // namespace tandem
