// Communicator::start and run: a Call checked, bound to its algorithm and
// queued or run. One binder per operation, in Op order (the table's rows in
// operations.cc say what each reads); point-to-point calls go to the engine's
// posted path instead.
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

void require_buffers(const char* what, const void* input, const void* output, size_t count) {
  if (count > 0 && (!input || !output)) {
    throw InvalidArgument(std::string(what) + ": null buffer with count " + std::to_string(count));
  }
}

// `out` = b with its displacements given (one per rank) or packed in rank
// order; `out` keeps its capacity, so a reused one allocates nothing.
void complete_into(Blocks& out, const char* what, const char* which, const BlockView& b, int size) {
  if (b.counts.size() != size_t(size) || (!b.displs.empty() && b.displs.size() != size_t(size))) {
    throw InvalidArgument(std::string(what) + ": " + which + " needs one count per rank (" + std::to_string(size) +
                          "; got " + std::to_string(b.counts.size()) + ") and no displacements or one per rank (got " +
                          std::to_string(b.displs.size()) + ")");
  }
  out.counts.assign(b.counts.begin(), b.counts.end());
  if (b.displs.empty()) {
    out.displs.resize(size_t(size));
    std::exclusive_scan(b.counts.begin(), b.counts.end(), out.displs.begin(), size_t(0));
  } else {
    out.displs.assign(b.displs.begin(), b.displs.end());
  }
}

// Every rank `count` elements, packed in rank order.
void equal_into(Blocks& out, size_t count, int size) {
  out.counts.assign(size_t(size), count);
  out.displs.resize(size_t(size));
  for (size_t p = 0; p < size_t(size); ++p) out.displs[p] = p * count;
}

size_t total(const Blocks& b) { return std::accumulate(b.counts.begin(), b.counts.end(), size_t(0)); }

using Body = std::function<void(Channel&)>;

// A checked call bound to its algorithm, and what it is for fingerprints and
// errors. Its arguments are the thread's reusable set (reusable()), so a
// blocking call on an idle communicator allocates nothing once warm.
struct Bound {
  Body here;                         // borrows the arguments: run at once, on this thread
  Body (*own)(Communicator::Impl&);  // a body with its own copy of them, to queue; call before binding again
  Description what;
};

// The arguments of the calls bound on this thread, one set per type, refilled
// by each call: their blocks keep their capacity.
template <typename Args>
Args& reusable() {
  thread_local Args args;
  return args;
}

template <auto Method, typename Args>
Bound bind(Communicator::Impl& impl, const Args& args, const Description& what) {
  // Two pointers: std::function holds them without allocating.
  Body here = [a = impl.algorithms.get(), p = &args](Channel& ch) { (a->*Method)(ch, *p); };
  auto own = [](Communicator::Impl& impl) -> Body {
    return [a = impl.algorithms, args = reusable<Args>()](Channel& ch) { ((*a).*Method)(ch, args); };
  };
  Bound b{std::move(here), own, {}};
  // Field by field: copied whole, `what` (built just before by narrow
  // stores) would be read back by wide loads, which wait for those stores to
  // land instead of taking their values from the store buffer.
  b.what.collective = what.collective, b.what.count = what.count, b.what.dtype = what.dtype;
  b.what.op = what.op, b.what.root = what.root, b.what.tag = what.tag;
  return b;
}

Bound allreduce(Communicator::Impl& impl, const Call& c) {
  require_buffers("allreduce", c.input, c.output, c.count);
  if (c.options.chunk_bytes != 0 && c.options.chunk_bytes < 4096) {
    throw InvalidArgument("allreduce: CollectiveOptions::chunk_bytes must be 0 (the communicator's) or >= 4096 (got " +
                          std::to_string(c.options.chunk_bytes) + ")");
  }
  auto& args = reusable<AllreduceArgs>();
  args = {c.input, c.output, c.count, c.dtype, c.reduce, impl.endpoints.memory_type(c.options), c.options.chunk_bytes};
  return bind<&Algorithms::allreduce>(impl, args, {Collective::allreduce, c.count, c.dtype, c.reduce});
}

Bound reduce_scatter(Communicator::Impl& impl, const Call& c) {
  require_buffers("reduce_scatter", c.input, c.output, c.count);
  auto& args = reusable<ReduceScatterArgs>();
  args = {c.input, c.output, c.count, c.dtype, c.reduce, impl.endpoints.memory_type(c.options)};
  return bind<&Algorithms::reduce_scatter>(impl, args, {Collective::reduce_scatter, c.count, c.dtype, c.reduce});
}

Bound allgather(Communicator::Impl& impl, const Call& c) {
  require_buffers("allgather", c.input, c.output, c.count);
  auto& args = reusable<AllgatherArgs>();
  args = {c.input, c.output, c.count, c.dtype, impl.endpoints.memory_type(c.options)};
  return bind<&Algorithms::allgather>(impl, args, {Collective::allgather, c.count, c.dtype, std::nullopt});
}

Bound broadcast(Communicator::Impl& impl, const Call& c) {
  check_root("broadcast", c.root, impl.ctx.size());
  if (c.count > 0 && (!c.output || (impl.ctx.rank() == c.root && !c.input))) {
    throw InvalidArgument("broadcast: null buffer with count " + std::to_string(c.count));
  }
  auto& args = reusable<BroadcastArgs>();
  args = {c.input, c.output, c.count, c.dtype, c.root, impl.endpoints.memory_type(c.options)};
  return bind<&Algorithms::broadcast>(impl, args, {Collective::broadcast, c.count, c.dtype, std::nullopt, c.root});
}

Bound barrier(Communicator::Impl& impl, const Call&) {
  auto own = [](Communicator::Impl& impl) -> Body { return [a = impl.algorithms](Channel& ch) { a->barrier(ch); }; };
  return {[a = impl.algorithms.get()](Channel& ch) { a->barrier(ch); },
          own,
          {Collective::barrier, 0, std::nullopt, std::nullopt}};
}

// An all-to-all's arguments filled in (blocks completed) and checked.
Description check_alltoallv(Communicator::Impl& impl, const Call& c, AlltoallvArgs& args) {
  const bool equal = c.op == Op::alltoall;
  const Collective kind = equal ? Collective::alltoall : Collective::alltoallv;
  const char* what = to_string(kind);
  const int n = impl.ctx.size();
  if (equal) {
    equal_into(args.send, c.count, n);
    equal_into(args.recv, c.count, n);
  } else {
    complete_into(args.send, what, "send", c.send, n);
    complete_into(args.recv, what, "recv", c.recv, n);
  }
  args.input = c.input, args.output = c.output, args.dtype = c.dtype, args.equal = equal;
  args.memory = impl.endpoints.memory_type(c.options);
  check_buffer(what, "input", args.input, total(args.send));
  check_buffer(what, "output", args.output, total(args.recv));
  return {kind, equal ? c.count : total(args.send), args.dtype, std::nullopt};
}

Bound alltoallv(Communicator::Impl& impl, const Call& c) {
  auto& args = reusable<AlltoallvArgs>();
  const Description what = check_alltoallv(impl, c, args);
  return bind<&Algorithms::alltoallv>(impl, args, what);
}

Bound reduce(Communicator::Impl& impl, const Call& c) {
  check_root("reduce", c.root, impl.ctx.size());
  check_buffer("reduce", "input", c.input, c.count);
  if (impl.ctx.rank() == c.root) check_buffer("reduce", "output", c.output, c.count);
  auto& args = reusable<ReduceArgs>();
  args = {c.input, c.output, c.count, c.dtype, c.reduce, c.root, impl.endpoints.memory_type(c.options)};
  return bind<&Algorithms::reduce>(impl, args, {Collective::reduce, c.count, c.dtype, c.reduce, c.root});
}

// gather(v), scatter(v), allgatherv. The blocks matter on the root only
// (every rank for the allgather); elsewhere they are left empty.
Bound variable(Communicator::Impl& impl, const Call& c) {
  const Collective kind = operation(c.op).collective;
  const char* what = to_string(kind);
  const int n = impl.ctx.size(), rank = impl.ctx.rank();
  const bool everyone = c.op == Op::allgatherv;
  const bool scatter = c.op == Op::scatter || c.op == Op::scatterv;
  const bool equal = c.op == Op::gather || c.op == Op::scatter;
  auto& args = reusable<VariableArgs>();
  Blocks blocks = std::move(args.blocks);  // its capacity kept; filled on the root (every rank: allgatherv)
  blocks.counts.clear(), blocks.displs.clear();
  args = {c.input, c.output, c.count, std::move(blocks), c.dtype, everyone ? 0 : c.root, c.options.memory, equal};
  if (!everyone) check_root(what, c.root, n);
  if (everyone || rank == c.root) {
    if (equal) {
      equal_into(args.blocks, c.count, n);
    } else {
      complete_into(args.blocks, what, "blocks", scatter ? c.send : c.recv, n);
    }
    check_buffer(what, scatter ? "input" : "output", scatter ? args.input : args.output, total(args.blocks));
    if (args.blocks.counts[size_t(rank)] != args.count) {
      throw InvalidArgument(std::string(what) + ": rank " + std::to_string(rank) + "'s own count " +
                            std::to_string(args.count) + " differs from its block's count " +
                            std::to_string(args.blocks.counts[size_t(rank)]));
    }
  }
  check_buffer(what, scatter ? "output" : "input", scatter ? args.output : args.input, args.count);
  args.memory = impl.endpoints.memory_type({std::nullopt, args.memory});
  const Description d{kind, args.count, args.dtype, std::nullopt, everyone ? -1 : args.root};
  if (scatter) return bind<&Algorithms::scatterv>(impl, args, d);
  if (everyone) return bind<&Algorithms::allgatherv>(impl, args, d);
  return bind<&Algorithms::gatherv>(impl, args, d);
}

Bound reduce_scatterv(Communicator::Impl& impl, const Call& c) {
  auto& args = reusable<ReduceScattervArgs>();
  complete_into(args.blocks, "reduce_scatterv", "blocks", c.send, impl.ctx.size());
  args.input = c.input, args.output = c.output, args.dtype = c.dtype, args.op = c.reduce;
  args.memory = impl.endpoints.memory_type(c.options);
  check_buffer("reduce_scatterv", "input", c.input, total(args.blocks));
  check_buffer("reduce_scatterv", "output", c.output, args.blocks.counts[size_t(impl.ctx.rank())]);
  return bind<&Algorithms::reduce_scatterv>(impl, args,
                                            {Collective::reduce_scatterv, total(args.blocks), c.dtype, c.reduce});
}

using Binder = Bound (*)(Communicator::Impl&, const Call&);

// The collectives' binders in Op order; point-to-point ops have none.
constexpr Binder kBinders[] = {allreduce, reduce_scatter, allgather, broadcast, barrier,  alltoallv, alltoallv,
                               reduce,    variable,       variable,  variable,  variable, variable,  reduce_scatterv};
static_assert(std::size(kBinders) == size_t(Op::send), "one binder per collective, in Op order");

bool point_to_point(Op op) { return op == Op::send || op == Op::recv || op == Op::group; }

// A send or recv as the one message of a group.
P2POp message(const Call& c) {
  if (c.op == Op::send) return {P2POp::send, const_cast<void*>(c.input), c.count, c.dtype, c.peer, c.tag};
  return {P2POp::recv, c.output, c.count, c.dtype, c.peer, c.tag};
}

}  // namespace

Request Communicator::start(const Call& call) {
  Engine& engine = impl_->engine;
  if (point_to_point(call.op)) {
    impl_->endpoints.note_buffers(call);
    if (call.op == Op::group) return engine.start_p2p(call.group, call.options);
    const P2POp one = message(call);
    return engine.start_p2p({&one, 1}, call.options);
  }
  const Bound b = kBinders[size_t(call.op)](*impl_, call);
  impl_->endpoints.note_buffers(call);
  return engine.submit(true, b.own(*impl_), call.options, b.what);
}

int Communicator::run(const Call& call) {
  Engine& engine = impl_->engine;
  if (point_to_point(call.op)) {
    impl_->endpoints.note_buffers(call);
    if (call.op == Op::group) return engine.run_p2p(call.group.data(), call.group.size(), call.options);
    const P2POp one = message(call);
    return engine.run_p2p(&one, 1, call.options);
  }
  Bound b = kBinders[size_t(call.op)](*impl_, call);
  impl_->endpoints.note_buffers(call);
  if (!engine.try_run_here(b.here, call.options, b.what)) engine.run_blocking(b.own(*impl_), call.options, b.what);
  return -1;
}

}  // namespace tandem
