// Sub-communicators: split(color, key) and duplicate(). The ranks agree on
// colours and keys through an allgather on this communicator; each new
// communicator then wires up through this one's store under a prefix of its
// own (no new port), with its own UCX worker, shared memory among its ranks
// on a host, and the job store's liveness watch over its processes (see
// PrefixStore).
// over_members() is that last step, for shrink() too (membership.cc).
#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "communicator_impl.h"
#include "prefix_store.h"

namespace tandem {

std::unique_ptr<Communicator> Communicator::split(int color, int key, const CollectiveOptions& opts) {
  if (color < kUndefinedColor) {
    throw InvalidArgument("split: color " + std::to_string(color) +
                          " must be >= 0, or kUndefinedColor (-1) to join none");
  }
  // Every rank's (color, key), through an allgather named split in fingerprints and errors.
  const int n = size();
  std::vector<int64_t> mine{color, key}, all(size_t(2 * n));
  AllgatherArgs args{mine.data(), all.data(), 2, DataType::i64, MemoryType::host};
  impl_->engine.submit(false, [a = impl_->algorithms, args](Channel& ch) { a->allgather(ch, args); }, opts,
                       {Collective::split, 2, DataType::i64, std::nullopt});
  const uint64_t number = ++impl_->splits;  // the same on every rank: splits are collective
  if (color == kUndefinedColor) return nullptr;

  std::vector<int> members;
  for (int r = 0; r < n; ++r) {
    if (all[size_t(2 * r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[size_t(2 * a + 1)] < all[size_t(2 * b + 1)]; });

  return over_members(members,
                      impl_->ctx.opts.prefix + "/split/" + std::to_string(number) + "/" + std::to_string(color));
}

std::unique_ptr<Communicator> Communicator::over_members(const std::vector<int>& members, const std::string& prefix) {
  CommOptions o = impl_->ctx.opts;
  o.size = int(members.size());
  o.rank = int(std::find(members.begin(), members.end(), rank()) - members.begin());
  const Topology& t = impl_->endpoints.topology;
  o.local_rank = o.local_size = 0;
  for (int r : members) {
    if (t.host_of[size_t(r)] != t.host()) continue;
    if (r < rank()) ++o.local_rank;
    ++o.local_size;
  }
  o.host_store = false;
  o.interface_chosen = true;
  o.store.reset();
  if (o.size > 1) {
    const Deadline deadline = Clock::now() + impl_->ctx.opts.connect_timeout;
    o.store = PrefixStore::within(*impl_->ctx.store, prefix, members, {}, deadline);
  }
  std::unique_ptr<Communicator> comm = Communicator::create(o, impl_->algorithms);
  comm->impl_->server = impl_->server;
  return comm;
}

std::unique_ptr<Communicator> Communicator::duplicate(const CollectiveOptions& opts) { return split(0, rank(), opts); }

}  // namespace tandem
