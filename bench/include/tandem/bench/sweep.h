// nccl-tests-style sweep of one collective over message sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/compression/compression.h"
#include "tandem/types.h"

namespace tandem::bench {

enum class Format { table, csv, json };

// How the per-rank times become the one reported (nccl-tests' -a): rank 0's,
// the mean over ranks, the fastest rank's or the slowest rank's.
enum class RankTime : uint8_t { rank0, avg, min, max };

// Flags as in nccl-tests: -b -e -f/-i -n -w -c -d -o -r -m -z -a -N -T -C -S.
struct SweepOptions {
  std::string collective = "allreduce";
  size_t min_bytes = 32 << 20;     // -b
  size_t max_bytes = 32 << 20;     // -e
  double factor = 2.0;             // -f (used when increment == 0)
  size_t increment = 0;            // -i
  int iters = 20;                  // -n
  int warmup = 5;                  // -w
  bool check = true;               // -c
  DataType dtype = DataType::f32;  // -d
  ReduceOp op = ReduceOp::sum;     // -o
  int root = 0;                    // -r
  // -d all, -o all, -r all: a table per type, op and root (dtype, op and root above are then ignored).
  std::vector<DataType> dtypes;
  std::vector<ReduceOp> ops;
  bool every_root = false;
  int agg_iters = 1;                   // -m: operations started per iteration, then all waited
  bool blocking = false;               // -z 1: each operation waited before the next starts, even under -m
  RankTime rank_time = RankTime::avg;  // -a (nccl-tests' default: 1, the mean over ranks)
  int cycles = 1;                      // -N: the sweep this many times, each printed (0: until interrupted)
  int timeout_s = 0;                   // -T: a size (check, warm-up, timed loop) past this many seconds fails; 0 = none
  bool cpu_time = false;               // -C 1: the calling thread's CPU time instead of wall time
  bool timestamps = false;             // -S 1: each row carries the UTC time it was measured
  bool registered = false;             // -R: buffers from Communicator::allocate_shared
  // --compress: all-reduce f32 through compression::CompressedAllreduce (sum
  // or avg); adds wire bytes and the error against the f32 result.
  compression::Codec compress = compression::Codec::none;
  Format format = Format::table;
  // --algorithm: the all-reduce algorithm (RingOptions::allreduce); empty = TANDEM_ALGO or auto.
  std::string algorithm;
  std::string plot;  // PNG path for busbw vs size (gnuplot), empty = none
  // -J FILE: rank 0 writes the rows there (CSV when the name ends in .csv, else JSON lines).
  std::string output_file;
};

// A test's name as tandem reports it: tandem's own names, nccl-tests' binary
// names (all_reduce_perf) and their stems (all_reduce, all_gather); throws
// InvalidArgument naming the available ones otherwise.
std::string canonical_collective(const std::string& name);

// nccl-tests' -a value (0..3) as a RankTime, and its name in tables and JSON.
const char* to_string(RankTime t);

// One timed measurement: `iters` back-to-back operations after a barrier; the
// slowest rank's microseconds per operation (every rank returns the same).
double time_per_op_us(Communicator& comm, const std::function<void()>& op, int iters);

// The collectives `tandem bench` sweeps, as it takes and reports their names
// (nccl-tests' tests: allreduce, ..., alltoall, gather, scatter, sendrecv).
std::vector<std::string> sweep_collectives();

// Runs the sweep as one rank of a job (environment from bootstrap.h); rank 0
// prints. Returns a process exit code: 0, or 1 if any result was wrong.
int run_sweep(const SweepOptions& options);

}  // namespace tandem::bench
