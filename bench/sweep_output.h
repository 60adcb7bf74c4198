// What `tandem bench` prints of a sweep: nccl-tests' table on stdout, and
// CSV or JSON rows (one per size and placement) on stdout (--format) and in
// the -J file, which rank 0 alone writes, so a launcher's prefix never lands there.
#pragma once

#include <cstdio>
#include <string>

#include "tandem/bench/sweep.h"
#include "tandem/communicator.h"

namespace tandem::bench {

// The per-iteration times of one placement (µs per operation), each
// iteration's time first reduced across ranks as -a says: nearest-rank percentiles.
struct IterationStats {
  double p50 = 0, p99 = 0, min = 0, max = 0;
};

struct Result {
  size_t bytes = 0;
  size_t count = 0;
  bool inplace = false;
  double time_us = 0;     // the mean per operation, reduced across ranks as -a says
  double slowest_us = 0;  // the slowest rank's mean (-a 3), whatever -a says
  IterationStats iterations;
  double algbw = 0;
  double busbw = 0;
  long wrong = -1;        // -1: not checked
  int cycle = 1;          // -N: which run of the sweep
  std::string timestamp;  // -S 1: UTC, ISO 8601
  // --compress: bytes reduced per timed operation (16-bit, plus f32 after a
  // fallback), fallbacks in the timed loop, and the checked run's error
  // against the f32 result (-1: not checked).
  double wire_bytes = 0;
  uint64_t fallbacks = 0;
  double max_error = -1, mean_error = -1;
  // Bytes read and written per payload byte by the busiest rank's shared-memory
  // collectives in the timed loop (Communicator::shared_memory_traffic); 0: none went through it.
  double traffic = 0;
};

// A placement the collective has no form for (sendrecv in place): not run, N/A in the table, no CSV or JSON row.
inline bool measured(const Result& r) { return r.time_us >= 0; }

std::string op_name(const SweepOptions& o);
int root_of(const SweepOptions& o);
bool compressing(const SweepOptions& o);

// Where the rows go: stdout in --format, and the -J file in its own format.
struct Sinks {
  FILE* file = nullptr;  // rank 0's -J file, else null
  Format file_format = Format::json;
};

void print_table_header(const SweepOptions& o, Communicator& comm, const std::string& algorithm);
void print_csv_header(FILE* out, const SweepOptions& o);
// One size: a table row, or a CSV or JSON row per placement measured; and the file's rows.
void print_row(const SweepOptions& o, int nranks, const Result& oop, const Result& ip, const Sinks& sinks);
// barrier's one timed row.
void print_barrier(const SweepOptions& o, int nranks, const Result& r, const Sinks& sinks);

}  // namespace tandem::bench
