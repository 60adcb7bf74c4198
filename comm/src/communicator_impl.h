// Communicator::Impl and the Task it runs: the state shared by the
// communicator's files (engine, engine channel, wire-up, liveness, requests).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "call_description.h"
#include "flight_recorder.h"
#include "peer_watch.h"
#include "tandem/communicator.h"
#include "tandem/netif.h"
#include "tandem/reduce.h"
#include "tandem/store.h"
#include "transport/shared_segments.h"
#include "transport/shm_mailbox.h"
#include "transport/ucx_transport.h"

namespace tandem {

// One reusable scratch buffer, grown on demand.
class ScratchBuffer {
 public:
  explicit ScratchBuffer(MemoryType memory = MemoryType::host) : memory_(memory) {}
  ScratchBuffer(ScratchBuffer&& o) noexcept : memory_(o.memory_), data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
  }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ~ScratchBuffer() {
    if (data_) deallocate(memory_, data_);
  }
  void* get(size_t bytes) {
    if (bytes > bytes_) {
      void* fresh = allocate(memory_, bytes);
      if (data_) deallocate(memory_, data_);
      data_ = fresh;
      bytes_ = bytes;
    }
    return data_;
  }

 private:
  MemoryType memory_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

struct Request::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Deadline deadline;  // the collective's own deadline
  int source = -1;    // a receive from any source: the sender

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
};

struct Task {
  std::function<void(Channel&)> body;
  std::shared_ptr<Request::State> state;
  std::chrono::milliseconds timeout;  // this call's, for messages
  Deadline deadline;
  Description what;
  std::vector<P2POp> p2p{};  // send/recv: the messages to post
};

// A point-to-point call, posted and completing in the background: each sweep
// polls its messages; the last to finish completes its Request.
struct PostedCall {
  Task task;
  std::vector<Pending> messages;  // by op
  Tag any_source_mask = 0;        // nonzero: op any_source_op receives from any rank
  size_t any_source_op = 0;
  unsigned sweeps = 0;
};

struct Communicator::Impl {
  CommOptions opts;
  std::shared_ptr<Algorithms> algorithms;
  std::unique_ptr<StoreServer> server;
  std::shared_ptr<KeyValueStore> store;  // tandem's (StoreClient) or the one handed in
  std::unique_ptr<UcxTransport> ucx;
  std::unique_ptr<SharedSegmentSet> shm;       // when all ranks share this host
  Topology topology;                           // which ranks share a host
  std::unique_ptr<SharedSegmentSet> host_shm;  // when ranks span hosts: this host's ranks' segments
  SharedSegments host_view;                    // host_shm's segments by local rank
  bool cma = false;                            // and every rank may copy from every other's memory
  // Point-to-point through shared memory, when shm and cma are (open_mailbox).
  std::unique_ptr<SharedSegmentSet> mailbox_shm;
  std::unique_ptr<ShmMailbox> mailbox;
  // Bytes the shared-memory collectives read and wrote; only the running call writes it.
  std::atomic<uint64_t> shm_traffic{0};
  std::unique_ptr<SharedAllocations> allocations;  // allocate_shared()
  std::unique_ptr<FlightRecorder> flight;          // the last collectives, for `tandem doctor`
  int store_host_rank = -1;                        // the rank hosting the store, if a rank does
  std::string transports;                          // what UCX chose, read once after wire-up
  NetifDecision network;                           // the interface selection's decision
  bool oversubscribed = false;                     // more ranks on this host than cores

  std::thread engine;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  bool stopping = false;
  bool busy = false;  // a collective is executing (engine or inline); guarded by mu
  std::atomic<bool> aborted{false};
  std::string abort_reason;   // guarded by mu
  std::exception_ptr sticky;  // engine thread only
  std::atomic<bool> failed{false};

  // Liveness: a thread beats on its own store handle every heartbeat / 2;
  // the store records a rank silent for kSilentHeartbeats intervals as
  // failed, or, if it does not track liveness, the rank's watcher does.
  std::thread heartbeat_thread;
  std::condition_variable cv_heartbeat;
  std::unique_ptr<KeyValueStore> heartbeat_store;
  std::unique_ptr<PeerWatch> peer_watch;  // when the store does not track liveness
  bool heartbeat_stopping = false;        // guarded by mu
  std::string heartbeat_error;            // guarded by mu
  std::atomic<bool> heartbeat_failed{false};

  // Point-to-point calls posted and not yet complete; touched only by the
  // thread that holds `busy` (the engine, or a blocking call run inline).
  std::deque<PostedCall> posted;
  // The engine sleeps on UCX or the mailbox's doorbell: enqueue() must wake it (wake_sleeping_engine)
  std::atomic<bool> engine_sleeping{false};

  uint64_t splits = 0;                                      // split() calls so far, for the new communicators' keys
  uint32_t seq = 0;                                         // engine thread only
  std::vector<ScratchBuffer> host_scratch, device_scratch;  // by slot
  std::shared_ptr<Request::State> inline_state;             // try_run_here's, reused while nothing else holds it
  Clock::time_point next_failure_poll{};

  // A create() that fails after the heartbeat started must still join it.
  ~Impl() { stop_heartbeat(); }

  std::string key(const std::string& k) const { return opts.prefix + "/" + k; }
  void store_barrier(const std::string& name, Deadline deadline);
  void connect();
  void learn_topology(Deadline deadline);
  void map_shared_memory(Deadline deadline);
  void run_engine();
  void run_blocking(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what);
  // run_blocking's inline half: false, `body` untouched, when the call must queue.
  bool try_run_here(std::function<void(Channel&)>& body, const CollectiveOptions& o, const Description& what);
  MemoryType memory_type(const CollectiveOptions& o) const;
  // `started`: when the task began, for the flight recorder.
  void execute(Task& task, Clock::time_point started);
  void record_begin(const Task& task, Clock::time_point started);
  // Marks the running collective failed (exchanges are not recorded) and dumps.
  void record_failure(const std::string& error, const char* reason, bool collective);
  void check_health(const Task& task, int waiting_on);
  // How long a sleeping wait may last before the next check_health is due.
  std::chrono::microseconds until_next_check(const Task& task) const;
  [[noreturn]] void throw_store_lost(const std::exception& e);
  [[noreturn]] void throw_aborted();
  void check_open_locked() const;  // caller holds mu
  Task make_task(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what) const;
  std::string arrive(const std::string& barrier, Deadline deadline);
  [[noreturn]] void blame_first_failure(const PeerFailure& seen, const Task& task);
  // A mismatch found by one rank, published so that every rank fails in that call.
  void publish_mismatch(const std::string& text);
  void check_calls_match(const Task& task, int waiting_on, Deadline until);
  // Before naming a dead peer: the mismatch it published, if any, explains its exit.
  void throw_published_mismatch(const Task& task, int waiting_on);
  // Throws the mismatch another rank published, waiting up to a second for it.
  void explain_mismatch();
  PeerFailure rank_died(int rank, const std::string& detail);
  // How long a store request may take before the store counts as silent.
  std::chrono::milliseconds store_patience() const {
    return opts.heartbeat.count() > 0 ? std::min<std::chrono::milliseconds>(opts.heartbeat, std::chrono::seconds(2))
                                      : std::chrono::seconds(2);
  }
  void start_heartbeat(Deadline deadline);
  void check_versions(Deadline deadline);
  void stop_heartbeat();
  void* scratch_buffer(size_t bytes, int slot, MemoryType memory);
  std::shared_ptr<Request::State> enqueue(std::function<void(Channel&)> body, const CollectiveOptions& o,
                                          const Description& what);
  // Queues a task for the engine (waking it if it sleeps on UCX); its request's state.
  std::shared_ptr<Request::State> enqueue(Task task);
  // point_to_point.cc: posts a send/recv task's messages; polls what is posted.
  void post(Task task);
  // One pass over the posted calls; true if one finished.
  bool sweep_posted();
  // Ends every posted call with `error` (abort, shutdown, an earlier failure).
  void fail_posted(std::exception_ptr error);
  // The engine with nothing queued but calls posted: progress and sleep briefly.
  void progress_posted();
  // A send/recv call, checked, with its messages (empty: already finished).
  Task p2p_task(const std::vector<P2POp>& ops, const CollectiveOptions& o);
  // Maps every rank's mailbox segment; on success send/recv go through `mailbox`.
  void open_mailbox(Deadline deadline);
  // One op's message on the transport that carries point-to-point (the mailbox, else UCX).
  Pending post_message(const P2POp& op);
  // Polls a posted message on its transport; *source: who sent a received one.
  bool poll_message(Pending& m, int* source);
  void cancel_message(Pending& m);
  void wake_sleeping_engine();
  // Runs a send/recv call to completion, on this thread when the engine is idle.
  void run_p2p_blocking(Task task);
  // A blocking send/recv/group; returns the source of a receive (else -1).
  int run_p2p(const P2POp* ops, size_t n, const CollectiveOptions& o);
  // run_p2p on the mailbox without a Task while it finishes quickly; false: not started.
  bool run_p2p_inline(const P2POp* ops, size_t n, const CollectiveOptions& o, int* source);
  // This thread holds busy and its call is posted: progresses until the call
  // finishes or queued work takes the engine back, then releases busy.
  void progress_here(Request::State& state, size_t bytes);
  void release_busy(bool wake);
  // Fails every posted call, `call`'s error named for it (a size mismatch).
  void fail_call(const PostedCall& call, std::exception_ptr error);
  // Queued (async) or run now; a blocking call returns an empty Request.
  Request submit(bool async, std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what);
  void finalize();
  bool finalize_barrier(Deadline deadline);
};

}  // namespace tandem
