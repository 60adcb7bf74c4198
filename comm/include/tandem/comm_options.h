// CommOptions: where a rank finds its peers and how long it waits for them.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace tandem {

class KeyValueStore;  // tandem/store.h

// Where a rank finds its peers; see bootstrap.h for reading it from the environment
// (and tandem/settings.h for the tables of its TANDEM_* settings). The ring's
// tuning lives in ring::RingOptions.
struct CommOptions {
  int rank = -1;
  int size = -1;
  int local_rank = -1;
  int local_size = -1;
  std::string store_address;      // "host:port" of the bootstrap store
  bool host_store = false;        // this rank (rank 0) starts the store itself (mpirun, Slurm)
  std::string prefix = "tandem";  // namespace for this communicator's store keys
  // A store handed in (a framework's, e.g. c10d's through the torch backend):
  // when set, the communicator bootstraps through it instead of connecting to
  // store_address, and never hosts one (host_store and secret are ignored).
  // Its handle serves the communicator's calling threads; the heartbeat takes
  // another from connect_again(). Shared: the caller may keep using it.
  std::shared_ptr<KeyValueStore> store;
  // The job secret (TANDEM_SECRET or TANDEM_SECRET_FILE; tandem launch makes
  // one): the store admits only connections that prove they know it.
  std::string secret;
  // The job's id (TANDEM_JOB_ID, set by tandem launch; else Slurm's job and
  // step): ranks of different jobs that meet at one store fail at start-up.
  std::string job_id;
  // Default deadline of every collective; each call may override it.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // What makes ranks "one host" for the topology and shared memory
  // (TANDEM_HOST_ID); empty = boot id, hostname and namespaces.
  std::string host_id;
  // How often, while calls wait, a rank's liveness thread asks the store
  // whether some rank died (or revoked, or found a mismatch), and how long a
  // call waits before it asks itself. The store learns of a death when the
  // rank's connection drops, on any transport. At least 1 ms.
  std::chrono::milliseconds failure_poll{std::chrono::milliseconds(200)};
  // Liveness (TANDEM_HEARTBEAT_MS; 0 = off): each rank beats to the store
  // every heartbeat / 2 on its own connection; a rank silent for two
  // intervals (stopped, hung, cut off) is recorded as failed, and every rank
  // waiting in a collective fails with PeerFailure naming it within three.
  // tandem's store watches the beats itself; over a handed-in store that does
  // not (`store` above), each rank watches its ring successor's beats instead
  // (comm/liveness/peer_watch.h), with the same bound.
  // The same bound applies to the store itself: a store that does not answer
  // a failure poll within min(heartbeat, 2 s) counts as gone.
  std::chrono::milliseconds heartbeat{std::chrono::seconds(2)};
  // UCX peer error handling on every endpoint. Off by default: UCX 1.13
  // excludes its shared-memory transports from endpoints in that mode, which
  // forces TCP even between processes on one host; the store already names
  // dead ranks. Turn it on for multi-host runs that want UCX keepalive too.
  bool ucx_peer_error_handling = false;
  // Flight recorder: the last flight_entries collectives (0: off), written as
  // JSON to flight_dir (empty: TMPDIR, else /tmp) on a timeout, a failure, abort() or
  // SIGUSR1; `tandem doctor` compares the ranks' files. TANDEM_FLIGHT_ENTRIES,
  // TANDEM_FLIGHT_DIR.
  size_t flight_entries = 1024;
  std::string flight_dir;
  // UCX_NET_DEVICES for this communicator's context; empty leaves UCX's choice.
  std::string ucx_net_devices;
  // dtrain_network_interface (TANDEM_NETWORK_INTERFACE): restricts the interface
  // selection (syntax in tandem/netif.h); empty = automatic.
  std::string network_interface;
  // The user set UCX_NET_DEVICES: interface selection still runs and reports, but leaves UCX alone.
  bool ucx_net_devices_pinned = false;
  // Set by split() and shrink() on their communicators: the members reached
  // each other through the interface their communicator chose
  // (ucx_net_devices), so no selection runs again (its probes cost a few
  // hundred ms across hosts, on a shrink's recovery path).
  bool interface_chosen = false;
  // The user set UCX_KEEPALIVE_INTERVAL: the heartbeat does not override it.
  bool ucx_keepalive_pinned = false;
  // Point-to-point messages between ranks of one host past this size are read
  // from the sender's buffer by cross-memory attach; up to it they stream
  // through the shared-memory mailbox's slots, or are read where p2p_timed
  // found that faster (TANDEM_P2P_STREAM_MAX_BYTES).
  size_t p2p_stream_max_bytes = size_t(64) << 20;
  // Between 16 KiB and p2p_stream_max_bytes the receivers time streaming
  // against cross-memory attach on the messages themselves, per size class,
  // and every sender takes the faster; false: they stream (TANDEM_P2P_TIMED).
  bool p2p_timed = true;
  // Ranks of one host that copy each other's heap buffers by cross-memory
  // attach back a buffer's whole 2 MiB pages with transparent huge pages
  // (MADV_COLLAPSE) at its first call (TANDEM_HUGE_PAGES).
  bool huge_pages = true;
  // Highest instruction set of the reduction kernels (TANDEM_REDUCE_ISA: scalar,
  // avx2, avx512); empty = the best the CPU has. Applied by the settings reader.
  std::string reduce_isa;
  // Rank 0 may host the store on every address (TANDEM_STORE_LISTEN_ALL), and a
  // store reachable from other hosts may run without a secret (TANDEM_ALLOW_NO_SECRET).
  bool store_listen_all = false;
  bool allow_no_secret = false;
  // This process joins a running job (TANDEM_JOIN; `tandem launch --elastic`
  // sets it on the workers it starts to replace lost ones): create() waits,
  // up to connect_timeout, for the members' next Communicator::grow() and
  // returns the communicator that includes it, at the rank the grow gives.
  // `rank` is then the process's number in the job (-1: none), not its rank.
  bool join = false;
};

// More ranks on this host than cores: waiting ranks must yield soon, and
// shared-memory chunks grow.
bool ranks_outnumber_cores(const CommOptions& options);

// The size of this host's last-level cache (hwloc, read once a process); 0 where unknown.
size_t last_level_cache_bytes();
// Whether this host's CPUs are AMD's, whose last-level cache belongs to a
// core complex (a CCD) however large the cache hwloc reports.
bool cpu_is_amd();

}  // namespace tandem
