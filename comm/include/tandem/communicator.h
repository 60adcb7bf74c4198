// The communicator: a group of ranks connected by UCX, running collectives
// in the order they are issued (the same order on every rank, as in NCCL and
// Horovod). Every collective is asynchronous underneath: a per-communicator
// engine thread owns the UCX worker and executes them one at a time; blocking
// calls are the async call followed by wait().
//
// A blocking call on an idle communicator runs on the caller's thread instead
// (same order guarantee: it never overtakes a queued collective).
//
// Errors are sticky (as in Gloo): after a peer failure, a timeout or abort(),
// the communicator is unusable and every pending and later call throws.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/algorithms.h"
#include "tandem/call.h"
#include "tandem/comm_options.h"
#include "tandem/errors.h"
#include "tandem/transport.h"
#include "tandem/types.h"

namespace tandem {

// split(): a rank with this colour belongs to no new communicator.
constexpr int kUndefinedColor = -1;

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
  // A finished receive (recv or recv_async; a group's receive from any source): the rank it came from, else -1.
  int source() const;

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
  // Which ranks share a host (learnt at start-up through the store).
  const Topology& topology() const;

  // ---- Every operation: one call --------------------------------------------
  // Starts `call` (see tandem/call.h) and returns at once; the Request
  // finishes when the call has, on this rank. Collectives are called by every
  // rank in the same order and checked across ranks; point-to-point calls
  // (send, recv, group) involve only the ranks they address.
  Request start(const Call& call);
  // start(call).wait(), except that on an idle communicator the call runs on
  // this thread (no hand-off to the engine and back: most of a small call's
  // latency). Returns the source of a receive (a group's receive from any
  // source), else -1.
  int run(const Call& call);

  // ---- The operations by name: a Call started (_async) or run ---------------
  // Out-of-place when input != output; in-place when they are equal.
  void allreduce(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                 const CollectiveOptions& opts = {}) {
    run(reducing_call(Op::allreduce, input, output, count, dtype, op, opts));
  }
  void allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const CollectiveOptions& opts = {}) {
    allreduce(data, data, count, dtype, op, opts);
  }
  Request allreduce_async(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                          const CollectiveOptions& opts = {}) {
    return start(reducing_call(Op::allreduce, input, output, count, dtype, op, opts));
  }

  // Rank r reduces block r: input holds size() blocks of `count` elements,
  // output one block. In-place when output == input + rank * count (NCCL's rule).
  void reduce_scatter(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                      const CollectiveOptions& opts = {}) {
    run(reducing_call(Op::reduce_scatter, input, output, count, dtype, op, opts));
  }
  Request reduce_scatter_async(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                               const CollectiveOptions& opts = {}) {
    return start(reducing_call(Op::reduce_scatter, input, output, count, dtype, op, opts));
  }
  // Every rank contributes `count` elements; output holds size() blocks, rank
  // order. In-place when input == output + rank * count.
  void allgather(const void* input, void* output, size_t count, DataType dtype, const CollectiveOptions& opts = {}) {
    run(block_call(Op::allgather, input, output, count, dtype, opts));
  }
  Request allgather_async(const void* input, void* output, size_t count, DataType dtype,
                          const CollectiveOptions& opts = {}) {
    return start(block_call(Op::allgather, input, output, count, dtype, opts));
  }
  // root's input reaches every rank's output (in-place when input == output).
  void broadcast(const void* input, void* output, size_t count, DataType dtype, int root,
                 const CollectiveOptions& opts = {}) {
    run(broadcast_call(input, output, count, dtype, root, opts));
  }
  void broadcast(void* data, size_t count, DataType dtype, int root, const CollectiveOptions& opts = {}) {
    broadcast(data, data, count, dtype, root, opts);
  }
  Request broadcast_async(const void* input, void* output, size_t count, DataType dtype, int root,
                          const CollectiveOptions& opts = {}) {
    return start(broadcast_call(input, output, count, dtype, root, opts));
  }
  // Returns once every rank has entered the barrier.
  void barrier(const CollectiveOptions& opts = {}) { run({.op = Op::barrier, .options = opts}); }
  Request barrier_async(const CollectiveOptions& opts = {}) { return start({.op = Op::barrier, .options = opts}); }

  // alltoall: block p of input (count elements) goes to rank p, block p of output comes from it.
  void alltoall(const void* input, void* output, size_t count, DataType dtype, const CollectiveOptions& opts = {}) {
    run(block_call(Op::alltoall, input, output, count, dtype, opts));
  }
  Request alltoall_async(const void* input, void* output, size_t count, DataType dtype,
                         const CollectiveOptions& opts = {}) {
    return start(block_call(Op::alltoall, input, output, count, dtype, opts));
  }
  // Rank r's block for peer p is input + send.displs[p], its block from p lands
  // at output + recv.displs[p]; send.counts[p] on r equals recv.counts[r] on p.
  // In place when input == output; other overlaps go through scratch.
  void alltoallv(const void* input, const Blocks& send, void* output, const Blocks& recv, DataType dtype,
                 const CollectiveOptions& opts = {}) {
    run(alltoallv_call(input, send, output, recv, dtype, opts));
  }
  Request alltoallv_async(const void* input, const Blocks& send, void* output, const Blocks& recv, DataType dtype,
                          const CollectiveOptions& opts = {}) {
    return start(alltoallv_call(input, send, output, recv, dtype, opts));
  }
  // The op-combination of every rank's input lands in root's output (read only
  // on the root, may be null elsewhere; in place when input == output).
  void reduce(const void* input, void* output, size_t count, DataType dtype, ReduceOp op, int root,
              const CollectiveOptions& opts = {}) {
    run(reduce_call(input, output, count, dtype, op, root, opts));
  }
  Request reduce_async(const void* input, void* output, size_t count, DataType dtype, ReduceOp op, int root,
                       const CollectiveOptions& opts = {}) {
    return start(reduce_call(input, output, count, dtype, op, root, opts));
  }
  // gather: every rank's count elements into root's output (size() blocks, rank order).
  void gather(const void* input, void* output, size_t count, DataType dtype, int root,
              const CollectiveOptions& opts = {}) {
    run(rooted_call(Op::gather, input, output, count, dtype, root, opts));
  }
  Request gather_async(const void* input, void* output, size_t count, DataType dtype, int root,
                       const CollectiveOptions& opts = {}) {
    return start(rooted_call(Op::gather, input, output, count, dtype, root, opts));
  }
  // gatherv: rank r's count elements land in root's output at blocks.displs[r];
  // `blocks` is read on the root only. In place when the rank's own block
  // already sits at its place in output.
  void gatherv(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype, int root,
               const CollectiveOptions& opts = {}) {
    run(gatherv_call(input, count, output, blocks, dtype, root, opts));
  }
  Request gatherv_async(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype, int root,
                        const CollectiveOptions& opts = {}) {
    return start(gatherv_call(input, count, output, blocks, dtype, root, opts));
  }
  // scatter: root's block r (count elements) into rank r's output.
  void scatter(const void* input, void* output, size_t count, DataType dtype, int root,
               const CollectiveOptions& opts = {}) {
    run(rooted_call(Op::scatter, input, output, count, dtype, root, opts));
  }
  Request scatter_async(const void* input, void* output, size_t count, DataType dtype, int root,
                        const CollectiveOptions& opts = {}) {
    return start(rooted_call(Op::scatter, input, output, count, dtype, root, opts));
  }
  // scatterv: root's block r reaches rank r's output; `blocks` is read on the
  // root only; `count` is this rank's share.
  void scatterv(const void* input, const Blocks& blocks, void* output, size_t count, DataType dtype, int root,
                const CollectiveOptions& opts = {}) {
    run(scatterv_call(input, blocks, output, count, dtype, root, opts));
  }
  Request scatterv_async(const void* input, const Blocks& blocks, void* output, size_t count, DataType dtype, int root,
                         const CollectiveOptions& opts = {}) {
    return start(scatterv_call(input, blocks, output, count, dtype, root, opts));
  }
  // allgatherv: every rank is a gatherv's root.
  void allgatherv(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype,
                  const CollectiveOptions& opts = {}) {
    run(allgatherv_call(input, count, output, blocks, dtype, opts));
  }
  Request allgatherv_async(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype,
                           const CollectiveOptions& opts = {}) {
    return start(allgatherv_call(input, count, output, blocks, dtype, opts));
  }
  // reduce_scatterv: input holds every rank's block (blocks.counts[r] elements
  // at blocks.displs[r]); rank r's output receives block r reduced over ranks.
  void reduce_scatterv(const void* input, void* output, const Blocks& blocks, DataType dtype, ReduceOp op,
                       const CollectiveOptions& opts = {}) {
    run(reduce_scatterv_call(input, output, blocks, dtype, op, opts));
  }
  Request reduce_scatterv_async(const void* input, void* output, const Blocks& blocks, DataType dtype, ReduceOp op,
                                const CollectiveOptions& opts = {}) {
    return start(reduce_scatterv_call(input, output, blocks, dtype, op, opts));
  }

  // ---- Point-to-point ------------------------------------------------------
  // Only the two ranks take part. Posted in issue order and then completed in
  // the background: an isend and an irecv between two ranks never wait for
  // each other, whatever order each rank issued them in. A large send may
  // complete only once its receive is posted (as MPI's rendezvous): do not
  // wait on a send before posting the receive the peer needs to go on. A
  // receive buffer must match the message's size exactly (else
  // CollectiveMismatch). Deadline, abort and dead-peer detection as for
  // collectives; a failure is sticky.
  void send(const void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0,
            const CollectiveOptions& opts = {}) {
    run(send_call(data, count, dtype, peer, tag, opts));
  }
  Request send_async(const void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0,
                     const CollectiveOptions& opts = {}) {
    return start(send_call(data, count, dtype, peer, tag, opts));
  }
  // Returns the source (the peer, or the sender when peer is kAnySource).
  int recv(void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0, const CollectiveOptions& opts = {}) {
    return run(recv_call(data, count, dtype, peer, tag, opts));
  }
  Request recv_async(void* data, size_t count, DataType dtype, int peer, uint32_t tag = 0,
                     const CollectiveOptions& opts = {}) {
    return start(recv_call(data, count, dtype, peer, tag, opts));
  }
  // Every op of the group posted at once, one Request for all (NCCL's
  // ncclGroupStart/End, torch's batch_isend_irecv).
  void group(const std::vector<P2POp>& ops, const CollectiveOptions& opts = {}) { run(group_call(ops, opts)); }
  Request group_async(const std::vector<P2POp>& ops, const CollectiveOptions& opts = {}) {
    return start(group_call(ops, opts));
  }

  // ---- Sub-communicators ---------------------------------------------------
  // MPI_Comm_split / ncclCommSplit: every rank calls it; ranks of one colour
  // form a communicator ordered by (key, rank here). kUndefinedColor: this
  // rank joins none and gets nullptr. Bootstraps through this communicator's
  // store (no new port); ranks of the new one on a host share memory as here.
  // The new communicator is independent: it may run collectives while this
  // one does (from other threads).
  std::unique_ptr<Communicator> split(int color, int key, const CollectiveOptions& opts = {});
  // The same ranks, a communicator of their own (MPI_Comm_dup).
  std::unique_ptr<Communicator> duplicate(const CollectiveOptions& opts = {});

  // ---- Membership after a failure (membership.cc) ---------------------------
  // MPIX_Comm_shrink / ncclCommShrink. Revokes this communicator (every rank's
  // calls on it fail with Revoked, so every survivor comes here), then the
  // ranks agree through the store on one set of members: every rank that calls
  // shrink() within the options' timeout and is not recorded as failed nor in
  // any caller's `exclude`. One rank writes the decision, once; every member
  // reads it, so no two survivors get communicators with different members.
  // The new communicator spans the members renumbered in this one's order,
  // bootstraps through the same store (no new port) under keys of its own,
  // and shares memory among the members on a host. Throws Excluded on a rank
  // left out (recorded failed — a stopped rank that woke —, named in
  // `exclude`, or too late), and on every rank when the members would be half
  // of this communicator or fewer: the other side of a partition may hold the
  // rest, and two jobs must not go on.
  struct Shrunk {
    std::unique_ptr<Communicator> comm;
    std::vector<int> members;  // this communicator's ranks, in the new one's order
  };
  Shrunk shrink(const std::vector<int>& exclude = {}, const CollectiveOptions& opts = {});

  // ncclCommGrow / MPI_Comm_connect-accept for a data-parallel job: every
  // member calls it at a point they choose (a step boundary), with the same
  // max_new; it admits the processes waiting to join (created with
  // CommOptions::join, e.g. replacements `tandem launch --elastic` starts),
  // up to max_new, through the store. With none waiting, comm is null and
  // nothing changes. Else the new communicator keeps the members' ranks and
  // gives the joiners the next ones, in the order they asked; this one stays
  // valid (grow does not revoke it). With nobody waiting it costs each
  // member two store round trips (and the first one two more). A joiner that dies before it is wired up fails the
  // members' grow at connect_timeout, this communicator still usable.
  struct Grown {
    std::unique_ptr<Communicator> comm;  // null: nobody was waiting
    int joined = 0;                      // ranks size()..size()+joined-1 of comm
  };
  Grown grow(int max_new = std::numeric_limits<int>::max(), const CollectiveOptions& opts = {});
  // How many processes wait to join (tickets no grow has claimed yet): one
  // store read on this rank alone, not collective. A training loop checks it
  // on one rank and shares the answer with its step (e.g. beside its
  // metrics), so that members call grow() only when someone waits. May count
  // a joiner that gave up until the next grow. From one thread at a time.
  int joiners_waiting(const CollectiveOptions& opts = {});
  // True when this communicator was made by a join (CommOptions::join).
  bool joined() const;

  // Host memory the other ranks on this host can map. When every rank's
  // buffers lie in it, all-reduces read and write each other's buffers
  // directly instead of copying through the shared segments (as NCCL's
  // registered buffers skip its staging); fusion buffers belong here.
  // Ordinary memory when the ranks cannot share memory. Page-aligned,
  // zero-filled, valid until free_shared() or the communicator's end.
  void* allocate_shared(size_t bytes);
  void free_shared(void* p);

  // Point-to-point messages for libraries built on comm (paramserver/): body
  // runs on the engine in issue order, like a collective, and talks through a
  // Channel, but only the ranks it addresses take part (no other rank calls
  // anything), its tags are its own across calls, and it is not counted among
  // the collectives. Deadline, abort and dead-rank detection as for collectives;
  // a failure is sticky. Body tags must stay clear of concurrent exchanges'.
  void exchange(std::function<void(Channel&)> body, const CollectiveOptions& opts = {});
  Request exchange_async(std::function<void(Channel&)> body, const CollectiveOptions& opts = {});

  // Unblocks every pending call on this communicator with Aborted; sticky.
  void abort(const std::string& reason = "abort() called");
  bool aborted() const;
  // abort() on every rank: this rank's calls fail with Revoked at once, every
  // other rank's pending and later calls once they wait, within a failure
  // poll (CommOptions::failure_poll), whether or not they wait on this rank.
  // For survivors that must all stop a call a failed rank will never join.
  void revoke(const std::string& reason = "revoke() called");
  // True once this rank revoked the communicator or a call of its found it revoked.
  bool revoked() const;

  // The UCX transports in use, e.g. "sysv/memory cma/memory" (for logs and
  // `tandem info`), plus "+ shared memory" when the ranks map each other's
  // segments (", cross-memory attach" when they may also copy by address).
  std::string transport_summary() const;

  // Bytes read plus bytes written by this communicator's shared-memory
  // collectives so far (copies, folds, cross-memory copies; counted by the
  // algorithms). `tandem bench` reports it per payload byte.
  uint64_t shared_memory_traffic() const;

  struct Impl;

 private:
  // A communicator over `members` (ranks here, in the new order), wired up
  // through this one's store under `prefix` (split.cc).
  std::unique_ptr<Communicator> over_members(const std::vector<int>& members, const std::string& prefix);
  // create() of a joining process: waits for a grow() and wires up with the members (grow.cc).
  static std::unique_ptr<Communicator> join(CommOptions options, std::shared_ptr<Algorithms> algorithms);
  // Each operation's Call, built once for its blocking and async forms.
  // allreduce and reduce_scatter: `count` elements reduced by `op`.
  static Call reducing_call(Op kind, const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                            const CollectiveOptions& opts) {
    return {
        .op = kind, .input = input, .output = output, .count = count, .dtype = dtype, .reduce = op, .options = opts};
  }
  static Call broadcast_call(const void* input, void* output, size_t count, DataType dtype, int root,
                             const CollectiveOptions& opts) {
    return {.op = Op::broadcast,
            .input = input,
            .output = output,
            .count = count,
            .dtype = dtype,
            .root = root,
            .options = opts};
  }
  static Call recv_call(void* data, size_t count, DataType dtype, int peer, uint32_t tag,
                        const CollectiveOptions& opts) {
    return {.op = Op::recv, .output = data, .count = count, .dtype = dtype, .peer = peer, .tag = tag, .options = opts};
  }
  // allgather and alltoall: blocks of `count` elements moved.
  static Call block_call(Op kind, const void* input, void* output, size_t count, DataType dtype,
                         const CollectiveOptions& opts) {
    return {.op = kind, .input = input, .output = output, .count = count, .dtype = dtype, .options = opts};
  }
  static Call alltoallv_call(const void* input, const Blocks& send, void* output, const Blocks& recv, DataType dtype,
                             const CollectiveOptions& opts) {
    return {.op = Op::alltoallv,
            .input = input,
            .output = output,
            .dtype = dtype,
            .send = send,
            .recv = recv,
            .options = opts};
  }
  static Call reduce_call(const void* input, void* output, size_t count, DataType dtype, ReduceOp op, int root,
                          const CollectiveOptions& opts) {
    return {.op = Op::reduce,
            .input = input,
            .output = output,
            .count = count,
            .dtype = dtype,
            .reduce = op,
            .root = root,
            .options = opts};
  }
  // gather and scatter: every rank's block to the root, or the root's blocks out.
  static Call rooted_call(Op op, const void* input, void* output, size_t count, DataType dtype, int root,
                          const CollectiveOptions& opts) {
    return {.op = op, .input = input, .output = output, .count = count, .dtype = dtype, .root = root, .options = opts};
  }
  static Call gatherv_call(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype,
                           int root, const CollectiveOptions& opts) {
    return {.op = Op::gatherv,
            .input = input,
            .output = output,
            .count = count,
            .dtype = dtype,
            .root = root,
            .recv = blocks,
            .options = opts};
  }
  static Call scatterv_call(const void* input, const Blocks& blocks, void* output, size_t count, DataType dtype,
                            int root, const CollectiveOptions& opts) {
    return {.op = Op::scatterv,
            .input = input,
            .output = output,
            .count = count,
            .dtype = dtype,
            .root = root,
            .send = blocks,
            .options = opts};
  }
  static Call allgatherv_call(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype,
                              const CollectiveOptions& opts) {
    return {.op = Op::allgatherv,
            .input = input,
            .output = output,
            .count = count,
            .dtype = dtype,
            .recv = blocks,
            .options = opts};
  }
  static Call reduce_scatterv_call(const void* input, void* output, const Blocks& blocks, DataType dtype, ReduceOp op,
                                   const CollectiveOptions& opts) {
    return {.op = Op::reduce_scatterv,
            .input = input,
            .output = output,
            .dtype = dtype,
            .reduce = op,
            .send = blocks,
            .options = opts};
  }
  static Call send_call(const void* data, size_t count, DataType dtype, int peer, uint32_t tag,
                        const CollectiveOptions& opts) {
    return {.op = Op::send, .input = data, .count = count, .dtype = dtype, .peer = peer, .tag = tag, .options = opts};
  }
  static Call group_call(const std::vector<P2POp>& ops, const CollectiveOptions& opts) {
    return {.op = Op::group, .group = ops, .options = opts};
  }

  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
