// Ring all-reduce: reduce-scatter followed by allgather, pipelined.
//
// Terms:
//   chunk    - the buffer is cut into n chunks, one per rank (balanced: the
//              first count % n chunks hold one element more). After the
//              reduce-scatter, rank r owns the fully reduced chunk (r + 1) % n.
//   segment  - every chunk is cut into the same number S of segments of at
//              most segment_bytes; a segment is the unit of one message.
//   step     - one hop around the ring: rank r sends to r + 1 and receives
//              from r - 1. The reduce-scatter has n - 1 steps, the allgather
//              n - 1 more; step k of the walk is numbered 0 .. 2(n - 1) - 1.
//   walk     - segment j of every chunk travelling through all 2(n - 1) steps.
//              Up to segments_in_flight walks run at once, so one segment is
//              being reduced while the next is on the wire.
//
// What a rank does for one walk, as named primitives (as in NCCL's ring):
//   step 0                  send             its own input of chunk r
//   steps 1 .. n-2          recv_reduce_send partial sums onward
//   step n-1                recv_reduce_send the last sum finishes chunk r+1
//                                            (avg divides here, once), then
//                                            starts the allgather with it
//   steps n .. 2n-3         recv_copy_send   received straight into the output
//   end                     recv             the last chunk arrives
// The data sent at step k + 1 is always what arrived at step k. Every chunk's
// final value is computed by one rank and copied by the others, so all ranks
// end bitwise identical.
#include <algorithm>
#include <vector>

#include "collectives.h"
#include "tandem/errors.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

class RingAllreduce {
 public:
  RingAllreduce(Channel& ch, const AllreduceArgs& a, const RingOptions& o)
      : ch_(ch), a_(a), n_(ch.size()), r_(ch.rank()), esize_(dtype_size(a.dtype)) {
    const size_t max_chunk = balanced(a.count, n_, 0).size;
    segments_ = segments_for(max_chunk, esize_, o.segment_bytes);
    check_segments("allreduce", segments_);
    seg_bytes_ = balanced(max_chunk, segments_, 0).size * esize_;
    window_ = std::min<size_t>(segments_, size_t(o.segments_in_flight));
    combine_ = a.op == ReduceOp::avg ? ReduceOp::sum : a.op;
  }

  void run() {
    if (a_.count == 0) return;
    if (n_ == 1) {
      copy(a_.memory, a_.output, a_.input, a_.count * esize_);
      return;  // avg over one rank is the identity
    }
    run_walks<Walk>(ch_, segments_, window_, [this](Walk& w, size_t segment) { start(w, segment); });
  }

 private:
  struct Walk {
    RingAllreduce* ar = nullptr;
    size_t segment = 0;
    int step = 0;  // the step whose receive is posted
    void* scratch = nullptr;
    Pending recv;
    std::vector<Pending> sends;
    bool finished = false;

    // Every receive that has landed, processed; true if there was one.
    bool advance() {
      bool moved = false;
      while (!finished && ar->ch_.test(recv)) {
        ar->land(*this);
        moved = true;
      }
      return moved;
    }
    bool done() {
      if (!finished) return false;
      for (auto& s : sends) {
        if (!ar->ch_.test(s)) return false;
      }
      return true;
    }
    Pending& blocker() {
      for (auto& s : sends) {
        if (finished && !s.done()) return s;
      }
      return recv;
    }
  };

  int steps() const { return 2 * (n_ - 1); }
  // Chunk sent and chunk received at step k.
  int send_chunk(int k) const { return k < n_ - 1 ? mod(r_ - k, n_) : mod(r_ + 1 - (k - (n_ - 1)), n_); }
  int recv_chunk(int k) const { return k < n_ - 1 ? mod(r_ - k - 1, n_) : mod(r_ - (k - (n_ - 1)), n_); }
  bool reducing(int k) const { return k < n_ - 1; }

  Range piece(int chunk, size_t segment) const {
    Range c = balanced(a_.count, n_, chunk);
    Range s = balanced(c.size, segments_, segment);
    return {c.begin + s.begin, s.size};
  }
  char* out(size_t element) const { return static_cast<char*>(a_.output) + element * esize_; }
  const char* in(size_t element) const { return static_cast<const char*>(a_.input) + element * esize_; }

  void start(Walk& w, size_t segment) {
    w.ar = this;
    w.segment = segment;
    // Live walks are always `window_` consecutive segments, so segment % window_ is a free slot.
    w.scratch = ch_.scratch_in(a_.memory, seg_bytes_, int(segment % window_));
    post_recv(w, 0);
    // step 0: send
    Range s = piece(send_chunk(0), segment);
    send(w, 0, in(s.begin), s.size);
  }

  void post_recv(Walk& w, int k) {
    w.step = k;
    Range p = piece(recv_chunk(k), w.segment);
    if (p.size == 0) {
      w.recv = Pending();  // an empty piece travels as no message on both sides
      return;
    }
    void* dst = reducing(k) ? w.scratch : out(p.begin);
    w.recv = ch_.recv(mod(r_ - 1, n_), step_tag(k, w.segment), dst, p.size * esize_);
  }

  void send(Walk& w, int k, const void* data, size_t elements) {
    if (elements == 0) return;
    w.sends.push_back(ch_.send(mod(r_ + 1, n_), step_tag(k, w.segment), data, elements * esize_));
  }

  // The receive of step w.step has landed: reduce or keep it, then forward it.
  void land(Walk& w) {
    const int k = w.step;
    Range p = piece(recv_chunk(k), w.segment);
    if (reducing(k)) {
      recv_reduce(p, w.scratch);
      if (k == n_ - 2 && a_.op == ReduceOp::avg) scale_avg(a_.memory, a_.dtype, out(p.begin), p.size, n_);
    }
    if (k + 1 == steps()) {  // recv: the walk is over
      w.finished = true;
      return;
    }
    // The piece that arrived at step k is what goes out at step k + 1.
    post_recv(w, k + 1);
    send(w, k + 1, out(p.begin), p.size);
  }

  void recv_reduce(Range p, const void* received) {
    if (p.size == 0) return;
    reduce(a_.memory, a_.dtype, combine_, out(p.begin), in(p.begin), received, p.size);
  }

  Channel& ch_;
  const AllreduceArgs& a_;
  const int n_;
  const int r_;
  const size_t esize_;
  size_t segments_ = 1;
  size_t seg_bytes_ = 0;
  size_t window_ = 1;
  ReduceOp combine_ = ReduceOp::sum;
};

}  // namespace

void ring_allreduce(Channel& ch, const AllreduceArgs& args, const RingOptions& options) {
  RingAllreduce(ch, args, options).run();
}

}  // namespace tandem::ring
