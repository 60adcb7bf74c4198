// The timed choice between the mailbox's two ways, streaming through the
// slots and the receiver's cross-memory read of the sender's buffer
// (docs/algorithms.md, 'shm: point-to-point, timed'): the sender's trial
// schedule and pooled verdict, the receiver's record of its trials.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <vector>

#include "shm_mailbox.h"
#include "shm_mailbox_wire.h"

namespace tandem {

// A round's opening: class_pairs() pairs of trials, one of each way, a
// trial being kMailboxTrialMessages messages of its way, the last timed, so
// that it times its way's steady state: at 1 MiB a read just after a stream
// took 150-330 us where one after a read took 50-90, and a stream after a
// read 165-265 where one after a stream took 130-140. Streaming first in
// even pairs and last in odd ones, so that a drift falls on both alike. The
// first round opens with kMailboxWarmReads untimed reads (the first reads
// from a buffer run slow), then its one pair, an even one: six messages,
// inside a benchmark's warm-up (a checked call and five more) at any size.
// Its read trial comes last, so reading, the way a class starts with and
// mostly keeps, goes on from it; read first, the message after the pair was
// a read just after a stream, a benchmark's first timed call (1 MiB:
// 108-142 us against 50).
ShmMailbox::Scheduled ShmMailbox::schedule(size_t c, uint64_t n) {
  Scheduled s;
  auto [round, k] = round_place(n, kMailboxFirstRoundMessages, kMailboxRoundMessages);
  s.round = round;
  if (round == 0) {
    if (k < kMailboxWarmReads) {
      s.opening = s.read = true;
      return s;
    }
    k -= kMailboxWarmReads;
  }
  if (k >= 2 * kMailboxTrialMessages * class_pairs(c, round)) return s;
  const uint64_t trial = k / kMailboxTrialMessages, pair = trial / 2;
  const bool read_first = pair % 2 == 1;
  s.opening = true;
  s.trial = k % kMailboxTrialMessages == kMailboxTrialMessages - 1;
  s.number = trial;
  s.read = read_first == (trial % 2 == 0);
  return s;
}

bool ShmMailbox::choose_read(Op& op) {
  if (op.bytes <= kMailboxInSlotsBytes) return false;
  if (op.bytes > stream_max_bytes_) return true;
  if (!timed_ || op.peer == rank_) return false;
  const size_t c = size_class(op.bytes);
  const Scheduled s = schedule(c, sent_[size_t(op.peer) * kMailboxClasses + c]++);
  if (!s.opening || (s.round == 1 && class_choice(c).settled)) return class_choice(c).read;
  if (s.trial) {
    op.trial = true;
    op.posted_ns = trial_clock_ns();
    op.place = s.round << 32 | s.number;
  }
  return s.read;
}

const ShmMailbox::Choice& ShmMailbox::class_choice(size_t c) {
  // Rank 0's line changes once per pair and round: it stays in every cache.
  const uint64_t generation = load_acquire(doorbell(rings_, 0).generations[c]);
  Choice& ch = choices_[c];
  if (generation == ch.generation) return ch;
  std::vector<float> medians;
  for (int s = 0; s < size_; ++s) {
    for (int r = 0; r < size_; ++r) {
      if (s != r) medians.push_back(std::bit_cast<float>(uint32_t(load_acquire(ring(s, r).medians[c]))));
    }
  }
  const double pooled = pooled_ratio(medians.data(), medians.size());
  ch.generation = generation;
  ch.read = read_won(medians.data(), medians.size());
  ch.settled = clear_win(pooled);
  return ch;
}

float ShmMailbox::median_ratio(const Trials& t) {
  if (t.pairs == 0) return 1;
  std::vector<float> r(t.read_ratio, t.read_ratio + t.pairs);
  std::sort(r.begin(), r.end());
  return (r[(t.pairs - 1) / 2] + r[t.pairs / 2]) / 2;
}

double ShmMailbox::pooled_ratio(const float* medians, size_t n) {
  double log_sum = 0;
  size_t in = 0;
  for (size_t i = 0; i < n; ++i) {
    if (medians[i] > 0) log_sum += std::log(double(medians[i])), ++in;
  }
  return in > 0 ? std::exp(log_sum / double(in)) : 1;
}

bool ShmMailbox::read_won(const float* medians, size_t n) {
  return pooled_ratio(medians, n) < 1;  // none in: 1, streaming
}

// From the send's post to the receive's completion: both ends' work (in an
// exchange, the receiver's own send is in it too).
void ShmMailbox::record_trial(int sender, const Stream& st) {
  const uint64_t now = trial_clock_ns();
  const size_t c = size_class(st.bytes);
  Trials& t = trials_[size_t(sender) * kMailboxClasses + c];
  const uint64_t round = st.place >> 32, trial = st.place & 0xffffffff, pair = trial / 2;
  if (round != t.round) t = Trials{round};
  if (t.pairs == class_pairs(c, round)) return;
  const uint64_t ns = std::max<uint64_t>(now > st.posted_ns ? now - st.posted_ns : 0, 1);
  const bool read = st.address != 0;
  if (trial % 2 == 0) {
    t.first_ns = ns, t.first_pair = pair;
    return;
  }
  if (t.first_pair != pair) return;  // its first did not count: the pair does not
  t.read_ratio[t.pairs++] = read ? float(ns) / float(t.first_ns) : float(t.first_ns) / float(ns);
  if (pair + 1 < class_pairs(c, round)) return;
  const float median = median_ratio(t);
  store_release(ring(sender, rank_).medians[c], std::bit_cast<uint32_t>(median));
  std::atomic_ref<uint64_t>(doorbell(rings_, 0).generations[c]).fetch_add(1, std::memory_order_acq_rel);
}

}  // namespace tandem
