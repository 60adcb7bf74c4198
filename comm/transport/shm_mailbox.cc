// The shared-memory mailbox: per-pair rings of slots, tag matching in posting
// order, the receiver's cross-memory reads of large messages, and a doorbell
// (futex) per rank to wake it from a long wait. Copies take tandem::copy
// (no 4K-aliasing stall between a buffer and a slot).
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
#include "tandem/reduce.h"

namespace tandem {
namespace {

struct SlotHeader {
  uint64_t stamp;  // sequence number + 1 once the message is in
  uint64_t tag;
  uint64_t bytes;  // up to kMailboxInlineBytes: in the slots from this one on; else at `address` in the sender
  uint64_t address;
};
static_assert(sizeof(SlotHeader) <= kMailboxHeaderBytes);

uint64_t load_acquire(const uint64_t& x) { return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire); }
void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }
void* bytes_at(void* p, size_t offset) { return static_cast<std::byte*>(p) + offset; }

constexpr size_t kSlotPayload = kMailboxSlotBytes - kMailboxHeaderBytes;

bool is_inline(size_t bytes) { return bytes <= kMailboxInlineBytes; }
// Slots a message takes: an inline one as many as its payload fills.
uint64_t slots_for(size_t bytes) {
  return is_inline(bytes) && bytes > 0 ? (bytes + kSlotPayload - 1) / kSlotPayload : 1;
}

// The start of each rank's mailbox segment: whether the rank sleeps, and the
// futex its peers ring after giving it something to do.
struct Doorbell {
  alignas(64) uint32_t sleeping;
  uint32_t bell;
};

Doorbell& doorbell(const SharedSegments& segments, int rank) {
  return *reinterpret_cast<Doorbell*>(segments.segment[size_t(rank)]);
}

}  // namespace

struct ShmMailbox::Op {
  bool is_recv;
  int peer;  // receives: -1 for any source
  uint64_t tag;
  void* data;
  size_t bytes;
  bool done = false;
  bool written = false;  // sends: in their slot
  uint64_t seq = 0;      // sends: the slot's sequence number; a large send ends when the receiver passes it
  int source = -1;       // receives: who sent the message
  size_t arrived_bytes = 0;
};

// In the sender's segment, one per receiver. The receiver writes `consumed`
// (messages it has read), the sender everything else.
struct ShmMailbox::Ring {
  alignas(64) uint64_t consumed;
  alignas(64) std::byte slots[kMailboxSlots][kMailboxSlotBytes];
};

ShmMailbox::ShmMailbox(int rank, int size, const SharedSegments& rings, const SharedSegmentSet& peers)
    : rank_(rank),
      size_(size),
      rings_(rings),
      peers_(peers),
      next_out_(size_t(size)),
      next_in_(size_t(size)),
      consumed_seen_(size_t(size)),
      waiting_(size_t(size)),
      receives_from_(size_t(size)) {}

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

size_t ShmMailbox::segment_bytes(int size) { return sizeof(Doorbell) + size_t(size) * sizeof(Ring); }

ShmMailbox::Ring& ShmMailbox::ring(int sender, int receiver) const {
  return reinterpret_cast<Ring*>(rings_.segment[size_t(sender)] + sizeof(Doorbell))[receiver];
}

void ShmMailbox::ring_bell(int rank) const {
  Doorbell& d = doorbell(rings_, rank);
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
  Pending p(op, peer, bytes, false);
  if (!waiting_[size_t(peer)].empty() || !try_write(*op)) {
    waiting_[size_t(peer)].push_back(op);
    ++waiting_sends_;
  } else if (op->done) {  // inline: complete once copied
    recycle(op);
    p.mark_done();
  }
  return p;
}

bool ShmMailbox::try_write(Op& op) {
  Ring& r = ring(rank_, op.peer);
  const uint64_t seq = next_out_[size_t(op.peer)];
  // The receiver's count is read only when the ring looks full: its cache
  // line then stays with the receiver (one miss fewer per small message).
  uint64_t& seen = consumed_seen_[size_t(op.peer)];
  const uint64_t slots = slots_for(op.bytes);
  if (seq + slots - seen > kMailboxSlots) seen = load_acquire(r.consumed);
  if (seq + slots - seen > kMailboxSlots) return false;
  if (is_inline(op.bytes)) {
    for (uint64_t i = 0; i < slots; ++i) {
      const size_t at = i * kSlotPayload, piece = std::min(kSlotPayload, op.bytes - at);
      if (piece > 0) {
        copy(MemoryType::host, r.slots[(seq + i) % kMailboxSlots] + kMailboxHeaderBytes, bytes_at(op.data, at), piece);
      }
    }
  }
  auto* header = reinterpret_cast<SlotHeader*>(r.slots[seq % kMailboxSlots]);
  header->tag = op.tag;
  header->bytes = op.bytes;
  header->address = reinterpret_cast<uint64_t>(op.data);
  store_release(header->stamp, seq + 1);
  ring_bell(op.peer);
  next_out_[size_t(op.peer)] = seq + slots;
  op.written = true;
  op.seq = seq;
  op.done = is_inline(op.bytes);
  return true;
}

Pending ShmMailbox::recv(int peer, uint64_t tag, void* data, size_t bytes) {
  Op* op = make_op(true, peer, tag, data, bytes);
  // Messages already here come first: one (source, tag)'s keep their order.
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (it->tag != tag || (peer >= 0 && it->source != peer)) continue;
    deliver(*op, it->source, it->data.size(),
            [&](void* into) { copy(MemoryType::host, into, it->data.data(), it->data.size()); });
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

void ShmMailbox::copy_out(const Ring& r, uint64_t seq, void* into, size_t bytes) const {
  for (size_t at = 0, i = 0; at < bytes; at += kSlotPayload, ++i) {
    copy(MemoryType::host, bytes_at(into, at), r.slots[(seq + i) % kMailboxSlots] + kMailboxHeaderBytes,
         std::min(kSlotPayload, bytes - at));
  }
}

void ShmMailbox::read_large(int source, uint64_t remote_address, void* into, size_t bytes) const {
  const auto* from = reinterpret_cast<const void*>(remote_address);
  if (source == rank_) {
    copy(MemoryType::host, into, from, bytes);  // a send to oneself
  } else {
    peers_.read_peer(source, from, into, bytes);
  }
}

bool ShmMailbox::drain(int sender) {
  Ring& r = ring(sender, rank_);
  bool arrived = false;
  for (;;) {
    const uint64_t seq = next_in_[size_t(sender)];
    const std::byte* slot = r.slots[seq % kMailboxSlots];
    const auto* header = reinterpret_cast<const SlotHeader*>(slot);
    if (load_acquire(header->stamp) != seq + 1) return arrived;
    const uint64_t tag = header->tag, address = header->address;
    const size_t bytes = header->bytes;
    const auto copy = [&](void* into) {
      if (is_inline(bytes)) {
        copy_out(r, seq, into, bytes);
      } else {
        read_large(sender, address, into, bytes);
      }
    };
    // The earliest posted receive that takes it.
    auto match = std::find_if(receives_.begin(), receives_.end(),
                              [&](const Op* op) { return op->tag == tag && (op->peer == sender || op->peer < 0); });
    if (match != receives_.end()) {
      Op* op = *match;
      receives_.erase(match);
      --(op->peer >= 0 ? receives_from_[size_t(sender)] : receives_from_any_);
      deliver(*op, sender, bytes, copy);
    } else {
      // Copied out (read, if large) so the slots free and the sender's call completes.
      Unexpected u{sender, tag, std::vector<std::byte>(bytes)};
      if (bytes > 0) copy(u.data.data());
      unexpected_.push_back(std::move(u));
    }
    next_in_[size_t(sender)] = seq + slots_for(bytes);
    store_release(r.consumed, seq + slots_for(bytes));
    ring_bell(sender);  // its large send completes, or its ring has room
    arrived = true;
  }
}

void ShmMailbox::progress() {
  for (size_t peer = 0; waiting_sends_ > 0 && peer < waiting_.size(); ++peer) {
    auto& queue = waiting_[peer];
    while (!queue.empty() && try_write(*queue.front())) {
      queue.pop_front();
      --waiting_sends_;
    }
  }
  if (receives_.empty()) return;
  for (int sender = 0; sender < size_; ++sender) {
    if ((receives_from_any_ > 0 || receives_from_[size_t(sender)] > 0)) drain(sender);
  }
}

bool ShmMailbox::poll(Pending& p, int* source) {
  if (p.done()) return true;
  Op* op = static_cast<Op*>(p.handle());
  if (!op->done && op->written) op->done = load_acquire(ring(rank_, op->peer).consumed) > op->seq;
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
