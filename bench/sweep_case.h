// The tests of `tandem bench` as one table (what differs between collectives:
// nccl-tests' size convention, bus factor, buffer layout, data check), and
// Case: one size and placement of one test, its buffers, its call and its check.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "tandem/bench/sweep.h"
#include "tandem/call.h"
#include "tandem/collective.h"
#include "tandem/communicator.h"

namespace tandem::bench {

// busbw = algbw * factor (nccl-tests' doc/PERFORMANCE.md).
enum class Bus : uint8_t { none, one, ring, twice_ring };  // 0, 1, (n-1)/n, 2(n-1)/n
double bus_factor(Bus bus, int n);

// A rooted collective either sends from the root (broadcast, scatter: only the
// root's input matters) or delivers to it (reduce, gather: only its output does).
enum class Root : uint8_t { none, sends, receives };

// How a point-to-point test (Op::group) pairs the ranks: none (a collective),
// a ring (sendrecv: r sends to r+1), or nccl-tests' hypercube all-gather
// (log2 n steps, step s exchanging 2^s blocks with rank r ^ 2^s).
enum class Peers : uint8_t { none, ring, hypercube };

struct Spec {
  Op op;  // the operation it times (tandem/call.h)
  Bus bus;
  Root root;
  // The input holds one block per rank and rank r's result comes from block r
  // (reduce_scatter, scatter, alltoall).
  bool splits_input;
  // The output holds one block per rank, block b from rank b (allgather, gather, alltoall).
  bool gathers_output;
  bool reduces;   // applies -o (otherwise the op column says "none")
  bool in_place;  // has an in-place form (sendrecv has none: one buffer cannot be sent and received into at once)
  // nccl-tests' name where it differs from the operation's (sendrecv: a group of one send and one receive).
  const char* nccl_name = nullptr;
  Peers peers = Peers::none;

  const char* name() const { return nccl_name ? nccl_name : operation(op).name; }
  Collective collective() const { return operation(op).collective; }
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
  // Starts one operation and adds its Request to `pending` (a hypercube's
  // dependent steps and a compressed all-reduce run whole instead).
  void start(std::vector<Request>& pending);
  // Wrong elements on this rank.
  long wrong() const;

  // The all-reduce op of run() (--compress timing may swap sum for avg).
  void use_op(ReduceOp op) { call_.reduce = op; }
  size_t count() const { return call_.count; }
  const float* input_f32() const { return static_cast<const float*>(call_.input); }
  const float* output_f32() const { return static_cast<const float*>(call_.output); }

 private:
  Communicator& comm_;
  const Spec& spec_;
  const int n_, r_;
  const size_t block_;  // count in bytes
  char* src() const { return static_cast<char*>(const_cast<void*>(call_.input)); }
  char* dst() const { return static_cast<char*>(call_.output); }
  // alltoallv: rank r's blocks for rank p (send) and from p (recv), see varied_blocks.
  long wrong_varied() const;
  // hypercube: the own block into place, then one send/receive group per step.
  void run_hypercube();

  Call call_;
  std::vector<P2POp> ring_;
  Blocks send_, recv_;
  compression::CompressedAllreduce* const compressed_;  // --compress, else null
};

}  // namespace tandem::bench
