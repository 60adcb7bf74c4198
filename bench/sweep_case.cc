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

// op, bus factor, root, splits input, gathers output, reduces, in place, nccl-tests' name
const Spec kSpecs[] = {
    {Op::allreduce, Bus::twice_ring, Root::none, false, false, true, true},
    {Op::reduce_scatter, Bus::ring, Root::none, true, false, true, true},
    {Op::allgather, Bus::ring, Root::none, false, true, false, true},
    {Op::broadcast, Bus::one, Root::sends, false, false, false, true},
    {Op::barrier, Bus::none, Root::none, false, false, false, false},
    {Op::reduce, Bus::one, Root::receives, false, false, true, true},
    {Op::alltoall, Bus::ring, Root::none, true, true, false, true},
    // Blocks of varied sizes (varied_blocks), packed both ways: no in-place form.
    {Op::alltoallv, Bus::ring, Root::none, true, true, false, false},
    {Op::gather, Bus::ring, Root::receives, false, true, false, true},
    {Op::scatter, Bus::ring, Root::sends, true, false, false, true},
    // The variable-size forms with equal blocks: what they cost over their fixed-size twins.
    {Op::allgatherv, Bus::ring, Root::none, false, true, false, true},
    {Op::reduce_scatterv, Bus::ring, Root::none, true, false, true, true},
    // A ring, r sends to r+1 and receives from r-1, as one group.
    {Op::group, Bus::one, Root::none, false, false, false, false, "sendrecv", Peers::ring},
    // nccl-tests' hypercube_perf: an all-gather by pairwise exchanges (power-of-two ranks).
    {Op::group, Bus::ring, Root::none, false, true, false, true, "hypercube", Peers::hypercube},
};

// nccl-tests' names that differ from tandem's beyond the _perf suffix.
const std::pair<const char*, const char*> kAliases[] = {{"all_reduce", "allreduce"}, {"all_gather", "allgather"}};

// alltoallv's block from rank r to rank p: count * 2(1 + (r + p) mod n) / (n + 1)
// elements, from about 2/n to about twice count, each rank's n blocks adding
// up to at most n * count (the buffers nccl-tests' size names).
size_t varied_count(size_t count, int r, int p, int n) { return count * 2 * size_t(1 + (r + p) % n) / size_t(n + 1); }

// Rank r's send (to_peers) or receive blocks, packed in rank order.
Blocks varied_blocks(size_t count, int r, int n, bool to_peers) {
  Blocks b;
  size_t at = 0;
  for (int p = 0; p < n; ++p) {
    b.counts.push_back(to_peers ? varied_count(count, r, p, n) : varied_count(count, p, r, n));
    b.displs.push_back(at);
    at += b.counts.back();
  }
  return b;
}

// `count` elements from every rank, packed in rank order.
Blocks equal_blocks(size_t count, int n) {
  Blocks b;
  for (int p = 0; p < n; ++p) b.counts.push_back(count), b.displs.push_back(size_t(p) * count);
  return b;
}

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
  for (const Spec& s : kSpecs) names.emplace_back(s.name());
  return names;
}

const Spec& spec_of(const std::string& name) {
  std::string available;
  for (const Spec& s : kSpecs) {
    if (name == s.name()) return s;
    available += (available.empty() ? "" : ", ") + std::string(s.name());
  }
  throw InvalidArgument("tandem bench: unknown collective '" + name + "'; available: " + available +
                        " (or nccl-tests' names: all_reduce_perf, all_gather, ...)");
}

std::string canonical_collective(const std::string& name) {
  std::string stem = name;
  if (stem.size() > 5 && stem.ends_with("_perf")) stem.resize(stem.size() - 5);
  for (const auto& [alias, own] : kAliases) {
    if (stem == alias) stem = own;
  }
  try {
    return spec_of(stem).name();
  } catch (const InvalidArgument&) {
    spec_of(name);  // the error names what was typed
    throw;
  }
}

Case::Case(Communicator& comm, const SweepOptions& o, size_t count, bool inplace, char* in, char* out,
           compression::CompressedAllreduce* compressed)
    : comm_(comm),
      spec_(spec_of(o.collective)),
      n_(comm.size()),
      r_(comm.rank()),
      block_(count * dtype_size(o.dtype)),
      call_{
          .op = spec_.op, .input = in, .output = out, .count = count, .dtype = o.dtype, .reduce = o.op, .root = o.root},
      compressed_(compressed) {
  if (inplace) {
    const bool own_input = spec_.gathers_output && !spec_.splits_input;
    const bool own_output = spec_.splits_input && !spec_.gathers_output;
    call_.input = in + (own_input ? r_ * block_ : 0);
    call_.output = in + (own_output ? r_ * block_ : 0);
  }
  call_.options.timeout = o.timeout_s ? std::optional(std::chrono::milliseconds(o.timeout_s * 1000)) : std::nullopt;
  if (spec_.peers == Peers::ring) {
    ring_ = {P2POp{P2POp::send, src(), count, o.dtype, (r_ + 1) % n_, 0},
             P2POp{P2POp::recv, dst(), count, o.dtype, (r_ - 1 + n_) % n_, 0}};
    call_.group = ring_;
  }
  if (spec_.op == Op::alltoallv) {
    send_ = varied_blocks(count, r_, n_, true);
    recv_ = varied_blocks(count, r_, n_, false);
    call_.send = send_, call_.recv = recv_;
  }
  if (spec_.op == Op::allgatherv || spec_.op == Op::reduce_scatterv) {
    send_ = recv_ = equal_blocks(count, n_);
    call_.send = send_, call_.recv = recv_;
  }
}

void Case::fill_for_check() {
  std::memset(dst(), 0xab, (spec_.gathers_output ? n_ : 1) * block_);
  fill();
}

void Case::fill() {
  const DataType t = call_.dtype;
  if (compressed_) {
    for (size_t i = 0; i < call_.count; ++i) reinterpret_cast<float*>(src())[i] = gradient_value(r_, i);
    return;
  }
  if (!spec_.moves_data() || (spec_.root == Root::sends && r_ != call_.root)) return;
  const size_t elements = call_.count * (spec_.splits_input ? n_ : 1);
  for (size_t g = 0; g < elements; ++g) {
    store_element(t, src(), g, spec_.reduces ? input_value(call_.reduce, t, r_, g) : moved_value(r_, g));
  }
}

void Case::run() {
  if (spec_.peers == Peers::hypercube) {
    run_hypercube();
    return;
  }
  if (!compressed_) {
    comm_.run(call_);
    return;
  }
  if (call_.input != call_.output) std::memcpy(dst(), src(), block_);
  compressed_->allreduce(reinterpret_cast<float*>(dst()), call_.count, call_.reduce);
}

void Case::start(std::vector<Request>& pending) {
  if (spec_.peers == Peers::hypercube || compressed_) {
    run();
    return;
  }
  pending.push_back(comm_.start(call_));
}

void Case::run_hypercube() {
  char* out = dst();
  if (src() != out + r_ * block_) std::memcpy(out + r_ * block_, src(), block_);
  for (int mask = 1; mask < n_; mask <<= 1) {
    // Before step `mask`, this rank holds the `mask` blocks from its own aligned group of ranks.
    const int own = r_ & ~(mask - 1), theirs = own ^ mask;
    const size_t count = call_.count * size_t(mask);
    const P2POp step[] = {P2POp{P2POp::send, out + own * block_, count, call_.dtype, r_ ^ mask, 0},
                          P2POp{P2POp::recv, out + theirs * block_, count, call_.dtype, r_ ^ mask, 0}};
    Call exchange = call_;
    exchange.group = step;
    comm_.run(exchange);
  }
}

long Case::wrong() const {
  if (!spec_.moves_data() || (spec_.root == Root::receives && r_ != call_.root)) return 0;
  const DataType t = call_.dtype;
  const size_t first = spec_.splits_input ? r_ * call_.count : 0;  // where this rank's block starts in the pattern
  if (spec_.reduces) return count_wrong(call_.reduce, t, n_, dst(), call_.count, first);
  if (spec_.op == Op::alltoallv) return wrong_varied();
  long wrong = 0;
  for (int b = 0; b < (spec_.gathers_output ? n_ : 1); ++b) {
    // Block b came from rank b, else from the root, else (sendrecv) from the previous rank.
    const int from = spec_.gathers_output ? b : spec_.rooted() ? call_.root : (r_ - 1 + n_) % n_;
    wrong += count_wrong_moved(t, from, dst() + b * block_, call_.count, first);
  }
  return wrong;
}

long Case::wrong_varied() const {
  long wrong = 0;
  const size_t size = dtype_size(call_.dtype);
  for (int p = 0; p < n_; ++p) {
    // Rank p's block for this rank starts at its send displacement for us.
    const size_t first = varied_blocks(call_.count, p, n_, true).displs[size_t(r_)];
    wrong += count_wrong_moved(call_.dtype, p, dst() + recv_.displs[size_t(p)] * size, recv_.counts[size_t(p)], first);
  }
  return wrong;
}

}  // namespace tandem::bench
