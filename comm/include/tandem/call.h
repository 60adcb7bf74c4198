// One call descriptor for every operation a communicator runs, and the table
// of operations that the C++ methods, the C API, the Python package and the
// torch backend are driven from (docs/api.md, "One call, one table").
//
// A Call names its operation and carries every argument any operation takes;
// each operation reads the fields its table row lists and ignores the rest.
// Communicator::start(call) starts it and returns a Request; the named
// methods (allreduce, gather, send, ...) build a Call and start or run it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "tandem/types.h"

namespace tandem {

struct CollectiveOptions {
  std::optional<std::chrono::milliseconds> timeout;  // default: CommOptions::timeout
  // Where the buffers live. MemoryType::cuda routes reductions to the CUDA
  // kernels; it needs a CUDA build and a UCX with CUDA memory support, and is
  // rejected with InvalidArgument otherwise.
  MemoryType memory = MemoryType::host;
  // All-reduce only: the pipeline chunk of this call, the same on every rank:
  // the ring's segment, or the shared-memory chunk (at most the communicator's,
  // whose slots are sized for it). 0 = the communicator's; else >= 4096.
  // The gradient-sync autotuner moves it.
  size_t chunk_bytes = 0;
};

// Per-peer blocks of a variable-size collective: counts and displacements in
// elements, one per rank (MPI's layout). Empty displacements: packed, in rank order.
struct Blocks {
  std::vector<size_t> counts;
  std::vector<size_t> displs;
};

// One message of a point-to-point group (Communicator::group): a send of
// `count` elements to `peer`, or a receive from `peer` (kAnySource: whoever
// sends with this tag first). Tags are the caller's, 0 .. 2^31-1; messages
// between two ranks with one tag arrive in the order they were sent.
constexpr int kAnySource = -1;
struct P2POp {
  enum Kind : uint8_t { send, recv } kind = send;
  void* data = nullptr;  // read for a send
  size_t count = 0;
  DataType dtype = DataType::f32;
  int peer = 0;
  uint32_t tag = 0;
};

// The operations, in table order (the C API's tandem_op_t shares it).
enum class Op : uint8_t {
  allreduce,
  reduce_scatter,
  allgather,
  broadcast,
  barrier,
  alltoall,
  alltoallv,
  reduce,
  gather,
  gatherv,
  scatter,
  scatterv,
  allgatherv,
  reduce_scatterv,
  send,
  recv,
  group,
};

// Blocks as a Call carries them: views of the caller's arrays (empty
// displacements: packed in rank order).
struct BlockView {
  std::span<const size_t> counts;
  std::span<const size_t> displs;

  BlockView() = default;
  BlockView(std::span<const size_t> c, std::span<const size_t> d) : counts(c), displs(d) {}
  BlockView(const Blocks& b) : counts(b.counts), displs(b.displs) {}  // NOLINT: implicit, as sugar
};

// An operation and its arguments. The Call does not own its arrays (blocks,
// group ops): start() copies what it needs before it returns.
struct Call {
  Op op = Op::barrier;
  const void* input = nullptr;  // == output for in-place
  void* output = nullptr;
  size_t count = 0;  // elements: per rank for the fixed-size collectives, this rank's for the v-forms
  DataType dtype = DataType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;  // rooted collectives
  int peer = 0;  // send, recv (kAnySource: from anyone)
  uint32_t tag = 0;
  BlockView send{};                // how the input divides among ranks (alltoallv, scatterv, reduce_scatterv)
  BlockView recv{};                // how the output divides among ranks (alltoallv, gatherv, allgatherv)
  std::span<const P2POp> group{};  // group's messages
  CollectiveOptions options{};
};

// ---- The table -----------------------------------------------------------

// The fields of a Call an operation reads, one bit each.
enum CallField : uint16_t {
  kFieldInput = 1 << 0,
  kFieldOutput = 1 << 1,
  kFieldCount = 1 << 2,
  kFieldReduce = 1 << 3,
  kFieldRoot = 1 << 4,
  kFieldPeer = 1 << 5,
  kFieldTag = 1 << 6,
  kFieldSend = 1 << 7,
  kFieldRecv = 1 << 8,
  kFieldGroup = 1 << 9,
};

// How many elements a buffer of a call spans.
enum class Extent : uint8_t {
  none,            // not read or written
  count,           // count
  count_per_rank,  // size() blocks of count
  send_blocks,     // as far as the send blocks reach
  recv_blocks,     // as far as the recv blocks reach
  own_send_block,  // send.counts[rank]
};

// Who holds a buffer.
enum class Holder : uint8_t { every_rank, root_only };

struct OpInfo {
  Op op;
  const char* name;       // "allreduce": C++ method, Python method, bench test, C enum TANDEM_OP_<NAME>
  Collective collective;  // what ranks compare and the wire carries
  uint16_t fields;        // CallField bits read
  Extent input, output;   // what each buffer spans
  Holder input_holder, output_holder;
  // Bindings given no output buffer use the input's (in place).
  bool output_defaults_to_input;
  // Parameters of the bindings' method, in order, Python's spelling:
  // "tensor" the input (the output when there is none), "out" the output,
  // "counts"/"displs" the blocks, and the Call's fields by name.
  const char* params;
  const char* summary;  // one line, for docs and help()
};

// Every operation, in Op order.
std::span<const OpInfo> operations();
const OpInfo& operation(Op op);
// nullptr when no operation has this name.
const OpInfo* find_operation(std::string_view name);

// Elements `call` reads from its input and writes to its output on `rank`
// of `size` ranks (0 where the rank holds no such buffer), per the table.
size_t input_extent(const Call& call, int rank, int size);
size_t output_extent(const Call& call, int rank, int size);

// For bindings that hold buffers of known length (Python, the torch backend):
// sets call.count from them as the operation's row says, then checks that
// each buffer this rank holds spans what the call reads or writes; throws
// InvalidArgument naming the buffer and the lengths.
void fit_count(Call& call, size_t input_elements, size_t output_elements, int rank, int size);

}  // namespace tandem
