// Endpoints: wiring UCX and shared memory up through the store, the memory
// types calls may use, and the transport point-to-point messages take.
#include "transport/endpoints.h"

#include <thread>

#include "src/subsystem_log.h"
#include "tandem/reduce.h"

namespace tandem {
namespace {

// Point-to-point over UCX, tags: the send_recv signature, sequence number 0,
// the sender, the caller's tag.
Tag message_tag(int sender, uint32_t tag) {
  const Tag signature = Description{Collective::send_recv}.signature();
  return (signature << (kSeqBits + kRankBits + kLocalBits)) | (Tag(sender) << kLocalBits) | tag;
}

}  // namespace

bool ranks_outnumber_cores(const CommOptions& options) {
  return options.local_size > int(std::thread::hardware_concurrency());
}

Endpoints::Endpoints(CommContext& ctx)
    : topology(make_topology({"this host"}, 0)), oversubscribed(ranks_outnumber_cores(ctx.opts)), ctx_(ctx) {}

void Endpoints::connect(const Algorithms& algorithms, Deadline deadline) {
  CommOptions& opts = ctx_.opts;
  KeyValueStore& store = *ctx_.store;
  // Interface selection (netif.h): every rank takes part; it logs the decision.
  if (!opts.interface_chosen) network = select_interface(store, opts, deadline);
  if (!opts.ucx_net_devices_pinned && !network.chosen.empty()) opts.ucx_net_devices = network.chosen;

  ucx = std::make_unique<UcxTransport>(opts.rank, opts.size, opts.ucx_peer_error_handling, opts.ucx_net_devices,
                                       opts.ucx_keepalive_pinned ? std::chrono::milliseconds(0) : opts.heartbeat);
  store.set(ctx_.key("ucx/" + std::to_string(opts.rank)), ucx->worker_address(), deadline);
  for (int p = 0; p < opts.size; ++p) {
    ucx->connect(p, store.get(ctx_.key("ucx/" + std::to_string(p)), deadline));
  }
  learn_topology(deadline);
  map_shared_memory(algorithms.shared_bytes(), deadline);
  transports = ucx->describe();
  if (shm) transports += cma ? " + shared memory, cross-memory attach" : " + shared memory";
  if (mailbox) transports += "; send/recv through shared memory";
  if (host_shm) transports += " + shared memory within each host";
}

void Endpoints::close(bool failed) {
  if (ucx && failed) ucx->close_endpoints(Clock::now() + std::chrono::seconds(2), /*force=*/true);
  ucx.reset();
  shm.reset();
  host_shm.reset();
  huge_pages.reset();
  allocations.reset();
}

void Endpoints::note_host_buffers(const Call& call) {
  // allocate_shared memory is the caller's own choice of pages: left alone.
  const auto note = [&](const void* p, size_t bytes) {
    SharedRef ref;
    if (HugePages::holds_one(p, bytes) && !allocations->find(p, bytes, ref)) huge_pages->note(p, bytes);
  };
  if (call.op == Op::group) {
    for (const P2POp& m : call.group) note(m.data, m.count * dtype_size(m.dtype));
    return;
  }
  const int rank = ctx_.opts.rank, size = ctx_.opts.size;
  const size_t element = dtype_size(call.dtype);
  note(call.input, input_extent(call, rank, size) * element);
  note(call.output, output_extent(call, rank, size) * element);
}

MemoryType Endpoints::memory_type(const CollectiveOptions& o) const {
  if (o.memory == MemoryType::cuda) {
    if (!cuda_kernels_built()) {
      throw InvalidArgument("CUDA buffers need tandem built with TANDEM_WITH_CUDA=ON");
    }
    if (ucx && !ucx->supports_cuda_memory()) {
      throw InvalidArgument(
          "CUDA buffers need a UCX with CUDA support (this UCX reports host memory only); "
          "stage through host buffers or install a CUDA-enabled UCX");
    }
  }
  return o.memory;
}

// Every rank publishes its host identity (CommOptions::host_id, else boot id,
// hostname and namespaces) and reads everyone's: the same topology everywhere.
void Endpoints::learn_topology(Deadline deadline) {
  const CommOptions& opts = ctx_.opts;
  ctx_.store->set(ctx_.key("topology/" + std::to_string(opts.rank)),
                  opts.host_id.empty() ? host_identity() : opts.host_id, deadline);
  std::vector<std::string> ids;
  for (int p = 0; p < opts.size; ++p)
    ids.push_back(ctx_.store->get(ctx_.key("topology/" + std::to_string(p)), deadline));
  topology = make_topology(ids, opts.rank);
}

// The ranks of one host map each other's segments. Every rank of the host
// reaches the same verdict from the same store keys: all of them willing,
// with equal segment sizes, and every segment mapped everywhere; or no
// shared memory on that host. A rank that turned it off still answers, so
// the others neither wait for it nor disagree with it. All ranks on this
// host: the segments serve every collective (shm); else the hierarchical
// all-reduce's intra-host steps (host_shm).
void Endpoints::map_shared_memory(size_t bytes, Deadline deadline) {
  const CommOptions& opts = ctx_.opts;
  KeyValueStore& store = *ctx_.store;
  const std::string me = std::to_string(opts.rank);
  const bool willing = bytes > 0;  // 0: the algorithms want none (e.g. TANDEM_SHM=0)
  // Segment sizes must agree too: they fix where every slot lies.
  const std::string here = willing ? std::to_string(bytes) : "off";
  store.set(ctx_.key("shm/size/" + me), here, deadline);
  const std::vector<int>& group = topology.ranks[size_t(topology.host())];
  if (!willing || group.size() < 2) return;
  const bool everyone = int(group.size()) == opts.size;
  for (int p : group) {
    const std::string theirs = store.get(ctx_.key("shm/size/" + std::to_string(p)), deadline);
    if (theirs == here) continue;
    // The lowest other rank of the host says why.
    if (opts.rank == (p == group[0] ? group[1] : group[0])) {
      if (theirs == "off") {
        subsystem_log(Subsystem::transport)
            .warn("tandem: rank {} has shared memory off (TANDEM_SHM=0); its host's ranks go through UCX only", p);
      } else {
        subsystem_log(Subsystem::transport)
            .warn(
                "tandem: rank {} sizes its shared segment differently (TANDEM_SHM_CHUNK_BYTES must agree); "
                "its host's ranks go through UCX only",
                p);
      }
    }
    return;
  }
  std::string why;
  std::unique_ptr<SharedSegmentSet> set;
  try {
    set = std::make_unique<SharedSegmentSet>(opts.rank, opts.size, bytes);
  } catch (const Error& e) {
    why = "rank " + me + " could not create its segment: " + e.what();
  }
  store.set(ctx_.key("shm/at/" + me), set ? set->locator() : "", deadline);
  for (size_t i = 0; i < group.size() && why.empty(); ++i) {
    const int p = group[i];
    if (p == opts.rank) continue;
    const std::string locator = store.get(ctx_.key("shm/at/" + std::to_string(p)), deadline);
    if (locator.empty()) break;  // that rank says why itself
    const std::string failed = set->map_peer(p, locator);
    if (!failed.empty()) why = "rank " + me + " cannot map rank " + std::to_string(p) + "'s segment: " + failed;
  }
  bool cma_here = why.empty() && everyone;
  for (size_t i = 0; i < group.size() && cma_here; ++i) cma_here = group[i] == opts.rank || set->cma_works(group[i]);
  store.set(ctx_.key("shm/ok/" + me), !why.empty() ? why : cma_here ? "ok+cma" : "ok", deadline);
  bool cma_everywhere = true;
  for (int p : group) {
    const std::string verdict = store.get(ctx_.key("shm/ok/" + std::to_string(p)), deadline);
    if (verdict.rfind("ok", 0) != 0) {
      if (opts.rank == group[0])
        subsystem_log(Subsystem::transport)
            .warn("tandem: shared memory off, collectives go through UCX only ({})", verdict);
      return;
    }
    cma_everywhere = cma_everywhere && verdict == "ok+cma";
  }
  if (everyone) {
    shm = std::move(set);
    cma = cma_everywhere;
    if (cma && opts.huge_pages) huge_pages = std::make_unique<HugePages>();
    open_mailbox(deadline);
    return;
  }
  host_shm = std::move(set);
  host_view.bytes = bytes;
  for (int p : group) host_view.segment.push_back(host_shm->view().segment[size_t(p)]);
}

// Ranks on one host (the collectives' segments mapped, cross-memory attach
// allowed) map each other's mailbox segment too; any failure leaves every
// rank on UCX, as all must agree on the path (messages of one pair never mix paths).
void Endpoints::open_mailbox(Deadline deadline) {
  const CommOptions& opts = ctx_.opts;
  KeyValueStore& store = *ctx_.store;
  // The mailbox copies host memory only: a UCX that takes device buffers keeps send/recv.
  if (!cma || ucx->supports_cuda_memory()) return;
  const std::string me = std::to_string(opts.rank);
  std::string why;
  std::unique_ptr<SharedSegmentSet> set;
  try {
    set = std::make_unique<SharedSegmentSet>(opts.rank, opts.size, ShmMailbox::segment_bytes(opts.size));
  } catch (const Error& e) {
    why = "rank " + me + " could not create its mailbox segment: " + e.what();
  }
  store.set(ctx_.key("p2p/at/" + me), set ? set->locator() : "", deadline);
  for (int p = 0; p < opts.size && why.empty(); ++p) {
    if (p == opts.rank) continue;
    const std::string locator = store.get(ctx_.key("p2p/at/" + std::to_string(p)), deadline);
    if (locator.empty()) {
      why = "rank " + std::to_string(p) + " has no mailbox segment";
      break;
    }
    const std::string failed = set->map_peer(p, locator);
    if (!failed.empty()) why = "rank " + me + " cannot map rank " + std::to_string(p) + "'s mailbox: " + failed;
  }
  store.set(ctx_.key("p2p/ok/" + me), why.empty() ? "ok" : why, deadline);
  for (int p = 0; p < opts.size; ++p) {
    const std::string verdict = store.get(ctx_.key("p2p/ok/" + std::to_string(p)), deadline);
    if (verdict != "ok") {
      if (opts.rank == 0) subsystem_log(Subsystem::transport).warn("tandem: send/recv go through UCX ({})", verdict);
      return;
    }
  }
  mailbox_shm = std::move(set);
  mailbox = std::make_unique<ShmMailbox>(opts.rank, opts.size, mailbox_shm->view(), *shm, opts.p2p_stream_max_bytes,
                                         opts.p2p_timed);
}

Pending Endpoints::post_message(const P2POp& op) {
  const size_t bytes = op.count * dtype_size(op.dtype);
  if (mailbox) {
    return op.kind == P2POp::send ? mailbox->send(op.peer, op.tag, op.data, bytes)
                                  : mailbox->recv(op.peer, op.tag, op.data, bytes);
  }
  if (op.kind == P2POp::send) return ucx->send(op.peer, message_tag(ctx_.rank(), op.tag), op.data, bytes);
  if (op.peer == kAnySource) return ucx->recv(-1, message_tag(0, op.tag), ~kSenderMask, op.data, bytes);
  return ucx->recv(op.peer, message_tag(op.peer, op.tag), op.data, bytes);
}

bool Endpoints::poll_message(Pending& m, int* source) {
  if (mailbox) return mailbox->poll(m, source);
  Tag sender = 0;
  if (!ucx->poll(m, &sender)) return false;
  *source = int((sender & kSenderMask) >> kLocalBits);
  return true;
}

void Endpoints::cancel_message(Pending& m) {
  if (mailbox) {
    mailbox->cancel(m);
  } else {
    ucx->cancel(m);
  }
}

void Endpoints::progress_messages() {
  if (mailbox) {
    mailbox->progress();
  } else {
    ucx->progress();
  }
}

void Endpoints::wake_sleeper() {
  if (mailbox) {
    mailbox->ring_bell(ctx_.rank());
  } else {
    ucx->wake();
  }
}

}  // namespace tandem
