// Wire-up: through the store, check every rank runs the same build, connect
// UCX, learn which ranks share a host and map their shared memory.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>

#include "communicator_impl.h"

#ifndef TANDEM_BUILD_ID
#define TANDEM_BUILD_ID "unknown"
#endif

namespace tandem {

// Counts this rank in at a store barrier; returns the key set once all have arrived.
std::string Communicator::Impl::arrive(const std::string& barrier, Deadline deadline) {
  const std::string k = key("barrier/" + barrier);
  if (store->add(k, 1, deadline) == opts.size) store->set(k + "/done", "1", deadline);
  return k + "/done";
}

void Communicator::Impl::store_barrier(const std::string& name, Deadline deadline) {
  store->wait({arrive(name, deadline)}, deadline);
}

void Communicator::Impl::connect() {
  const Deadline deadline = Clock::now() + opts.connect_timeout;
  if (opts.store) {
    store = opts.store;
  } else {
    auto [host, port] = parse_host_port(opts.store_address);
    if (opts.host_store) {
      StoreServerOptions so;
      so.host = host;
      so.port = port;
      so.secret = opts.secret;
      server = std::make_unique<StoreServer>(so);
    }
    store = std::make_shared<StoreClient>(host, port, deadline, opts.secret);
  }
  store->hello(opts.rank, deadline);
  char hostname[256] = "?";
  gethostname(hostname, sizeof hostname - 1);
  store->set(key("host/" + std::to_string(opts.rank)),
             "host " + std::string(hostname) + ", pid " + std::to_string(getpid()), deadline);
  check_versions(deadline);
  if (opts.heartbeat.count() > 0) start_heartbeat(deadline);
  if (opts.host_store) store->set(key("store_host"), std::to_string(opts.rank), deadline);
  // Interface selection (netif.h): every rank takes part; it logs the decision.
  network = select_interface(*store, opts, deadline);
  if (!opts.ucx_net_devices_pinned && !network.chosen.empty()) opts.ucx_net_devices = network.chosen;

  ucx = std::make_unique<UcxTransport>(opts.rank, opts.size, opts.ucx_peer_error_handling, opts.ucx_net_devices,
                                       opts.ucx_keepalive_pinned ? std::chrono::milliseconds(0) : opts.heartbeat);
  store->set(key("ucx/" + std::to_string(opts.rank)), ucx->worker_address(), deadline);
  for (int p = 0; p < opts.size; ++p) {
    ucx->connect(p, store->get(key("ucx/" + std::to_string(p)), deadline));
  }
  if (auto h = store->try_get(key("store_host"), deadline)) store_host_rank = std::atoi(h->c_str());
  learn_topology(deadline);
  map_shared_memory(deadline);
  store_barrier("connected", deadline);
  transports = ucx->describe();
  if (shm) transports += cma ? " + shared memory, cross-memory attach" : " + shared memory";
  if (mailbox) transports += "; send/recv through shared memory";
  if (host_shm) transports += " + shared memory within each host";
}

// Rank 0 compares every rank's (protocol, build, world size, job) with its
// own and publishes the verdict; every rank waits for it, so a mismatch fails
// them all as soon as the odd rank has announced itself, naming both values.
void Communicator::Impl::check_versions(Deadline deadline) {
  const std::string mine = "protocol " + std::to_string(kWireProtocol) + ", build " + TANDEM_BUILD_ID +
                           ", world size " + std::to_string(opts.size) + ", job " +
                           (opts.job_id.empty() ? "(none)" : opts.job_id);
  store->set(key("version/" + std::to_string(opts.rank)), mine, deadline);
  const std::string verdict_key = key("version/verdict");
  if (opts.rank == 0) {
    std::string verdict = "ok";
    for (int p = 1; p < opts.size && verdict == "ok"; ++p) {
      std::string theirs;
      try {
        theirs = store->get(key("version/" + std::to_string(p)), deadline);
      } catch (const Timeout& e) {
        throw Timeout("rendezvous: rank " + std::to_string(p) + " never arrived within the connect timeout (" +
                      std::to_string(opts.connect_timeout.count()) +
                      " ms): it did not start, failed before connecting, or uses another store address or job "
                      "(TANDEM_STORE_ADDR, TANDEM_JOB_ID); raise TANDEM_CONNECT_TIMEOUT_MS if ranks start slowly (" +
                      e.what() + ")");
      }
      if (theirs != mine) {
        verdict = "ranks disagree at start-up: rank 0 has " + mine + "; rank " + std::to_string(p) + " has " + theirs +
                  "; every rank must run the same tandem build, in the same job, with the same world size";
      }
    }
    store->set(verdict_key, verdict, deadline);
    if (verdict != "ok") throw InvalidArgument(verdict);
    return;
  }
  std::string verdict;
  try {
    verdict = store->get(verdict_key, deadline);
  } catch (const Timeout& e) {
    throw Timeout("rendezvous: rank 0 did not finish the start-up check within the connect timeout (" +
                  std::to_string(opts.connect_timeout.count()) +
                  " ms): rank 0 or another rank never arrived; raise TANDEM_CONNECT_TIMEOUT_MS if ranks start "
                  "slowly (" +
                  e.what() + ")");
  }
  if (verdict != "ok") throw InvalidArgument(verdict);
}

// Every rank publishes its host identity (CommOptions::host_id, else boot id,
// hostname and namespaces) and reads everyone's: the same topology everywhere.
void Communicator::Impl::learn_topology(Deadline deadline) {
  store->set(key("topology/" + std::to_string(opts.rank)), opts.host_id.empty() ? host_identity() : opts.host_id,
             deadline);
  std::vector<std::string> ids;
  for (int p = 0; p < opts.size; ++p) ids.push_back(store->get(key("topology/" + std::to_string(p)), deadline));
  topology = make_topology(ids, opts.rank);
}

// The ranks of one host map each other's segments. Every rank of the host
// reaches the same verdict from the same store keys: all of them willing,
// with equal segment sizes, and every segment mapped everywhere; or no
// shared memory on that host. A rank that turned it off still answers, so
// the others neither wait for it nor disagree with it. All ranks on this
// host: the segments serve every collective (shm); else the hierarchical
// all-reduce's intra-host steps (host_shm).
void Communicator::Impl::map_shared_memory(Deadline deadline) {
  const std::string me = std::to_string(opts.rank);
  const size_t bytes = algorithms->shared_bytes();
  const bool willing = bytes > 0;  // 0: the algorithms want none (e.g. TANDEM_SHM=0)
  // Segment sizes must agree too: they fix where every slot lies.
  const std::string here = willing ? std::to_string(bytes) : "off";
  store->set(key("shm/size/" + me), here, deadline);
  const std::vector<int>& group = topology.ranks[size_t(topology.host())];
  if (!willing || group.size() < 2) return;
  const bool everyone = int(group.size()) == opts.size;
  for (int p : group) {
    const std::string theirs = store->get(key("shm/size/" + std::to_string(p)), deadline);
    if (theirs == here) continue;
    // The lowest other rank of the host says why.
    if (opts.rank == (p == group[0] ? group[1] : group[0])) {
      if (theirs == "off") {
        spdlog::warn("tandem: rank {} has shared memory off (TANDEM_SHM=0); its host's ranks go through UCX only", p);
      } else {
        spdlog::warn(
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
  store->set(key("shm/at/" + me), set ? set->locator() : "", deadline);
  for (size_t i = 0; i < group.size() && why.empty(); ++i) {
    const int p = group[i];
    if (p == opts.rank) continue;
    const std::string locator = store->get(key("shm/at/" + std::to_string(p)), deadline);
    if (locator.empty()) break;  // that rank says why itself
    const std::string failed = set->map_peer(p, locator);
    if (!failed.empty()) why = "rank " + me + " cannot map rank " + std::to_string(p) + "'s segment: " + failed;
  }
  bool cma_here = why.empty() && everyone;
  for (size_t i = 0; i < group.size() && cma_here; ++i) cma_here = group[i] == opts.rank || set->cma_works(group[i]);
  store->set(key("shm/ok/" + me), !why.empty() ? why : cma_here ? "ok+cma" : "ok", deadline);
  bool cma_everywhere = true;
  for (int p : group) {
    const std::string verdict = store->get(key("shm/ok/" + std::to_string(p)), deadline);
    if (verdict.rfind("ok", 0) != 0) {
      if (opts.rank == group[0])
        spdlog::warn("tandem: shared memory off, collectives go through UCX only ({})", verdict);
      return;
    }
    cma_everywhere = cma_everywhere && verdict == "ok+cma";
  }
  if (everyone) {
    shm = std::move(set);
    cma = cma_everywhere;
    open_mailbox(deadline);
    return;
  }
  host_shm = std::move(set);
  host_view.bytes = bytes;
  for (int p : group) host_view.segment.push_back(host_shm->view().segment[size_t(p)]);
}

}  // namespace tandem
