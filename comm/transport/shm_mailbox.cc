// The shared-memory mailbox: per-pair rings of slots that messages stream
// through, tag matching in posting order, the receiver's cross-memory reads
// (the timed choice between the two ways is in shm_mailbox_timed.cc), and a
// doorbell (futex) per rank to wake it from a long wait. Copies take
// tandem::copy (no 4K-aliasing stall between a buffer and a slot).
#include "shm_mailbox.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <string>

#include "shared_segments.h"
#include "shm_mailbox_wire.h"
#include "tandem/reduce.h"

namespace tandem {

ShmMailbox::ShmMailbox(int rank, int size, const SharedSegments& rings, const SharedSegmentSet& peers,
                       size_t stream_max_bytes, bool timed)
    : rank_(rank),
      size_(size),
      stream_max_bytes_(std::max(stream_max_bytes, kMailboxInSlotsBytes)),
      timed_(timed),
      rings_(rings),
      peers_(peers),
      next_out_(size_t(size)),
      next_in_(size_t(size)),
      consumed_seen_(size_t(size)),
      waiting_(size_t(size)),
      receives_from_(size_t(size)),
      streams_(size_t(size)),
      sent_(size_t(size) * kMailboxClasses),
      choices_(kMailboxClasses),
      trials_(size_t(size) * kMailboxClasses) {}

ShmMailbox::~ShmMailbox() {
  for (Op* op : receives_) delete op;
  for (auto& q : waiting_) {
    for (Op* op : q) delete op;
  }
  for (Op* op : spare_) delete op;
}

ShmMailbox::Op* ShmMailbox::make_op(bool is_recv, int peer, uint64_t tag, void* data, size_t bytes) {
  Op* op;
  if (spare_.empty()) {
    op = new Op{};
  } else {
    op = spare_.back();
    spare_.pop_back();
  }
  *op = Op{is_recv, peer, tag, data, bytes};
  return op;
}

void ShmMailbox::recycle(Op* op) { spare_.push_back(op); }

uint64_t ShmMailbox::slots_for(size_t bytes, bool by_address) {
  return !by_address && bytes > 0 ? (bytes + kSlotPayload - 1) / kSlotPayload : 1;
}

size_t ShmMailbox::segment_bytes(int size) { return sizeof(Doorbell) + size_t(size) * sizeof(Ring); }

ShmMailbox::Ring& ShmMailbox::ring(int sender, int receiver) const {
  return reinterpret_cast<Ring*>(rings_.segment[size_t(sender)] + sizeof(Doorbell))[receiver];
}

void ShmMailbox::ring_bell(int rank) const {
  Doorbell& d = doorbell(rings_, rank);
  // The write that gave the peer work must be visible before `sleeping` is
  // read: else both may miss (it reading the old state after announcing its
  // sleep, this rank reading it awake) and the peer sleeps its whole slice.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(d.sleeping).load(std::memory_order_relaxed) == 0) return;
  std::atomic_ref<uint32_t>(d.bell).fetch_add(1, std::memory_order_release);
  ::syscall(SYS_futex, &d.bell, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint32_t ShmMailbox::announce_sleep() const {
  Doorbell& d = doorbell(rings_, rank_);
  const uint32_t bell = std::atomic_ref<uint32_t>(d.bell).load(std::memory_order_acquire);
  std::atomic_ref<uint32_t>(d.sleeping).store(1, std::memory_order_seq_cst);
  return bell;
}

void ShmMailbox::sleep(uint32_t bell, std::chrono::microseconds timeout) const {
  Doorbell& d = doorbell(rings_, rank_);
  if (timeout.count() > 0) {
    const timespec ts{time_t(timeout.count() / 1000000), long(timeout.count() % 1000000) * 1000};
    ::syscall(SYS_futex, &d.bell, FUTEX_WAIT, bell, &ts, nullptr, 0);
  }
  std::atomic_ref<uint32_t>(d.sleeping).store(0, std::memory_order_relaxed);
}

Pending ShmMailbox::send(int peer, uint64_t tag, const void* data, size_t bytes) {
  Op* op = make_op(false, peer, tag, const_cast<void*>(data), bytes);
  op->read = choose_read(*op);
  Pending p(op, peer, bytes, false);
  if (!waiting_[size_t(peer)].empty() || !try_write(*op)) {
    waiting_[size_t(peer)].push_back(op);
    ++waiting_sends_;
  } else if (op->done) {  // in the slots: complete once written
    recycle(op);
    p.mark_done();
  }
  return p;
}

bool ShmMailbox::try_write(Op& op) {
  Ring& r = ring(rank_, op.peer);
  const uint64_t slots = slots_for(op.bytes, op.read);
  uint64_t& next = next_out_[size_t(op.peer)];
  // The receiver's count is read only when the ring looks full: its cache
  // line then stays with the receiver (one miss fewer per small message).
  uint64_t& seen = consumed_seen_[size_t(op.peer)];
  const uint64_t wanted = std::min<uint64_t>(slots - op.slots_in, kMailboxSlots);
  if (next + wanted - seen > kMailboxSlots) seen = load_acquire(r.consumed);
  const uint64_t room = kMailboxSlots - (next - seen);
  if (room == 0) return false;
  if (op.slots_in == 0) op.seq = next;
  const uint64_t end = std::min(slots, op.slots_in + room);
  for (; op.slots_in < end; ++op.slots_in, ++next) {
    std::byte* slot = r.slots[next % kMailboxSlots];
    const size_t at = op.slots_in * kSlotPayload;
    if (!op.read && at < op.bytes) {
      copy(MemoryType::host, slot + kMailboxHeaderBytes, bytes_at(op.data, at), std::min(kSlotPayload, op.bytes - at));
    }
    auto* header = reinterpret_cast<SlotHeader*>(slot);
    if (op.slots_in == 0) {
      header->tag = op.tag;
      header->bytes = op.bytes | (op.trial ? kTrialBit : 0);
      if (op.trial) r.trials[next % kMailboxSlots] = TrialStamp{op.posted_ns, op.place};
      header->address = op.read ? reinterpret_cast<uint64_t>(op.data) : 0;
    }
    store_release(header->stamp, next + 1);
  }
  ring_bell(op.peer);
  op.done = op.slots_in == slots && !op.read;
  return op.slots_in == slots;
}

Pending ShmMailbox::recv(int peer, uint64_t tag, void* data, size_t bytes) {
  Op* op = make_op(true, peer, tag, data, bytes);
  // Messages already here come first: one (source, tag)'s keep their order.
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (it->tag != tag || (peer >= 0 && it->source != peer)) continue;
    Stream& st = streams_[size_t(it->source)];
    const size_t arrived = it->whole ? it->bytes : st.at;
    deliver(*op, it->source, it->bytes, [&](void* into) { copy(MemoryType::host, into, it->data.get(), arrived); });
    if (!it->whole) {  // the rest streams straight into the receive, which finishes with it
      st.held = nullptr;
      st.op = op;
      st.skip = op->arrived_bytes != op->bytes;
      op->done = false;
    }
    unexpected_.erase(it);
    return Pending(op, peer, bytes, true);
  }
  receives_.push_back(op);
  ++(peer >= 0 ? receives_from_[size_t(peer)] : receives_from_any_);
  return Pending(op, peer, bytes, true);
}

template <class Copy>
void ShmMailbox::deliver(Op& op, int source, size_t bytes, Copy copy) {
  op.source = source;
  op.arrived_bytes = bytes;
  op.done = true;
  if (bytes != op.bytes || bytes == 0) return;  // a mismatch is thrown by poll()
  copy(op.data);
}

void ShmMailbox::read_large(int source, uint64_t remote_address, void* into, size_t bytes) const {
  const auto* from = reinterpret_cast<const void*>(remote_address);
  if (source == rank_) {
    copy(MemoryType::host, into, from, bytes);  // a send to oneself
  } else {
    peers_.read_peer(source, from, into, bytes);
  }
}

bool ShmMailbox::drain(int sender, bool hold_reads) {
  Ring& r = ring(sender, rank_);
  Stream& st = streams_[size_t(sender)];
  bool arrived = false;
  for (;;) {
    if (!st.active) {
      const uint64_t seq = next_in_[size_t(sender)];
      const auto* header = reinterpret_cast<const SlotHeader*>(r.slots[seq % kMailboxSlots]);
      if (load_acquire(header->stamp) != seq + 1) return arrived;
      // A message to read from the sender's buffer stays in the ring while
      // no receive from the sender is posted: moved aside, it would be read
      // into a new buffer (its pages faulted in) and copied again, 0.4-1 ms
      // at 1 MiB where the read takes 50 us. A receive waiting behind it
      // moves it aside (probe too).
      if (hold_reads && header->address != 0 && receives_from_[size_t(sender)] == 0 && receives_from_any_ == 0) {
        return arrived;
      }
      start_stream(sender, seq);
    }
    const uint64_t from = next_in_[size_t(sender)];
    const bool whole = copy_stream(sender);
    if (next_in_[size_t(sender)] != from) {
      // One release per pass, not per slot: the sender's line moves once.
      store_release(r.consumed, next_in_[size_t(sender)]);
      ring_bell(sender);  // its ring has room, or its large send completes
    }
    if (!whole) return arrived;
    arrived = true;
  }
}

void ShmMailbox::start_stream(int sender, uint64_t seq) {
  const Ring& r = ring(sender, rank_);
  const auto* header = reinterpret_cast<const SlotHeader*>(r.slots[seq % kMailboxSlots]);
  const uint64_t tag = header->tag;
  const size_t bytes = header->bytes & ~kTrialBit;
  Stream& st = streams_[size_t(sender)];
  st = Stream{true, seq, bytes, 0, header->address, slots_for(bytes, header->address != 0), 0, nullptr, nullptr, false};
  ++active_streams_;
  // The earliest posted receive that takes it.
  auto match = std::find_if(receives_.begin(), receives_.end(),
                            [&](const Op* op) { return op->tag == tag && (op->peer == sender || op->peer < 0); });
  if (match != receives_.end()) {
    Op* op = *match;
    receives_.erase(match);
    --(op->peer >= 0 ? receives_from_[size_t(sender)] : receives_from_any_);
    op->source = sender;
    op->arrived_bytes = bytes;
    // A size mismatch (poll() throws it) finishes the receive once the
    // message has passed, so that the send completes.
    st.op = op;
    st.skip = bytes != op->bytes;
  } else {
    unexpected_.push_back(Unexpected{sender, tag, bytes, std::make_unique_for_overwrite<std::byte[]>(bytes), false});
    st.held = &unexpected_.back();
  }
  if (header->bytes & kTrialBit) {
    const TrialStamp& stamp = r.trials[seq % kMailboxSlots];
    st.trial = true, st.place = stamp.place, st.posted_ns = stamp.posted_ns;
  }
}

bool ShmMailbox::copy_stream(int sender) {
  Ring& r = ring(sender, rank_);
  Stream& st = streams_[size_t(sender)];
  std::byte* into = st.skip ? nullptr : st.op ? static_cast<std::byte*>(st.op->data) : st.held->data.get();
  if (st.slots_in == 0 && st.address != 0) {
    // Read from the sender's buffer; in pieces while this rank's own sends
    // wait for room, so that a peer streaming to it while it reads is not
    // held up for the whole read.
    const size_t piece = waiting_sends_ > 0 ? std::min(kMailboxReadPieceBytes, st.bytes - st.at) : st.bytes - st.at;
    if (into) read_large(sender, st.address + st.at, into + st.at, piece);
    st.at += piece;
    if (st.at < st.bytes) return false;
    st.slots_in = 1;
  }
  for (; st.slots_in < st.slots; ++st.slots_in) {
    const uint64_t seq = st.head + st.slots_in;
    const std::byte* slot = r.slots[seq % kMailboxSlots];
    if (st.slots_in > 0 && load_acquire(reinterpret_cast<const SlotHeader*>(slot)->stamp) != seq + 1) break;
    const size_t piece = std::min(kSlotPayload, st.bytes - st.at);
    if (into && piece > 0) copy(MemoryType::host, into + st.at, slot + kMailboxHeaderBytes, piece);
    st.at += piece;
  }
  next_in_[size_t(sender)] = st.head + st.slots_in;
  if (st.slots_in < st.slots) return false;
  if (st.trial && !st.skip) record_trial(sender, st);
  if (st.op) st.op->done = true;
  if (st.held) st.held->whole = true;
  st.active = false;
  --active_streams_;
  return true;
}

bool ShmMailbox::probe(uint64_t tag, uint64_t mask, int* source) {
  for (int sender = 0; sender < size_; ++sender) drain(sender, false);
  for (const Unexpected& u : unexpected_) {
    if (u.whole && (u.tag & mask) == (tag & mask)) {
      *source = u.source;
      return true;
    }
  }
  return false;
}

void ShmMailbox::progress() {
  for (size_t peer = 0; waiting_sends_ > 0 && peer < waiting_.size(); ++peer) {
    auto& queue = waiting_[peer];
    while (!queue.empty() && try_write(*queue.front())) {
      queue.pop_front();
      --waiting_sends_;
    }
  }
  if (receives_.empty() && active_streams_ == 0) return;
  for (int sender = 0; sender < size_; ++sender) {
    if (receives_from_any_ > 0 || receives_from_[size_t(sender)] > 0 || streams_[size_t(sender)].active) {
      drain(sender, true);
    }
  }
}

bool ShmMailbox::poll(Pending& p, int* source) {
  if (p.done()) return true;
  Op* op = static_cast<Op*>(p.handle());
  if (!op->done && op->read && op->slots_in > 0) op->done = load_acquire(ring(rank_, op->peer).consumed) > op->seq;
  if (!op->done) return false;
  const bool mismatch = op->is_recv && op->arrived_bytes != op->bytes;
  const size_t expected = op->bytes, arrived = op->arrived_bytes;
  if (source) *source = op->source;
  recycle(op);
  p.mark_done();
  if (mismatch) {
    throw CollectiveMismatch("collective mismatch: rank " + std::to_string(rank_) + " expected a " +
                             std::to_string(expected) + "-byte message but got a " + std::to_string(arrived) +
                             "-byte one");
  }
  return true;
}

void ShmMailbox::cancel(Pending& p) {
  if (p.done()) return;
  forget(static_cast<Op*>(p.handle()));
  p.mark_done();
}

void ShmMailbox::forget(Op* op) {
  for (Stream& st : streams_) {
    if (st.op == op) st.op = nullptr, st.skip = true;  // the rest of its message is passed over
  }
  if (op->is_recv) {
    auto it = std::find(receives_.begin(), receives_.end(), op);
    if (it != receives_.end()) {
      receives_.erase(it);
      --(op->peer >= 0 ? receives_from_[size_t(op->peer)] : receives_from_any_);
    }
  } else {
    auto& queue = waiting_[size_t(op->peer)];
    const auto kept = std::remove(queue.begin(), queue.end(), op);
    waiting_sends_ -= size_t(queue.end() - kept);
    queue.erase(kept, queue.end());
  }
  recycle(op);
}

}  // namespace tandem
