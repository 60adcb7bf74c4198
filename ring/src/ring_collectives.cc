// Reduce-scatter, allgather, broadcast and barrier.
//
// Terms (as in ring_allreduce.cc):
//   block    - reduce-scatter and allgather buffers hold n blocks of `count`
//              elements, one per rank; rank r owns block r.
//   segment  - every block (broadcast: the whole buffer) is cut into the same
//              number S of segments of at most segment_bytes; a segment is
//              the unit of one message.
//   step     - one hop around the ring: rank r sends to r + 1 and receives
//              from r - 1. Reduce-scatter and allgather take n - 1 steps each.
//   walk     - segment j of every block travelling through all the steps.
//              Up to segments_in_flight walks run at once; the oldest is the
//              one a rank blocks on when nothing else can move.
//   chain    - broadcast's path root -> root + 1 -> ... -> root - 1; its walk
//              is one segment going down the chain.
//
// Reduce-scatter, for one walk (rank r; block b(k) = r - k - 1 goes out at step k):
//   step 0          send             own input of block r - 1
//   steps 1 .. n-2  recv_reduce_send received partial + own input, onward
//   end             recv_reduce      the last partial + own input of block r
//                                    lands in the output (avg divides here, once)
// Partials travel through two scratch segments per walk, used alternately; a
// segment is received into again only once its previous send has completed.
//
// Allgather, for one walk (block r - k goes out at step k):
//   step 0          send             own input of block r
//   steps 1 .. n-2  recv_copy_send   received straight into the output, forwarded
//   end             recv             block r + 1 arrives
//
// Broadcast, for one walk: the root sends, every middle rank of the chain
// recv_copy_sends (straight into its output), the last one only receives.
//
// Barrier (dissemination): in round k = 0 .. ceil(log2 n) - 1, rank r sends a
// one-byte token to r + 2^k and waits for the token from r - 2^k. After round
// k a rank has heard, directly or not, from the 2^(k+1) - 1 ranks before it.
//
// Every shared result is computed by one rank and copied by the others, so
// all ranks end bitwise identical.
#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <vector>

#include "collectives.h"
#include "tandem/errors.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

// ---- reduce-scatter ---------------------------------------------------------

class RingReduceScatter {
 public:
  RingReduceScatter(Channel& ch, const ReduceScatterArgs& a, const RingOptions& o)
      : ch_(ch), a_(a), n_(ch.size()), r_(ch.rank()), esize_(dtype_size(a.dtype)) {
    segments_ = segments_for(a.count, esize_, o.segment_bytes);
    check_segments("reduce_scatter", segments_);
    seg_bytes_ = balanced(a.count, segments_, 0).size * esize_;
    window_ = std::min<size_t>(segments_, size_t(o.segments_in_flight));
    combine_ = a.op == ReduceOp::avg ? ReduceOp::sum : a.op;
  }

  void run() {
    if (a_.count == 0) return;
    if (n_ == 1) {
      if (a_.output != a_.input) std::memcpy(a_.output, a_.input, a_.count * esize_);
      return;  // avg over one rank is the identity
    }
    // Two scratch segments per walk slot, in one allocation.
    scratch_ = static_cast<char*>(ch_.scratch(2 * window_ * seg_bytes_, 0));
    run_walks<Walk>(ch_, segments_, window_, [this](Walk& w, size_t segment) { start(w, segment); });
  }

 private:
  struct Walk {
    RingReduceScatter* rs = nullptr;
    size_t segment = 0;
    int step = 0;  // the step whose receive is posted, or is to be posted
    bool recv_posted = false;
    bool finished = false;  // the last partial has been reduced into the output
    char* buf[2] = {};      // step k receives into buf[k % 2]
    Pending recv;
    Pending first_send;  // step 0, straight from the input
    Pending sent[2];     // the send out of buf[i]

    bool advance() { return rs->advance(*this); }
    bool done() { return finished && rs->ch_.test(first_send) && rs->ch_.test(sent[0]) && rs->ch_.test(sent[1]); }
    Pending& blocker() {
      if (!finished) return recv_posted ? recv : sent[step % 2];
      for (Pending* p : {&first_send, &sent[0], &sent[1]}) {
        if (!p->done()) return *p;
      }
      return recv;
    }
  };

  // Block sent at step k; block received at step k is block_at(k + 1).
  int block_at(int k) const { return mod(r_ - k - 1, n_); }
  int last_step() const { return n_ - 2; }
  Range piece(size_t segment) const { return balanced(a_.count, segments_, segment); }
  const char* in(int block, size_t element) const {
    return static_cast<const char*>(a_.input) + (size_t(block) * a_.count + element) * esize_;
  }
  char* out(size_t element) const { return static_cast<char*>(a_.output) + element * esize_; }

  void start(Walk& w, size_t segment) {
    w.rs = this;
    w.segment = segment;
    // Live walks are `window_` consecutive segments, so segment % window_ is a free slot.
    char* slot = scratch_ + 2 * (segment % window_) * seg_bytes_;
    w.buf[0] = slot;
    w.buf[1] = slot + seg_bytes_;
    // step 0: send
    const Range p = piece(segment);
    w.first_send = ch_.send(next(), step_tag(0, segment), in(block_at(0), p.begin), p.size * esize_);
    post_recv(w);
  }

  void post_recv(Walk& w) {
    const Range p = piece(w.segment);
    w.recv = ch_.recv(prev(), step_tag(w.step, w.segment), w.buf[w.step % 2], p.size * esize_);
    w.recv_posted = true;
  }

  bool advance(Walk& w) {
    bool moved = false;
    while (!w.finished) {
      if (!w.recv_posted) {
        // The buffer of this step still holds what went out at the step before.
        if (!ch_.test(w.sent[w.step % 2])) break;
        post_recv(w);
        moved = true;
      }
      if (!ch_.test(w.recv)) break;
      land(w);
      moved = true;
    }
    return moved;
  }

  // The receive of step w.step has landed in buf[w.step % 2].
  void land(Walk& w) {
    const int k = w.step;
    const Range p = piece(w.segment);
    char* received = w.buf[k % 2];
    const int block = block_at(k + 1);
    if (k == last_step()) {  // recv_reduce: block r is complete
      reduce(a_.dtype, combine_, out(p.begin), in(block, p.begin), received, p.size);
      if (a_.op == ReduceOp::avg) scale_avg(a_.dtype, out(p.begin), p.size, n_);
      w.finished = true;
      return;
    }
    // recv_reduce_send: add our input and pass the partial on at step k + 1.
    reduce(a_.dtype, combine_, received, in(block, p.begin), received, p.size);
    w.sent[k % 2] = ch_.send(next(), step_tag(k + 1, w.segment), received, p.size * esize_);
    w.step = k + 1;
    w.recv_posted = false;
  }

  int next() const { return mod(r_ + 1, n_); }
  int prev() const { return mod(r_ - 1, n_); }

  Channel& ch_;
  const ReduceScatterArgs& a_;
  const int n_;
  const int r_;
  const size_t esize_;
  size_t segments_ = 1;
  size_t seg_bytes_ = 0;
  size_t window_ = 1;
  ReduceOp combine_ = ReduceOp::sum;
  char* scratch_ = nullptr;
};

// ---- allgather --------------------------------------------------------------

class RingAllgather {
 public:
  RingAllgather(Channel& ch, const AllgatherArgs& a, const RingOptions& o)
      : ch_(ch), a_(a), n_(ch.size()), r_(ch.rank()), esize_(dtype_size(a.dtype)) {
    segments_ = segments_for(a.count, esize_, o.segment_bytes);
    check_segments("allgather", segments_);
    window_ = std::min<size_t>(segments_, size_t(o.segments_in_flight));
  }

  void run() {
    if (a_.count == 0) return;
    const size_t bytes = a_.count * esize_;
    char* own = out(r_, 0);
    if (n_ > 1) run_walks<Walk>(ch_, segments_, window_, [this](Walk& w, size_t segment) { start(w, segment); });
    // Our own block: the walks sent it from the input, so the copy can come last.
    if (a_.input != own) std::memcpy(own, a_.input, bytes);
  }

 private:
  struct Walk {
    RingAllgather* ag = nullptr;
    size_t segment = 0;
    int step = 0;  // the step whose receive is posted
    bool finished = false;
    Pending recv;
    std::vector<Pending> sends;

    bool advance() { return ag->advance(*this); }
    bool done() {
      if (!finished) return false;
      for (auto& s : sends) {
        if (!ag->ch_.test(s)) return false;
      }
      return true;
    }
    Pending& blocker() {
      if (!finished) return recv;
      for (auto& s : sends) {
        if (!s.done()) return s;
      }
      return recv;
    }
  };

  // Block sent at step k; block received at step k is block_at(k + 1).
  int block_at(int k) const { return mod(r_ - k, n_); }
  Range piece(size_t segment) const { return balanced(a_.count, segments_, segment); }
  char* out(int block, size_t element) const {
    return static_cast<char*>(a_.output) + (size_t(block) * a_.count + element) * esize_;
  }

  void start(Walk& w, size_t segment) {
    w.ag = this;
    w.segment = segment;
    w.sends.reserve(n_ - 1);
    // step 0: send, from the input (our block of the output may not be filled yet)
    const Range p = piece(segment);
    const char* mine = static_cast<const char*>(a_.input) + p.begin * esize_;
    w.sends.push_back(ch_.send(next(), step_tag(0, segment), mine, p.size * esize_));
    post_recv(w, 0);
  }

  void post_recv(Walk& w, int k) {
    const Range p = piece(w.segment);
    w.step = k;
    w.recv = ch_.recv(prev(), step_tag(k, w.segment), out(block_at(k + 1), p.begin), p.size * esize_);
  }

  bool advance(Walk& w) {
    bool moved = false;
    while (!w.finished && ch_.test(w.recv)) {
      moved = true;
      const int k = w.step;
      if (k == n_ - 2) {  // recv: the walk is over
        w.finished = true;
        break;
      }
      // recv_copy_send: what landed at step k goes out at step k + 1.
      const Range p = piece(w.segment);
      post_recv(w, k + 1);
      w.sends.push_back(ch_.send(next(), step_tag(k + 1, w.segment), out(block_at(k + 1), p.begin), p.size * esize_));
    }
    return moved;
  }

  int next() const { return mod(r_ + 1, n_); }
  int prev() const { return mod(r_ - 1, n_); }

  Channel& ch_;
  const AllgatherArgs& a_;
  const int n_;
  const int r_;
  const size_t esize_;
  size_t segments_ = 1;
  size_t window_ = 1;
};

// ---- broadcast --------------------------------------------------------------

class ChainBroadcast {
 public:
  ChainBroadcast(Channel& ch, const BroadcastArgs& a, const RingOptions& o)
      : ch_(ch), a_(a), n_(ch.size()), esize_(dtype_size(a.dtype)), position_(mod(ch.rank() - a.root, n_)) {
    segments_ = segments_for(a.count, esize_, o.segment_bytes);
    if (segments_ > 0xffffffffull) throw InvalidArgument("broadcast: too many segments; raise segment_bytes");
    window_ = std::min<size_t>(segments_, size_t(o.segments_in_flight));
  }

  void run() {
    if (a_.count == 0) return;
    if (n_ > 1) run_walks<Walk>(ch_, segments_, window_, [this](Walk& w, size_t segment) { start(w, segment); });
    // The root sent from its input; its own output copy can come last.
    if (position_ == 0 && a_.input != a_.output) std::memcpy(a_.output, a_.input, a_.count * esize_);
  }

 private:
  struct Walk {
    ChainBroadcast* bc = nullptr;
    size_t segment = 0;
    bool landed = false;  // our output holds the segment (the root: always)
    Pending recv;
    Pending send;

    bool advance() { return bc->advance(*this); }
    bool done() { return landed && bc->ch_.test(send); }
    Pending& blocker() { return landed ? send : recv; }
  };

  bool is_root() const { return position_ == 0; }
  bool is_last() const { return position_ == n_ - 1; }
  int next() const { return mod(ch_.rank() + 1, n_); }
  int prev() const { return mod(ch_.rank() - 1, n_); }
  Range piece(size_t segment) const { return balanced(a_.count, segments_, segment); }
  char* out(size_t element) const { return static_cast<char*>(a_.output) + element * esize_; }

  void start(Walk& w, size_t segment) {
    w.bc = this;
    w.segment = segment;
    const Range p = piece(segment);
    if (is_root()) {  // send
      const char* src = static_cast<const char*>(a_.input) + p.begin * esize_;
      w.send = ch_.send(next(), Tag(segment), src, p.size * esize_);
      w.landed = true;
    } else {
      w.recv = ch_.recv(prev(), Tag(segment), out(p.begin), p.size * esize_);
    }
  }

  bool advance(Walk& w) {
    if (w.landed || !ch_.test(w.recv)) return false;
    w.landed = true;
    if (!is_last()) {  // recv_copy_send: forward what landed down the chain
      const Range p = piece(w.segment);
      w.send = ch_.send(next(), Tag(w.segment), out(p.begin), p.size * esize_);
    }
    return true;
  }

  Channel& ch_;
  const BroadcastArgs& a_;
  const int n_;
  const size_t esize_;
  const int position_;  // distance from the root along the chain
  size_t segments_ = 1;
  size_t window_ = 1;
};

}  // namespace

void ring_reduce_scatter(Channel& ch, const ReduceScatterArgs& args, const RingOptions& options) {
  RingReduceScatter(ch, args, options).run();
}

void ring_allgather(Channel& ch, const AllgatherArgs& args, const RingOptions& options) {
  RingAllgather(ch, args, options).run();
}

void pipelined_broadcast(Channel& ch, const BroadcastArgs& args, const RingOptions& options) {
  ChainBroadcast(ch, args, options).run();
}

void barrier(Channel& ch) {
  const int n = ch.size(), r = ch.rank();
  std::array<char, 64> tokens{};            // one per round: a send's byte stays put until it completes
  thread_local std::vector<Pending> sends;  // the thread's own, keeping its capacity: no allocation per call
  sends.clear();
  char received = 0;
  for (int distance = 1, round = 0; distance < n; distance <<= 1, ++round) tokens[size_t(round)] = char(round);
  for (int distance = 1, round = 0; distance < n; distance <<= 1, ++round) {
    Pending in = ch.recv(mod(r - distance, n), Tag(round), &received, 1);
    sends.push_back(ch.send(mod(r + distance, n), Tag(round), &tokens[round], 1));
    ch.wait(in);  // the next round's token may only leave once this one is here
  }
  ch.wait_all(sends);
}

}  // namespace tandem::ring
