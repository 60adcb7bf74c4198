// Point-to-point messages between ranks of one host through shared memory:
// a single-producer ring of slots per ordered pair of ranks, small messages
// inline, larger ones read by the receiver from the sender's buffer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <vector>

#include "tandem/shared_memory.h"
#include "tandem/transport.h"

namespace tandem {

class SharedSegmentSet;

// Sends and receives as posted messages (Pending, like UcxTransport's): a
// message of up to `stream_max_bytes` streams through the pair's slots,
// the sender writing slots as they free and the receiver copying each one
// as it lands, and the send completes once its last slot is written; a
// larger one is read by the receiver from the sender's buffer (cross-memory
// attach) and its send completes once read. Between 16 KiB and
// `stream_max_bytes`, where either way may win by 3x depending on the host's
// state, a timed mailbox lets the receivers time both on the messages
// themselves, per size class, and every sender takes the verdict pooled over
// all pairs (docs/algorithms.md, 'shm: point-to-point, timed'); the way a
// message takes travels in its first slot. Receives match by (source, tag)
// in the order they were posted, any source included; a message that
// arrives before its receive waits in an unexpected list (a receive posted
// while it streams takes over the rest), so messages of one (source, tag)
// never overtake each other. A message to be read waits in the ring instead
// until a receive from its sender is posted (drain's `hold_reads`). Used only
// by the thread that drives the communicator's point-to-point calls.
class ShmMailbox {
 public:
  // `rings`: every rank's mailbox segment, segment_bytes(size) each, zero-filled.
  // `peers`: cross-memory copies from the ranks' own addresses.
  // `stream_max_bytes`: CommOptions::p2p_stream_max_bytes (at least kMailboxInSlotsBytes).
  // `timed`: CommOptions::p2p_timed.
  ShmMailbox(int rank, int size, const SharedSegments& rings, const SharedSegmentSet& peers, size_t stream_max_bytes,
             bool timed);
  ~ShmMailbox();
  ShmMailbox(const ShmMailbox&) = delete;
  ShmMailbox& operator=(const ShmMailbox&) = delete;

  static size_t segment_bytes(int size);

  Pending send(int peer, uint64_t tag, const void* data, size_t bytes);
  // peer -1: from any rank.
  Pending recv(int peer, uint64_t tag, void* data, size_t bytes);
  // Writes queued sends whose ring has room and delivers arrived messages.
  void progress();
  // Whether a message whose tag matches `tag` under `mask` has arrived
  // (*source: its sender); what arrived unasked waits for its receive.
  bool probe(uint64_t tag, uint64_t mask, int* source);
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

  // The receiver's record of one sender's trials in a size class this round
  // (public for the verdict's tests).
  struct Trials {
    uint64_t round = UINT64_MAX;
    uint64_t first_ns = 0, first_pair = UINT64_MAX;  // the first trial of the pair under way
    uint64_t pairs = 0;
    float read_ratio[kTrialMaxPairs] = {};  // by pair: reading's time over streaming's
  };
  // The median of the pairs' ratios: one trial that met a receiver busy
  // elsewhere does not decide, as it would a sum.
  static float median_ratio(const Trials& t);
  // The verdict for a size class, pooled over every ordered pair's median
  // (0: none yet): read when their geometric mean is under 1. No margin:
  // every trial includes the receiver's lag, which pulls the ratios
  // toward 1 (0.4-1.2 where reading ran 2.4x faster). Every
  // rank decides alike from the same figures: an exchange or a ring whose
  // pairs went different ways waits on itself (docs/algorithms.md, 'shm:
  // point-to-point, timed').
  static bool read_won(const float* medians, size_t n);
  // The pooled figure behind it: the geometric mean of the medians in (1: none).
  static double pooled_ratio(const float* medians, size_t n);

  // A message's place in its size class's schedule to one receiver: in a
  // round's opening (an untimed read of the first round's, or a trial: its
  // number in the opening and its way) or after it (the verdict's way).
  struct Scheduled {
    uint64_t round = 0;
    bool opening = false, trial = false;
    uint64_t number = 0;  // a trial's, in its round's opening
    bool read = false;    // the way, in an opening
  };
  // The n-th message (from 0) of size class c to one receiver.
  static Scheduled schedule(size_t c, uint64_t n);

 private:
  struct Op;
  struct Ring;
  // The sender's, per size class: the pooled verdict as of a generation of the medians.
  struct Choice {
    uint64_t generation = 0;
    bool read = true;      // reading until a verdict, as the first round opens
    bool settled = false;  // reading clearly won (clear_win)
  };
  struct Unexpected {
    int source;
    uint64_t tag;
    size_t bytes;
    std::unique_ptr<std::byte[]> data;  // not zeroed first: the message overwrites it
    bool whole = true;                  // false while it still streams in
  };
  // The message a sender is streaming to this rank, copied slot by slot.
  struct Stream {
    bool active = false;
    uint64_t head = 0;           // its first slot's sequence number
    size_t bytes = 0, at = 0;    // its size, and how much has arrived
    uint64_t address = 0;        // 0: it is in the slots; else the sender's buffer, read by cross-memory attach
    uint64_t slots = 0;          // the slots it takes, and
    uint64_t slots_in = 0;       // how many of them have been copied
    Op* op = nullptr;            // the receive it lands in, or
    Unexpected* held = nullptr;  // the unexpected message it fills
    bool skip = false;           // its payload is passed over (its receive's size differs, or it was cancelled)
    bool trial = false;          // a timed trial: its place in the round's opening, and its sender's post time
    uint64_t place = 0, posted_ns = 0;
  };

  // The slots a message takes: in the slots, as many as its payload fills.
  static uint64_t slots_for(size_t bytes, bool by_address);
  // The sender's way for op (true: read from its buffer); marks a trial.
  bool choose_read(Op& op);
  // The pooled verdict for size class c, computed again when a median changed.
  const Choice& class_choice(size_t c);
  // A trial message has arrived: the receiver counts it and, after its
  // round's last pair (or a clear early lead), publishes the verdict.
  void record_trial(int sender, const Stream& st);
  Op* make_op(bool is_recv, int peer, uint64_t tag, void* data, size_t bytes);
  void recycle(Op* op);
  Ring& ring(int sender, int receiver) const;
  // Writes as many of op's slots as the ring has room for; true once all are in.
  bool try_write(Op& op);
  // Delivers what `sender` has written for this rank; true if anything
  // arrived. `hold_reads`: a message to read from the sender's buffer waits
  // in the ring while no receive from the sender is posted (probe takes it).
  bool drain(int sender, bool hold_reads);
  // Starts the message whose first slot is `seq`: matched to a receive, or held.
  void start_stream(int sender, uint64_t seq);
  // Copies the slots of `sender`'s stream that have landed; true once it is whole.
  bool copy_stream(int sender);
  // Completes a receive with a message of `bytes` (copy(into) fetches it), or records the mismatch.
  template <class Copy>
  void deliver(Op& op, int source, size_t bytes, Copy copy);
  // A large message from `source`'s own memory into this rank's.
  void read_large(int source, uint64_t remote_address, void* into, size_t bytes) const;
  void forget(Op* op);

  int rank_, size_;
  size_t stream_max_bytes_;
  bool timed_;
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
  std::list<Unexpected> unexpected_;  // arrived before their receive, in arrival order
  std::vector<Stream> streams_;       // by sender
  size_t active_streams_ = 0;
  std::vector<Op*> spare_;       // finished operations, reused (no allocation per message)
  std::vector<uint64_t> sent_;   // by receiver and size class: messages that could be timed
  std::vector<Choice> choices_;  // by size class
  std::vector<Trials> trials_;   // by sender and size class
};

// A message in the slots has its payload after each slot's header.
// Streaming, the receiver copies a slot while the sender fills the next, so
// two copies cost about one (docs/algorithms.md, 'shm: point-to-point').
constexpr size_t kMailboxSlotBytes = 8192 + 64;
constexpr size_t kMailboxHeaderBytes = 32;  // up to 32-byte messages share the header's cache line
constexpr size_t kMailboxSlots = 16;
// Messages up to two slots' payload always go through the slots: a
// cross-memory read's system call costs more.
constexpr size_t kMailboxInSlotsBytes = 2 * (kMailboxSlotBytes - kMailboxHeaderBytes);
// A read from a sender's buffer goes in pieces of the ring's size while the
// reader's own sends wait for room.
constexpr size_t kMailboxReadPieceBytes = kMailboxSlots * (kMailboxSlotBytes - kMailboxHeaderBytes);
// Timed messages fall in size classes by powers of two from 16 KiB; each
// class's round of messages to one receiver opens with its trials: the
// first round, kMailboxFirstRoundMessages, with kFirstOpeningPairs.
constexpr size_t kMailboxClasses = 16;
constexpr uint64_t kMailboxFirstRoundMessages = 64;
// Messages per trial, the last timed (ShmMailbox::schedule).
constexpr uint64_t kMailboxTrialMessages = 2;
// Untimed reads before the first round's pair, whose timed read is then the
// fourth from the buffer: the first two reads from a buffer took twice a
// later one's time (1 MiB, process_vm_readv alone), the third still 10-40 %
// more in a run.
constexpr uint64_t kMailboxWarmReads = 2;
static_assert(kMailboxWarmReads + 2 * kMailboxTrialMessages * kFirstOpeningPairs < kMailboxFirstRoundMessages);
constexpr uint64_t kMailboxRoundMessages = 1 << 14;

}  // namespace tandem
