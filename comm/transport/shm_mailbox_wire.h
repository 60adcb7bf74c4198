// The mailbox's layout in shared memory (the doorbell, the rings and their
// slots) and its posted operations, shared by shm_mailbox.cc and
// shm_mailbox_timed.cc.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "shm_mailbox.h"

namespace tandem {

// A message's first slot carries all of it; the others only their stamp.
struct SlotHeader {
  uint64_t stamp;  // the slot's sequence number + 1 once its payload is in
  uint64_t tag;
  uint64_t bytes;    // | kTrialBit: a timed trial, its stamp in Ring::trials
  uint64_t address;  // 0: the payload is in the slots from this one on; else there in the sender (the sender decides)
};
static_assert(sizeof(SlotHeader) <= kMailboxHeaderBytes);
constexpr uint64_t kTrialBit = uint64_t(1) << 63;

// A trial message's post time on the sender (trial_clock_ns) and its place:
// round << 32 | trial number.
struct TrialStamp {
  uint64_t posted_ns;
  uint64_t place;
};

inline size_t size_class(size_t bytes) { return std::min<size_t>(std::bit_width(bytes >> 14), kMailboxClasses - 1); }
// Trials per class in a round: as for its smallest message, and one pair in
// the first round.
inline uint64_t class_pairs(size_t c, uint64_t round) {
  return round == 0 ? kFirstOpeningPairs : trial_pairs(size_t(1) << (13 + c));
}

inline uint64_t load_acquire(const uint64_t& x) {
  return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire);
}
inline void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }
inline void* bytes_at(void* p, size_t offset) { return static_cast<std::byte*>(p) + offset; }

constexpr size_t kSlotPayload = kMailboxSlotBytes - kMailboxHeaderBytes;

// The start of each rank's mailbox segment: whether the rank sleeps, and the
// futex its peers ring after giving it something to do.
struct Doorbell {
  alignas(64) uint32_t sleeping;
  uint32_t bell;
  // Rank 0's only: by size class, how many medians were published (any rank adds).
  alignas(64) uint64_t generations[kMailboxClasses];
};

inline Doorbell& doorbell(const SharedSegments& segments, int rank) {
  return *reinterpret_cast<Doorbell*>(segments.segment[size_t(rank)]);
}

struct ShmMailbox::Op {
  bool is_recv;
  int peer;  // receives: -1 for any source
  uint64_t tag;
  void* data;
  size_t bytes;
  bool done = false;
  uint64_t seq = 0;       // sends: the first slot's sequence number
  uint64_t slots_in = 0;  // sends: how many of its slots are written
  int source = -1;        // receives: who sent the message
  size_t arrived_bytes = 0;
  // sends: read from the sender's buffer (choose_read); once written, done when the receiver passes `seq`
  bool read = false;
  bool trial = false;  // sends: a timed trial at `place`
  uint64_t posted_ns = 0, place = 0;
};

// In the sender's segment, one per receiver. The receiver writes `consumed`
// (messages it has read) and the medians, the sender everything else.
struct ShmMailbox::Ring {
  alignas(64) uint64_t consumed;
  // By size class: its last round's median ratio (float bits); 0: none yet.
  alignas(64) uint64_t medians[kMailboxClasses];
  alignas(64) TrialStamp trials[kMailboxSlots];  // by a trial message's first slot
  alignas(64) std::byte slots[kMailboxSlots][kMailboxSlotBytes];
};

}  // namespace tandem
