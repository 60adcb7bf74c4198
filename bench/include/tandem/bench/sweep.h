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

// Flags as in nccl-tests: -b -e -f/-i -n -w -c -d -o -r.
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
  bool registered = false;         // -R: buffers from Communicator::allocate_shared
  // --compress: all-reduce f32 through compression::CompressedAllreduce (sum
  // or avg); adds wire bytes and the error against the f32 result.
  compression::Codec compress = compression::Codec::none;
  Format format = Format::table;
  // --algorithm: the all-reduce algorithm (RingOptions::allreduce); empty = TANDEM_ALGO or auto.
  std::string algorithm;
  std::string plot;  // PNG path for busbw vs size (gnuplot), empty = none
};

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
