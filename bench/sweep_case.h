// The tests of `tandem bench` as one table (what differs between collectives:
// nccl-tests' size convention, bus factor, buffer layout, data check), and
// Case: one size and placement of one test, its buffers, its call and its check.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tandem/bench/sweep.h"
#include "tandem/collective.h"
#include "tandem/communicator.h"

namespace tandem::bench {

// busbw = algbw * factor (nccl-tests' doc/PERFORMANCE.md).
enum class Bus : uint8_t { none, one, ring, twice_ring };  // 0, 1, (n-1)/n, 2(n-1)/n
double bus_factor(Bus bus, int n);

// A rooted collective either sends from the root (broadcast, scatter: only the
// root's input matters) or delivers to it (reduce, gather: only its output does).
enum class Root : uint8_t { none, sends, receives };

// The arguments of one call, as the table's run functions take them.
struct Call {
  char* src;
  char* dst;
  size_t count;  // elements per rank (the count column)
  DataType dtype;
  ReduceOp op;
  int root;
  const std::vector<P2POp>* ring;  // sendrecv: the send to r+1 and the receive from r-1
};

struct Spec {
  const char* name;  // as `tandem bench` takes it and the JSON reports it (nccl-tests' names)
  Collective collective;
  Bus bus;
  Root root;
  // The input holds one block per rank and rank r's result comes from block r
  // (reduce_scatter, scatter, alltoall).
  bool splits_input;
  // The output holds one block per rank, block b from rank b (allgather, gather, alltoall).
  bool gathers_output;
  bool reduces;   // applies -o (otherwise the op column says "none")
  bool in_place;  // has an in-place form (sendrecv has none: one buffer cannot be sent and received into at once)
  void (*run)(Communicator&, const Call&);

  // nccl-tests' "size" is the largest buffer of a rank: this many blocks of `count` elements.
  int size_blocks(int n) const { return splits_input || gathers_output ? n : 1; }
  bool rooted() const { return root != Root::none; }
  bool moves_data() const { return bus != Bus::none; }
};

// The test named `name`; InvalidArgument naming the available ones otherwise.
const Spec& spec_of(const std::string& name);

// One size and placement of one test. Out of place: input from `in`, output
// to `out`. In place: one buffer (`in`), the rank's own block of it being the
// input (allgather, gather) or the output (reduce_scatter, scatter), else all of it.
class Case {
 public:
  Case(Communicator& comm, const SweepOptions& o, size_t count, bool inplace, char* in, char* out,
       compression::CompressedAllreduce* compressed);

  // Inputs with a closed-form result; the output is poisoned first so stale
  // results from an earlier run cannot pass the check.
  void fill_for_check();
  void fill();
  void run();
  // Wrong elements on this rank.
  long wrong() const;

  // The all-reduce op of run() (--compress timing may swap sum for avg).
  void use_op(ReduceOp op) { call_.op = op; }
  size_t count() const { return call_.count; }
  const float* input_f32() const { return reinterpret_cast<const float*>(call_.src); }
  const float* output_f32() const { return reinterpret_cast<const float*>(call_.dst); }

 private:
  Communicator& comm_;
  const Spec& spec_;
  const int n_, r_;
  const size_t block_;  // count in bytes
  Call call_;
  std::vector<P2POp> ring_;
  compression::CompressedAllreduce* const compressed_;  // --compress, else null
};

}  // namespace tandem::bench
