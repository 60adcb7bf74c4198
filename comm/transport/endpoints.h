// Endpoints: how this rank reaches the others. UCX to every rank; where all
// ranks share this host, shared-memory segments, cross-memory attach, the
// send/recv mailbox and shared allocations; where ranks span hosts, this
// host's ranks' segments. Which ranks share a host, and what was chosen.
// Wired up through the store (connect), closed by close().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "call_description.h"
#include "comm_context.h"
#include "tandem/call.h"
#include "tandem/netif.h"
#include "transport/huge_pages.h"
#include "transport/shared_segments.h"
#include "transport/shm_mailbox.h"
#include "transport/ucx_transport.h"

namespace tandem {

// The bits of a point-to-point message's UCX tag that name its sender.
inline constexpr Tag kSenderMask = Tag(kMaxRanks - 1) << kLocalBits;

class Endpoints {
 public:
  explicit Endpoints(CommContext& ctx);
  Endpoints(const Endpoints&) = delete;
  Endpoints& operator=(const Endpoints&) = delete;

  // Interface choice, UCX to every rank, who shares this host, their shared
  // memory and the mailbox; the algorithms say how much shared memory they want.
  void connect(const Algorithms& algorithms, Deadline deadline);
  // Closes UCX (at once after a failure: a peer may never acknowledge a
  // flush), then unmaps the shared memory.
  void close(bool failed);

  // The memory type of a call's buffers, refused when this build or UCX cannot move it.
  MemoryType memory_type(const CollectiveOptions& o) const;

  // Hands a call's host buffers to HugePages, where ranks copy each other's
  // memory by cross-memory attach, until its collapses took their budget.
  void note_buffers(const Call& call) {
    if (!huge_pages || huge_pages->spent() || call.options.memory != MemoryType::host) return;
    // Most calls are too small to hold a huge page whatever their dtype (8
    // bytes at most): they return here, before any extent is worked out.
    const bool blocks = call.op == Op::group || !call.send.counts.empty() || !call.recv.counts.empty();
    if (blocks || call.count * size_t(ctx_.opts.size) * 8 >= HugePages::kHugePage) note_host_buffers(call);
  }

  // Point-to-point messages, on the mailbox when there is one, else on UCX.
  Pending post_message(const P2POp& op);
  bool poll_message(Pending& m, int* source);  // *source: who sent a received one
  void cancel_message(Pending& m);
  void progress_messages();
  // Wakes an engine sleeping on the mailbox's doorbell or UCX's event fd.
  void wake_sleeper();
  // Whether a wait on the mailbox yields the core instead of sleeping on the
  // doorbell: ranks no more than cores, until `until` (kMailboxYieldWindow).
  bool mailbox_yields(Clock::time_point until) const { return mailbox && !oversubscribed && Clock::now() < until; }

  std::unique_ptr<UcxTransport> ucx;
  Topology topology;                               // which ranks share a host
  std::unique_ptr<SharedSegmentSet> shm;           // when all ranks share this host
  bool cma = false;                                // and every rank may copy from every other's memory
  std::unique_ptr<SharedSegmentSet> host_shm;      // when ranks span hosts: this host's ranks' segments
  SharedSegments host_view;                        // host_shm's segments by local rank
  std::unique_ptr<SharedSegmentSet> mailbox_shm;   // point-to-point through shared memory
  std::unique_ptr<ShmMailbox> mailbox;             // (when shm and cma are: open_mailbox)
  std::unique_ptr<SharedAllocations> allocations;  // allocate_shared()
  std::unique_ptr<HugePages> huge_pages;           // when cma is, unless TANDEM_HUGE_PAGES=0
  // Bytes the shared-memory collectives read and wrote; only the running call writes it.
  std::atomic<uint64_t> shm_traffic{0};
  std::string transports;       // what was chosen, for transport_summary()
  NetifDecision network;        // the interface selection's decision
  bool oversubscribed = false;  // more ranks on this host than cores

 private:
  void learn_topology(Deadline deadline);
  void map_shared_memory(size_t bytes, Deadline deadline);
  void open_mailbox(Deadline deadline);
  void note_host_buffers(const Call& call);

  CommContext& ctx_;
};

}  // namespace tandem
