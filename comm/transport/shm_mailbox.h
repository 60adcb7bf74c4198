// Point-to-point messages between ranks of one host through shared memory:
// a single-producer ring of slots per ordered pair of ranks, small messages
// inline, larger ones read by the receiver from the sender's buffer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "tandem/shared_memory.h"
#include "tandem/transport.h"

namespace tandem {

class SharedSegmentSet;

// Sends and receives as posted messages (Pending, like UcxTransport's): a
// send of up to kMailboxInlineBytes completes once copied into its slots; a
// larger one once the receiver has read it (cross-memory attach). Receives
// match by (source, tag) in the order they were posted, any source included;
// a message that arrives before its receive waits in an unexpected list, so
// messages of one (source, tag) never overtake each other. Used only by the
// thread that drives the communicator's point-to-point calls.
class ShmMailbox {
 public:
  // `rings`: every rank's mailbox segment, segment_bytes(size) each, zero-filled.
  // `peers`: cross-memory copies from the ranks' own addresses.
  ShmMailbox(int rank, int size, const SharedSegments& rings, const SharedSegmentSet& peers);
  ~ShmMailbox();
  ShmMailbox(const ShmMailbox&) = delete;
  ShmMailbox& operator=(const ShmMailbox&) = delete;

  static size_t segment_bytes(int size);

  Pending send(int peer, uint64_t tag, const void* data, size_t bytes);
  // peer -1: from any rank.
  Pending recv(int peer, uint64_t tag, void* data, size_t bytes);
  // Writes queued sends whose ring has room and delivers arrived messages.
  void progress();
  // True once p completed (receives: *source says from whom). Throws
  // CollectiveMismatch when a message's size differs from its receive's, and
  // PeerFailure when the sender's process is gone.
  bool poll(Pending& p, int* source);
  // Forgets an unfinished message (the call failed).
  void cancel(Pending& p);

  // Sleeping until a peer writes to this rank or reads from it: announce,
  // check for work (progress and poll), then sleep unless there was some.
  // A peer that wrote just before the announcement may not ring: the
  // timeout bounds that wait.
  uint32_t announce_sleep() const;
  void sleep(uint32_t bell, std::chrono::microseconds timeout) const;
  // Wakes `rank` if it sleeps (this rank too: new work for its engine). Any thread.
  void ring_bell(int rank) const;

 private:
  struct Op;
  struct Ring;
  struct Unexpected {
    int source;
    uint64_t tag;
    std::vector<std::byte> data;
  };

  Op* make_op(bool is_recv, int peer, uint64_t tag, void* data, size_t bytes);
  void recycle(Op* op);
  Ring& ring(int sender, int receiver) const;
  bool try_write(Op& op);
  // Delivers what `sender` has written for this rank; true if anything arrived.
  bool drain(int sender);
  // Completes a receive with a message of `bytes` (copy(into) fetches it), or records the mismatch.
  template <class Copy>
  void deliver(Op& op, int source, size_t bytes, Copy copy);
  // An inline message's payload, from the slots at `seq` on.
  void copy_out(const Ring& r, uint64_t seq, void* into, size_t bytes) const;
  // A large message from `source`'s own memory into this rank's.
  void read_large(int source, uint64_t remote_address, void* into, size_t bytes) const;
  void forget(Op* op);

  int rank_, size_;
  const SharedSegments& rings_;
  const SharedSegmentSet& peers_;
  std::vector<uint64_t> next_out_;        // by receiver: the sequence number of this rank's next message
  std::vector<uint64_t> next_in_;         // by sender: the sequence number of the next message to read
  std::vector<uint64_t> consumed_seen_;   // by receiver: its `consumed` when last read
  std::vector<std::deque<Op*>> waiting_;  // by receiver: sends posted but not yet written (ring full)
  size_t waiting_sends_ = 0;
  std::deque<Op*> receives_;           // posted, unmatched, in posting order
  std::vector<size_t> receives_from_;  // by sender: how many of receives_ name it
  size_t receives_from_any_ = 0;
  std::deque<Unexpected> unexpected_;  // arrived before their receive, in arrival order
  std::vector<Op*> spare_;             // finished operations, reused (no allocation per message)
};

// Messages up to kMailboxInlineBytes travel inline, over as many consecutive
// slots as they fill (two at most); larger ones are read from the sender's
// memory. Up to 16 KiB the two copies cost less than a cross-memory read's
// system call (2 ranks exchanging, medians of 6 alternations: 8 KiB 1.5 us
// inline against 2.1, 16 KiB 2.8 against 3.1; an older host, 4 KiB 3 us
// against 10); from 32 KiB the one copy wins (32 KiB 4.0 against 6.4 inline,
// 64 KiB 6.2 against 11.5: the receiver starts only once a message is whole).
constexpr size_t kMailboxSlotBytes = 8192 + 64;
constexpr size_t kMailboxHeaderBytes = 32;  // up to 32-byte messages share the header's cache line
constexpr size_t kMailboxSlots = 16;
constexpr size_t kMailboxInlineSlots = 2;
constexpr size_t kMailboxInlineBytes = kMailboxInlineSlots * (kMailboxSlotBytes - kMailboxHeaderBytes);

}  // namespace tandem
