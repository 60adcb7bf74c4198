// The table of operations (tandem/call.h): one row each, read by the
// communicator's start(), the C API, the Python package, the torch backend
// and `tandem bench`; and what a call's buffers span, from its row.
#include <algorithm>
#include <numeric>
#include <string>

#include "tandem/call.h"
#include "tandem/errors.h"

namespace tandem {
namespace {

using enum Extent;
constexpr Holder all = Holder::every_rank, root = Holder::root_only;
constexpr uint16_t kBuffers = kFieldInput | kFieldOutput | kFieldCount;

constexpr OpInfo kOperations[] = {
    {Op::allreduce, "allreduce", Collective::allreduce, kBuffers | kFieldReduce, count, count, all, all, true,
     "tensor op='sum' out=None", "every rank's input reduced into every rank's output"},
    {Op::reduce_scatter, "reduce_scatter", Collective::reduce_scatter, kBuffers | kFieldReduce, count_per_rank, count,
     all, all, false, "tensor out op='sum'", "block r of the inputs reduced into rank r's output"},
    {Op::allgather, "allgather", Collective::allgather, kBuffers, count, count_per_rank, all, all, false, "tensor out",
     "every rank's input into every rank's output, rank order"},
    {Op::broadcast, "broadcast", Collective::broadcast, kBuffers | kFieldRoot, count, count, root, all, true,
     "tensor root=0", "the root's input into every rank's output"},
    {Op::barrier, "barrier", Collective::barrier, 0, none, none, all, all, false, "",
     "returns once every rank has entered it"},
    {Op::alltoall, "alltoall", Collective::alltoall, kBuffers, count_per_rank, count_per_rank, all, all, false,
     "tensor out", "block p of the input to rank p, block p of the output from it"},
    {Op::alltoallv, "alltoallv", Collective::alltoallv, kFieldInput | kFieldOutput | kFieldSend | kFieldRecv,
     send_blocks, recv_blocks, all, all, false, "tensor out send_counts recv_counts send_displs=None recv_displs=None",
     "send block p of the input to rank p, recv block p of the output from it"},
    {Op::reduce, "reduce", Collective::reduce, kBuffers | kFieldReduce | kFieldRoot, count, count, all, root, true,
     "tensor root=0 op='sum' out=None", "every rank's input reduced into the root's output"},
    {Op::gather, "gather", Collective::gather, kBuffers | kFieldRoot, count, count_per_rank, all, root, false,
     "tensor out=None root=0", "every rank's input into the root's output, rank order"},
    {Op::gatherv, "gatherv", Collective::gatherv, kBuffers | kFieldRoot | kFieldRecv, count, recv_blocks, all, root,
     false, "tensor out=None counts=None displs=None root=0", "rank r's input into recv block r of the root's output"},
    {Op::scatter, "scatter", Collective::scatter, kBuffers | kFieldRoot, count_per_rank, count, root, all, false,
     "tensor out root=0", "block r of the root's input into rank r's output"},
    {Op::scatterv, "scatterv", Collective::scatterv, kBuffers | kFieldRoot | kFieldSend, send_blocks, count, root, all,
     false, "tensor out counts=None displs=None root=0", "send block r of the root's input into rank r's output"},
    {Op::allgatherv, "allgatherv", Collective::allgatherv, kBuffers | kFieldRecv, count, recv_blocks, all, all, false,
     "tensor out counts displs=None", "rank r's input into recv block r of every rank's output"},
    {Op::reduce_scatterv, "reduce_scatterv", Collective::reduce_scatterv,
     kFieldInput | kFieldOutput | kFieldReduce | kFieldSend, send_blocks, own_send_block, all, all, false,
     "tensor out counts displs=None op='sum'", "send block r of the inputs reduced into rank r's output"},
    {Op::send, "send", Collective::send_recv, kFieldInput | kFieldCount | kFieldPeer | kFieldTag, count, none, all, all,
     false, "tensor peer tag=0", "the input to one peer, under a tag"},
    {Op::recv, "recv", Collective::send_recv, kFieldOutput | kFieldCount | kFieldPeer | kFieldTag, none, count, all,
     all, false, "tensor peer=-1 tag=0", "one message from a peer (or any source) into the output"},
    {Op::group, "group", Collective::send_recv, kFieldGroup, none, none, all, all, false, "ops",
     "sends and receives posted at once, one request for all"},
};

constexpr bool in_op_order() {
  for (size_t i = 0; i < std::size(kOperations); ++i) {
    if (size_t(kOperations[i].op) != i) return false;
  }
  return true;
}
static_assert(in_op_order(), "kOperations lists the operations in Op order");
static_assert(std::size(kOperations) == size_t(Op::group) + 1, "one row per Op");

// As far as the blocks reach: the sum of the counts when packed, else the
// furthest end of a non-empty block.
size_t span_of(const BlockView& b) {
  if (b.displs.empty()) return std::accumulate(b.counts.begin(), b.counts.end(), size_t(0));
  size_t end = 0;
  for (size_t i = 0; i < b.counts.size() && i < b.displs.size(); ++i) {
    if (b.counts[i]) end = std::max(end, b.displs[i] + b.counts[i]);
  }
  return end;
}

size_t extent(Extent e, Holder holder, const Call& call, int rank, int size) {
  if (holder == Holder::root_only && rank != call.root) return 0;
  switch (e) {
    case none: return 0;
    case count: return call.count;
    case count_per_rank: return call.count * size_t(size);
    case send_blocks: return span_of(call.send);
    case recv_blocks: return span_of(call.recv);
    case own_send_block: return size_t(rank) < call.send.counts.size() ? call.send.counts[size_t(rank)] : 0;
  }
  return 0;
}

}  // namespace

std::span<const OpInfo> operations() { return kOperations; }

const OpInfo& operation(Op op) { return kOperations[size_t(op)]; }

const OpInfo* find_operation(std::string_view name) {
  for (const OpInfo& o : kOperations) {
    if (name == o.name) return &o;
  }
  return nullptr;
}

size_t input_extent(const Call& call, int rank, int size) {
  const OpInfo& o = operation(call.op);
  return extent(o.input, o.input_holder, call, rank, size);
}

size_t output_extent(const Call& call, int rank, int size) {
  const OpInfo& o = operation(call.op);
  return extent(o.output, o.output_holder, call, rank, size);
}

void fit_count(Call& call, size_t input_elements, size_t output_elements, int rank, int size) {
  const OpInfo& o = operation(call.op);
  const bool has_input = o.input_holder == Holder::every_rank || rank == call.root;
  const bool has_output = o.output_holder == Holder::every_rank || rank == call.root;
  // The count comes from a buffer every rank holds: one block of it, or size() blocks.
  if (o.fields & kFieldCount) {
    if (o.input == count && o.input_holder == Holder::every_rank) {
      call.count = input_elements;
    } else if (o.output == count && o.output_holder == Holder::every_rank) {
      call.count = output_elements;
    } else if (o.input == count_per_rank && o.input_holder == Holder::every_rank) {
      call.count = input_elements / size_t(size);
    }
  }
  const auto check = [&](const char* which, Extent e, bool held, size_t have, size_t need) {
    if (!held || e == none) return;
    const bool blocks = e == send_blocks || e == recv_blocks || e == own_send_block;
    if (blocks ? have >= need : have == need) return;
    std::string why = blocks                ? "the blocks span " + std::to_string(need)
                      : e == count_per_rank ? "not size (" + std::to_string(size) + ") x " + std::to_string(call.count)
                                            : "not " + std::to_string(need);
    throw InvalidArgument(std::string(o.name) + ": " + which + " has " + std::to_string(have) + " elements, " + why);
  };
  check("input", o.input, has_input, input_elements, input_extent(call, rank, size));
  check("output", o.output, has_output, output_elements, output_extent(call, rank, size));
}

}  // namespace tandem
