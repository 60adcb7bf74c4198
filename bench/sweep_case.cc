// The tests of `tandem bench`, one row each, and the Case that runs one of
// them. Sizes, counts and bus factors follow nccl-tests (src/*.cu and
// doc/PERFORMANCE.md): the size is a rank's largest buffer, the count column
// the elements each rank contributes or receives per call.
#include "sweep_case.h"

#include <cstring>

#include "tandem/bench/check.h"
#include "tandem/errors.h"

namespace tandem::bench {
namespace {

void allreduce(Communicator& c, const Call& a) { c.allreduce(a.src, a.dst, a.count, a.dtype, a.op); }
void reduce_scatter(Communicator& c, const Call& a) { c.reduce_scatter(a.src, a.dst, a.count, a.dtype, a.op); }
void allgather(Communicator& c, const Call& a) { c.allgather(a.src, a.dst, a.count, a.dtype); }
void broadcast(Communicator& c, const Call& a) { c.broadcast(a.src, a.dst, a.count, a.dtype, a.root); }
void barrier(Communicator& c, const Call&) { c.barrier(); }
void reduce(Communicator& c, const Call& a) { c.reduce(a.src, a.dst, a.count, a.dtype, a.op, a.root); }
void alltoall(Communicator& c, const Call& a) { c.alltoall(a.src, a.dst, a.count, a.dtype); }
void gather(Communicator& c, const Call& a) { c.gather(a.src, a.dst, a.count, a.dtype, a.root); }
void scatter(Communicator& c, const Call& a) { c.scatter(a.src, a.dst, a.count, a.dtype, a.root); }
void sendrecv(Communicator& c, const Call& a) { c.group(*a.ring); }

using C = Collective;
// name, collective, bus factor, root, splits input, gathers output, reduces, in place, call
const Spec kSpecs[] = {
    {"allreduce", C::allreduce, Bus::twice_ring, Root::none, false, false, true, true, allreduce},
    {"reduce_scatter", C::reduce_scatter, Bus::ring, Root::none, true, false, true, true, reduce_scatter},
    {"allgather", C::allgather, Bus::ring, Root::none, false, true, false, true, allgather},
    {"broadcast", C::broadcast, Bus::one, Root::sends, false, false, false, true, broadcast},
    {"barrier", C::barrier, Bus::none, Root::none, false, false, false, false, barrier},
    {"reduce", C::reduce, Bus::one, Root::receives, false, false, true, true, reduce},
    {"alltoall", C::alltoall, Bus::ring, Root::none, true, true, false, true, alltoall},
    {"gather", C::gather, Bus::ring, Root::receives, false, true, false, true, gather},
    {"scatter", C::scatter, Bus::ring, Root::sends, true, false, false, true, scatter},
    // nccl-tests' spelling (Collective::send_recv prints "send_recv"): a ring, r sends to r+1, receives from r-1.
    {"sendrecv", C::send_recv, Bus::one, Root::none, false, false, false, false, sendrecv},
};

// --compress inputs: gradient-like values in [-1, 1] of mixed magnitudes.
float gradient_value(int rank, size_t i) {
  const uint32_t h = static_cast<uint32_t>((rank + 1) * 2654435761u) ^ static_cast<uint32_t>(i * 40503u + 7);
  const float magnitude[] = {1.0f, 0.1f, 1e-3f, 1e-5f};
  return float(int(h % 20001) - 10000) / 10000.0f * magnitude[(h >> 16) % 4];
}

}  // namespace

double bus_factor(Bus bus, int n) {
  switch (bus) {
    case Bus::none: return 0.0;  // moves no data
    case Bus::one: return 1.0;
    case Bus::ring: return double(n - 1) / n;
    case Bus::twice_ring: return 2.0 * (n - 1) / n;
  }
  return 1.0;
}

std::vector<std::string> sweep_collectives() {
  std::vector<std::string> names;
  for (const Spec& s : kSpecs) names.emplace_back(s.name);
  return names;
}

const Spec& spec_of(const std::string& name) {
  std::string available;
  for (const Spec& s : kSpecs) {
    if (name == s.name) return s;
    available += (available.empty() ? "" : ", ") + std::string(s.name);
  }
  throw InvalidArgument("tandem bench: unknown collective '" + name + "'; available: " + available);
}

Case::Case(Communicator& comm, const SweepOptions& o, size_t count, bool inplace, char* in, char* out,
           compression::CompressedAllreduce* compressed)
    : comm_(comm),
      spec_(spec_of(o.collective)),
      n_(comm.size()),
      r_(comm.rank()),
      block_(count * dtype_size(o.dtype)),
      call_{in, out, count, o.dtype, o.op, o.root, &ring_},
      compressed_(compressed) {
  if (inplace) {
    const bool own_input = spec_.gathers_output && !spec_.splits_input;
    const bool own_output = spec_.splits_input && !spec_.gathers_output;
    call_.src = in + (own_input ? r_ * block_ : 0);
    call_.dst = in + (own_output ? r_ * block_ : 0);
  }
  if (spec_.collective == Collective::send_recv) {
    ring_ = {P2POp{P2POp::send, call_.src, count, o.dtype, (r_ + 1) % n_, 0},
             P2POp{P2POp::recv, call_.dst, count, o.dtype, (r_ - 1 + n_) % n_, 0}};
  }
}

void Case::fill_for_check() {
  std::memset(call_.dst, 0xab, (spec_.gathers_output ? n_ : 1) * block_);
  fill();
}

void Case::fill() {
  const DataType t = call_.dtype;
  if (compressed_) {
    for (size_t i = 0; i < call_.count; ++i) reinterpret_cast<float*>(call_.src)[i] = gradient_value(r_, i);
    return;
  }
  if (!spec_.moves_data() || (spec_.root == Root::sends && r_ != call_.root)) return;
  const size_t elements = call_.count * (spec_.splits_input ? n_ : 1);
  for (size_t g = 0; g < elements; ++g) {
    store_element(t, call_.src, g, spec_.reduces ? input_value(call_.op, t, r_, g) : moved_value(r_, g));
  }
}

void Case::run() {
  if (!compressed_) return spec_.run(comm_, call_);
  if (call_.src != call_.dst) std::memcpy(call_.dst, call_.src, block_);
  compressed_->allreduce(reinterpret_cast<float*>(call_.dst), call_.count, call_.op);
}

long Case::wrong() const {
  if (!spec_.moves_data() || (spec_.root == Root::receives && r_ != call_.root)) return 0;
  const DataType t = call_.dtype;
  const size_t first = spec_.splits_input ? r_ * call_.count : 0;  // where this rank's block starts in the pattern
  if (spec_.reduces) return count_wrong(call_.op, t, n_, call_.dst, call_.count, first);
  long wrong = 0;
  for (int b = 0; b < (spec_.gathers_output ? n_ : 1); ++b) {
    // Block b came from rank b, else from the root, else (sendrecv) from the previous rank.
    const int from = spec_.gathers_output ? b : spec_.rooted() ? call_.root : (r_ - 1 + n_) % n_;
    wrong += count_wrong_moved(t, from, call_.dst + b * block_, call_.count, first);
  }
  return wrong;
}

}  // namespace tandem::bench
