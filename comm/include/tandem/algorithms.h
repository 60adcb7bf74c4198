// The algorithms a communicator runs (ring/ provides them) and the
// arguments each collective hands them, checked and complete.
#pragma once

#include <cstddef>

#include "tandem/call.h"
#include "tandem/transport.h"
#include "tandem/types.h"

namespace tandem {

struct AllreduceArgs {
  const void* input = nullptr;  // == output for in-place
  void* output = nullptr;
  size_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  MemoryType memory = MemoryType::host;
  size_t chunk_bytes = 0;  // CollectiveOptions::chunk_bytes
};

// Rank r reduces block r: input holds size() blocks of `count` elements,
// output one block. In-place when output == input + rank * count (NCCL's rule).
struct ReduceScatterArgs {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;  // elements per rank
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  MemoryType memory = MemoryType::host;
};

// Every rank contributes `count` elements; output holds size() blocks, rank
// order. In-place when input == output + rank * count.
struct AllgatherArgs {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;  // elements per rank
  DataType dtype = DataType::f32;
  MemoryType memory = MemoryType::host;
};

// root's input reaches every rank's output (in-place when input == output).
struct BroadcastArgs {
  const void* input = nullptr;  // read on the root only
  void* output = nullptr;
  size_t count = 0;
  DataType dtype = DataType::f32;
  int root = 0;
  MemoryType memory = MemoryType::host;
};

// Rank r's block for peer p is input + send.displs[p], its block from p lands
// at output + recv.displs[p]; send.counts[p] on r equals recv.counts[r] on p.
// alltoall: every count equal. In place when input == output; other overlaps go through scratch.
struct AlltoallvArgs {
  const void* input = nullptr;
  void* output = nullptr;
  Blocks send, recv;  // displacements filled in
  DataType dtype = DataType::f32;
  MemoryType memory = MemoryType::host;
  bool equal = false;  // called as alltoall (every count equal), so a call check names it so
};

// The op-combination of every rank's input lands in root's output (read only
// on the root; in place when input == output).
struct ReduceArgs {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  MemoryType memory = MemoryType::host;
};

// gatherv: each rank's `count` elements land in root's output at
// blocks.displs[r] (blocks: root only). scatterv: the reverse, root's block r
// reaches rank r's output. allgatherv: every rank is a root. In place when the
// rank's own block already sits at its place in output (input == output + displs[rank]).
struct VariableArgs {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;  // this rank's elements
  Blocks blocks;     // displacements filled in
  DataType dtype = DataType::f32;
  int root = 0;
  MemoryType memory = MemoryType::host;
  bool equal = false;  // called as gather or scatter (every count equal), so a call check names it so
};

// reduce_scatterv: input holds every rank's block (blocks.counts[r] elements
// at blocks.displs[r]); rank r's output receives block r reduced over ranks.
struct ReduceScattervArgs {
  const void* input = nullptr;
  void* output = nullptr;
  Blocks blocks;
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
  virtual void reduce_scatter(Channel& channel, const ReduceScatterArgs& args) = 0;
  virtual void allgather(Channel& channel, const AllgatherArgs& args) = 0;
  virtual void broadcast(Channel& channel, const BroadcastArgs& args) = 0;
  virtual void barrier(Channel& channel) = 0;
  virtual void alltoallv(Channel& channel, const AlltoallvArgs& args) = 0;
  virtual void reduce(Channel& channel, const ReduceArgs& args) = 0;
  virtual void gatherv(Channel& channel, const VariableArgs& args) = 0;
  virtual void scatterv(Channel& channel, const VariableArgs& args) = 0;
  virtual void allgatherv(Channel& channel, const VariableArgs& args) = 0;
  virtual void reduce_scatterv(Channel& channel, const ReduceScattervArgs& args) = 0;
  // Bytes of node-local shared memory each rank should map for these
  // algorithms (SharedMemory::segments); 0 = none.
  virtual size_t shared_bytes() const { return 0; }
  // The same algorithms mapping `bytes` of shared memory, as peers chose
  // (a joiner adopts the members' size, which their host fixed when they
  // started); null when they cannot.
  virtual std::shared_ptr<Algorithms> with_shared_bytes(size_t /*bytes*/) const { return nullptr; }
};

}  // namespace tandem
