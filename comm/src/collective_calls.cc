// The API of the all-to-all, rooted and variable-size collectives: argument
// checks, then the algorithm (ring/) bound to the arguments, queued or run now.
#include <numeric>

#include "communicator_impl.h"

namespace tandem {
namespace {

void check_root(const char* what, int root, int size) {
  if (root < 0 || root >= size) {
    throw InvalidArgument(std::string(what) + ": root " + std::to_string(root) + " is out of range for world size " +
                          std::to_string(size));
  }
}

void check_buffer(const char* what, const char* which, const void* p, size_t count) {
  if (count > 0 && !p)
    throw InvalidArgument(std::string(what) + ": null " + which + " buffer with count " + std::to_string(count));
}

void check_blocks(const char* what, const char* which, const Blocks& b, int size) {
  if (b.counts.size() != size_t(size) || (!b.displs.empty() && b.displs.size() != size_t(size))) {
    throw InvalidArgument(std::string(what) + ": " + which + " needs one count per rank (" + std::to_string(size) +
                          "; got " + std::to_string(b.counts.size()) + ") and no displacements or one per rank (got " +
                          std::to_string(b.displs.size()) + ")");
  }
}

// `out` = b with its displacements given (one per rank) or packed in rank
// order; `out` keeps its capacity, so a reused one allocates nothing.
void complete_into(Blocks& out, const char* what, const char* which, const Blocks& b, int size) {
  check_blocks(what, which, b, size);
  out.counts.assign(b.counts.begin(), b.counts.end());
  if (b.displs.empty()) {
    out.displs.resize(size_t(size));
    std::exclusive_scan(b.counts.begin(), b.counts.end(), out.displs.begin(), size_t(0));
  } else {
    out.displs.assign(b.displs.begin(), b.displs.end());
  }
}

Blocks complete(const char* what, const char* which, const Blocks& b, int size) {
  Blocks out;
  complete_into(out, what, which, b, size);
  return out;
}

// Every rank `count` elements, packed in rank order.
void equal_into(Blocks& out, size_t count, int size) {
  out.counts.assign(size_t(size), count);
  out.displs.resize(size_t(size));
  for (size_t p = 0; p < size_t(size); ++p) out.displs[p] = p * count;
}

Blocks equal(size_t count, int size) { return {std::vector<size_t>(size_t(size), count), {}}; }

size_t total(const Blocks& b) { return std::accumulate(b.counts.begin(), b.counts.end(), size_t(0)); }

// A checked call bound to its algorithm, and what it is for fingerprints and errors.
struct Bound {
  std::function<void(Channel&)> body;
  Description what;
};

// An all-to-all's arguments checked; what it is for fingerprints and errors.
Description check_alltoallv(Collective kind, const AlltoallvArgs& args) {
  const char* what = to_string(kind);
  check_buffer(what, "input", args.input, total(args.send));
  check_buffer(what, "output", args.output, total(args.recv));
  const size_t count = kind == Collective::alltoall ? args.send.counts[0] : total(args.send);
  return {kind, count, args.dtype, std::nullopt};
}

// A blocking all-to-all's arguments but its blocks (the caller fills those),
// reused call after call on this thread: the blocks keep their capacity, so
// the steady path allocates nothing.
AlltoallvArgs& reused_alltoallv_args(Communicator::Impl& impl, const void* input, void* output, DataType dtype,
                                     const CollectiveOptions& opts, bool equal) {
  thread_local AlltoallvArgs args;
  args.input = input;
  args.output = output;
  args.dtype = dtype;
  args.memory = impl.endpoints.memory_type(opts);
  args.equal = equal;
  return args;
}

// A blocking all-to-all (args filled in): on this thread, borrowing `args`,
// when the communicator is idle; else queued with its own copy.
void run_alltoallv(Communicator::Impl& impl, const AlltoallvArgs& args, const CollectiveOptions& opts) {
  const Description what = check_alltoallv(args.equal ? Collective::alltoall : Collective::alltoallv, args);
  // Two pointers: std::function holds them without allocating.
  std::function<void(Channel&)> borrowed = [a = impl.algorithms.get(), &args](Channel& ch) { a->alltoallv(ch, args); };
  if (impl.engine.try_run_here(borrowed, opts, what)) return;
  impl.engine.run_blocking([a = impl.algorithms, args](Channel& ch) { a->alltoallv(ch, args); }, opts, what);
}

Bound alltoallv_call(Communicator::Impl& impl, Collective kind, const void* input, const Blocks& send, void* output,
                     const Blocks& recv, DataType dtype, const CollectiveOptions& opts) {
  const char* what = to_string(kind);
  const int n = impl.ctx.opts.size;
  AlltoallvArgs args{input,
                     output,
                     complete(what, "send", send, n),
                     complete(what, "recv", recv, n),
                     dtype,
                     impl.endpoints.memory_type(opts),
                     kind == Collective::alltoall};
  const Description d = check_alltoallv(kind, args);
  return {[a = impl.algorithms, args](Channel& ch) { a->alltoallv(ch, args); }, d};
}

Bound reduce_call(Communicator::Impl& impl, const ReduceArgs& args) {
  check_root("reduce", args.root, impl.ctx.opts.size);
  check_buffer("reduce", "input", args.input, args.count);
  if (impl.ctx.opts.rank == args.root) check_buffer("reduce", "output", args.output, args.count);
  return {[a = impl.algorithms, args](Channel& ch) { a->reduce(ch, args); },
          {Collective::reduce, args.count, args.dtype, args.op, args.root}};
}

// gather(v), scatter(v), allgatherv. `blocks` matter on the root only (every
// rank for the allgather); elsewhere they are left empty.
Bound variable_call(Communicator::Impl& impl, Collective kind, VariableArgs args) {
  const char* what = to_string(kind);
  const int n = impl.ctx.opts.size, rank = impl.ctx.opts.rank;
  const bool everyone = kind == Collective::allgatherv;
  const bool scatter = kind == Collective::scatter || kind == Collective::scatterv;
  if (!everyone) check_root(what, args.root, n);
  if (everyone || rank == args.root) {
    args.blocks = complete(what, "blocks", args.blocks, n);
    check_buffer(what, scatter ? "input" : "output", scatter ? args.input : args.output, total(args.blocks));
    if (args.blocks.counts[size_t(rank)] != args.count) {
      throw InvalidArgument(std::string(what) + ": rank " + std::to_string(rank) + "'s own count " +
                            std::to_string(args.count) + " differs from its block's count " +
                            std::to_string(args.blocks.counts[size_t(rank)]));
    }
  } else {
    args.blocks = {};
  }
  check_buffer(what, scatter ? "output" : "input", scatter ? args.output : args.input, args.count);
  args.memory = impl.endpoints.memory_type({std::nullopt, args.memory});
  const Description d{kind, args.count, args.dtype, std::nullopt, everyone ? -1 : args.root};
  if (scatter) return {[a = impl.algorithms, args](Channel& ch) { a->scatterv(ch, args); }, d};
  if (everyone) return {[a = impl.algorithms, args](Channel& ch) { a->allgatherv(ch, args); }, d};
  return {[a = impl.algorithms, args](Channel& ch) { a->gatherv(ch, args); }, d};
}

Bound reduce_scatterv_call(Communicator::Impl& impl, const void* input, void* output, const Blocks& blocks,
                           DataType dtype, ReduceOp op, const CollectiveOptions& opts) {
  ReduceScattervArgs args{input, output, complete("reduce_scatterv", "blocks", blocks, impl.ctx.opts.size),
                          dtype, op,     impl.endpoints.memory_type(opts)};
  check_buffer("reduce_scatterv", "input", input, total(args.blocks));
  check_buffer("reduce_scatterv", "output", output, args.blocks.counts[size_t(impl.ctx.opts.rank)]);
  return {[a = impl.algorithms, args](Channel& ch) { a->reduce_scatterv(ch, args); },
          {Collective::reduce_scatterv, total(args.blocks), dtype, op}};
}

Request run(Communicator::Impl& impl, bool async, Bound call, const CollectiveOptions& opts) {
  return impl.engine.submit(async, std::move(call.body), opts, call.what);
}

}  // namespace

Request Communicator::alltoall_async(const void* input, void* output, size_t count, DataType dtype,
                                     const CollectiveOptions& opts) {
  const Blocks b = equal(count, size());
  return run(*impl_, true, alltoallv_call(*impl_, Collective::alltoall, input, b, output, b, dtype, opts), opts);
}

void Communicator::alltoall(const void* input, void* output, size_t count, DataType dtype,
                            const CollectiveOptions& opts) {
  AlltoallvArgs& args = reused_alltoallv_args(*impl_, input, output, dtype, opts, true);
  equal_into(args.send, count, size());
  equal_into(args.recv, count, size());
  run_alltoallv(*impl_, args, opts);
}

Request Communicator::alltoallv_async(const void* input, const Blocks& send, void* output, const Blocks& recv,
                                      DataType dtype, const CollectiveOptions& opts) {
  return run(*impl_, true, alltoallv_call(*impl_, Collective::alltoallv, input, send, output, recv, dtype, opts), opts);
}

void Communicator::alltoallv(const void* input, const Blocks& send, void* output, const Blocks& recv, DataType dtype,
                             const CollectiveOptions& opts) {
  AlltoallvArgs& args = reused_alltoallv_args(*impl_, input, output, dtype, opts, false);
  complete_into(args.send, "alltoallv", "send", send, size());
  complete_into(args.recv, "alltoallv", "recv", recv, size());
  run_alltoallv(*impl_, args, opts);
}

Request Communicator::reduce_async(const void* input, void* output, size_t count, DataType dtype, ReduceOp op, int root,
                                   const CollectiveOptions& opts) {
  return run(*impl_, true,
             reduce_call(*impl_, {input, output, count, dtype, op, root, impl_->endpoints.memory_type(opts)}), opts);
}

void Communicator::reduce(const void* input, void* output, size_t count, DataType dtype, ReduceOp op, int root,
                          const CollectiveOptions& opts) {
  run(*impl_, false, reduce_call(*impl_, {input, output, count, dtype, op, root, impl_->endpoints.memory_type(opts)}),
      opts);
}

Request Communicator::gather_async(const void* input, void* output, size_t count, DataType dtype, int root,
                                   const CollectiveOptions& opts) {
  const VariableArgs args{input, output, count, equal(count, size()), dtype, root, opts.memory};
  return run(*impl_, true, variable_call(*impl_, Collective::gather, args), opts);
}

void Communicator::gather(const void* input, void* output, size_t count, DataType dtype, int root,
                          const CollectiveOptions& opts) {
  const VariableArgs args{input, output, count, equal(count, size()), dtype, root, opts.memory};
  run(*impl_, false, variable_call(*impl_, Collective::gather, args), opts);
}

Request Communicator::gatherv_async(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype,
                                    int root, const CollectiveOptions& opts) {
  return run(*impl_, true,
             variable_call(*impl_, Collective::gatherv, {input, output, count, blocks, dtype, root, opts.memory}),
             opts);
}

void Communicator::gatherv(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype,
                           int root, const CollectiveOptions& opts) {
  run(*impl_, false,
      variable_call(*impl_, Collective::gatherv, {input, output, count, blocks, dtype, root, opts.memory}), opts);
}

Request Communicator::scatter_async(const void* input, void* output, size_t count, DataType dtype, int root,
                                    const CollectiveOptions& opts) {
  const VariableArgs args{input, output, count, equal(count, size()), dtype, root, opts.memory};
  return run(*impl_, true, variable_call(*impl_, Collective::scatter, args), opts);
}

void Communicator::scatter(const void* input, void* output, size_t count, DataType dtype, int root,
                           const CollectiveOptions& opts) {
  const VariableArgs args{input, output, count, equal(count, size()), dtype, root, opts.memory};
  run(*impl_, false, variable_call(*impl_, Collective::scatter, args), opts);
}

Request Communicator::scatterv_async(const void* input, const Blocks& blocks, void* output, size_t count,
                                     DataType dtype, int root, const CollectiveOptions& opts) {
  return run(*impl_, true,
             variable_call(*impl_, Collective::scatterv, {input, output, count, blocks, dtype, root, opts.memory}),
             opts);
}

void Communicator::scatterv(const void* input, const Blocks& blocks, void* output, size_t count, DataType dtype,
                            int root, const CollectiveOptions& opts) {
  run(*impl_, false,
      variable_call(*impl_, Collective::scatterv, {input, output, count, blocks, dtype, root, opts.memory}), opts);
}

Request Communicator::allgatherv_async(const void* input, size_t count, void* output, const Blocks& blocks,
                                       DataType dtype, const CollectiveOptions& opts) {
  return run(*impl_, true,
             variable_call(*impl_, Collective::allgatherv, {input, output, count, blocks, dtype, 0, opts.memory}),
             opts);
}

void Communicator::allgatherv(const void* input, size_t count, void* output, const Blocks& blocks, DataType dtype,
                              const CollectiveOptions& opts) {
  run(*impl_, false,
      variable_call(*impl_, Collective::allgatherv, {input, output, count, blocks, dtype, 0, opts.memory}), opts);
}

Request Communicator::reduce_scatterv_async(const void* input, void* output, const Blocks& blocks, DataType dtype,
                                            ReduceOp op, const CollectiveOptions& opts) {
  return run(*impl_, true, reduce_scatterv_call(*impl_, input, output, blocks, dtype, op, opts), opts);
}

void Communicator::reduce_scatterv(const void* input, void* output, const Blocks& blocks, DataType dtype, ReduceOp op,
                                   const CollectiveOptions& opts) {
  run(*impl_, false, reduce_scatterv_call(*impl_, input, output, blocks, dtype, op, opts), opts);
}

}  // namespace tandem
