// Communicator: bootstrap through the store, UCX wire-up, and the engine
// thread that runs collectives in issue order.
#include "tandem/communicator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <immintrin.h>
#include <sched.h>
#include <unistd.h>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "flight_recorder.h"
#include "peer_watch.h"
#include "tandem/netif.h"
#include "tandem/reduce.h"
#include "tandem/store.h"
#include "transport/shared_segments.h"
#include "transport/ucx_transport.h"

namespace tandem {

namespace {

// Tag layout: collective signature | sequence number | sending rank |
// algorithm's own tag. The signature (which collective, which dtype) keeps
// mismatched calls from ever matching each other's data; the fingerprints
// (signature kFingerprintSignature) then say what differs. Sequence numbers
// wrap; collectives are strictly ordered.
constexpr int kSignatureBits = 6;
constexpr int kSeqBits = 14;
constexpr int kRankBits = 12;
constexpr int kLocalBits = 32;
constexpr int kMaxRanks = 1 << kRankBits;
// What ranks must agree on to talk at all (tags, fingerprints, store keys);
// raised whenever any of them changes. Checked at start-up with the build id.
constexpr int kWireProtocol = 2;
#ifndef TANDEM_BUILD_ID
#define TANDEM_BUILD_ID "unknown"
#endif
// Waiting has three phases, so that a short wait stays fast and a long one
// leaves the core to the threads that have work (the backward pass):
//  - spin: poll (UCX: progress the worker; shared memory: re-read a flag);
//  - UCX: arm the worker and sleep on its event fd, woken by the next message;
//    shared memory, which has no event to sleep on: sched_yield a while, then
//    sleep kIdleSleep per turn.
// Ranks outnumber cores: the rank we wait for may need our core, so yield soon
// (16 spins measured 2-3x faster than 256 for small all-reduces, 4 ranks on 2 cores).
constexpr unsigned kSpinsBeforeYield = 16;
// UCX waits spin this long before sleeping on the event fd...
constexpr auto kUcxSpin = std::chrono::microseconds(40);
// ...unless the worker made progress this recently: then the transfer is
// streaming and a sleep would leave the socket idle (over a 1 Gbit/s TCP link
// sleeping cost 10-25 % of the bandwidth, 2-16 MiB all-reduces). Measured:
// 1 ms keeps a streaming TCP transfer polled; a peer that is not sending lets
// the wait sleep after it.
constexpr auto kUcxBusyWindow = std::chrono::microseconds(1000);
constexpr auto kUcxSleepSlice = std::chrono::microseconds(1000);
// Shared-memory waits: pause this many turns (tens of microseconds), then yield
// for kIdleYieldWindow, then sleep kIdleSleep per turn; once the wait has lasted
// kIdleLongWait (the peer is late, not slow) kIdleLongSleep, which costs at
// most that much latency on a wait already a hundred times longer.
// The yield window must outlast a peer's sleep (kIdleSleep plus the kernel's
// 50 us timer slack): with 64 yields (~30 us) a rank waiting on a sleeping
// peer fell asleep itself, and two ranks could stay in that state for good,
// every small all-reduce taking ~50 us instead of ~1 (2 ranks, 4 KiB).
constexpr unsigned kIdleSpins = 2048;
// While pausing, yield every this many turns (a few microseconds): a peer that
// the scheduler put on this rank's core runs only when this rank lets it. Two
// ranks on two cores stay that way for seconds once a passing load brings them
// together (2 ranks, 4 KiB: ~50 us per all-reduce instead of ~1).
constexpr unsigned kIdlePauseRun = 64;
constexpr auto kIdleYieldWindow = std::chrono::microseconds(250);
constexpr auto kIdleLongWait = std::chrono::milliseconds(20);
constexpr auto kIdleSleep = std::chrono::microseconds(50);
constexpr auto kIdleLongSleep = std::chrono::microseconds(250);

// What a collective is, for error messages; formatted only when one is thrown,
// since building strings would cost more than a small collective.
struct Description {
  const char* name = "";
  size_t count = 0;
  std::optional<DataType> dtype;
  std::optional<ReduceOp> op;
  int root = -1;  // broadcast only

  // 1 + the index in kKinds.
  uint32_t kind() const {
    static constexpr const char* kKinds[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier",
                                             "exchange"};
    for (uint32_t i = 0; i < 6; ++i) {
      if (std::strcmp(name, kKinds[i]) == 0) return i + 1;
    }
    return 0;
  }
  // 3 bits of collective kind, 3 of dtype.
  uint32_t signature() const { return (kind() << 3) | (dtype ? uint32_t(*dtype) + 1 : 0); }
  // Communicator::exchange: point-to-point messages between the ranks it addresses.
  bool point_to_point() const { return kind() == 6; }

  std::string str() const {
    if (!dtype) return name;
    std::string s = std::string(name) + "(" + std::to_string(count) + " x " + std::string(to_string(*dtype));
    if (op) s += ", " + std::string(to_string(*op));
    if (root >= 0) s += ", root " + std::to_string(root);
    return s + ")";
  }
};

// What a rank says it is calling, sent to its ring successor before a
// collective's first UCX message (the shared-memory path compares calls in its
// slot headers instead). Plain bytes; both ends are the same build.
struct Fingerprint {
  uint32_t seq = 0;
  uint8_t kind = 0, dtype = 0, op = 0;  // dtype and op + 1; 0: none
  uint8_t unused = 0;
  int32_t root = -1;
  uint64_t count = 0;

  static Fingerprint of(const Description& d, uint32_t seq) {
    return {seq, uint8_t(d.kind()), uint8_t(d.dtype ? uint8_t(*d.dtype) + 1 : 0), uint8_t(d.op ? uint8_t(*d.op) + 1 : 0),
            0, d.root, d.count};
  }
  Description description() const {
    static constexpr const char* kKinds[] = {"?", "allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"};
    Description d{kKinds[kind <= 5 ? kind : 0], size_t(count), std::nullopt, std::nullopt, root};
    if (dtype) d.dtype = DataType(dtype - 1);
    if (op) d.op = ReduceOp(op - 1);
    return d;
  }
  // The first field that differs, in the order a reader would check them; nullptr if none.
  const char* differing(const Fingerprint& o) const {
    if (seq != o.seq) return "sequence number";
    if (kind != o.kind) return "kind";
    if (op != o.op) return "op";
    if (dtype != o.dtype) return "dtype";
    if (count != o.count) return "count";
    if (root != o.root) return "root";
    return nullptr;
  }
};
static_assert(sizeof(Fingerprint) == 24);
// The tag signature of fingerprints: kind 7, dtype 7, which no collective has.
constexpr uint32_t kFingerprintSignature = (1u << kSignatureBits) - 1;

// "allreduce #12 (1024 x f32, sum) on rank 0 (waiting for rank 1)": seq numbers the communicator's collectives from 1.
std::string describe_wait(const Description& what, uint32_t seq, int rank, int peer) {
  if (what.point_to_point()) {
    return "point-to-point exchange on rank " + std::to_string(rank) + " (waiting for rank " + std::to_string(peer) + ")";
  }
  std::string call = what.str();
  const auto paren = call.find('(');
  call = paren == std::string::npos ? call + " #" + std::to_string(seq)
                                    : call.substr(0, paren) + " #" + std::to_string(seq) + " " + call.substr(paren);
  return call + " on rank " + std::to_string(rank) + " (waiting for rank " + std::to_string(peer) + ")";
}

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

}  // namespace

// ---- Request ---------------------------------------------------------------

struct Request::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Deadline deadline;  // the collective's own deadline

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      error = std::move(e);
    }
    cv.notify_all();
  }
};

bool Request::test() {
  if (!state_) throw InvalidArgument("test() on an empty Request");
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->done && state_->error) std::rethrow_exception(state_->error);
  return state_->done;
}

void Request::wait() {
  if (!state_) throw InvalidArgument("wait() on an empty Request");
  // The engine enforces the collective's deadline; the slack covers handing the result back.
  wait(state_->deadline + std::chrono::seconds(5));
}

void Request::wait(Deadline deadline) {
  if (!state_) throw InvalidArgument("wait() on an empty Request");
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_until(lock, deadline, [&] { return state_->done; })) {
    throw Timeout("Request::wait: the collective did not finish by the given deadline");
  }
  if (state_->error) std::rethrow_exception(state_->error);
}

// ---- Impl ------------------------------------------------------------------

struct Task {
  std::function<void(Channel&)> body;
  std::shared_ptr<Request::State> state;
  std::chrono::milliseconds timeout;  // this call's, for messages
  Deadline deadline;
  Description what;
};

// "mismatched collectives at call #5 (the count differs): rank 0 called allreduce(100 x f32, sum), rank 1 called ...".
std::string mismatch_text(uint32_t seq, const char* field, int rank_a, const Description& a, int rank_b,
                          const Description& b) {
  return "mismatched collectives at call #" + std::to_string(seq) + " (the " + field + " differs): rank " +
         std::to_string(rank_a) + " called " + a.str() + ", rank " + std::to_string(rank_b) + " called " + b.str() +
         "; every rank must issue the same collectives with the same arguments in the same order";
}

struct Communicator::Impl {
  CommOptions opts;
  std::shared_ptr<Algorithms> algorithms;
  std::unique_ptr<StoreServer> server;
  std::shared_ptr<KeyValueStore> store;  // tandem's (StoreClient) or the one handed in
  std::unique_ptr<UcxTransport> ucx;
  std::unique_ptr<SharedSegmentSet> shm;  // when all ranks share this host
  Topology topology;                       // which ranks share a host
  std::unique_ptr<SharedSegmentSet> host_shm;  // when ranks span hosts: this host's ranks' segments
  SharedSegments host_view;                    // host_shm's segments by local rank
  bool cma = false;                        // and every rank may copy from every other's memory
  std::unique_ptr<SharedAllocations> allocations;  // allocate_shared()
  std::unique_ptr<FlightRecorder> flight;          // the last collectives, for `tandem doctor`
  int store_host_rank = -1;     // the rank hosting the store, if a rank does
  std::string transports;       // what UCX chose, read once after wire-up
  NetifDecision network;        // the interface selection's decision
  bool oversubscribed = false;  // more ranks on this host than cores

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
  bool heartbeat_stopping = false;     // guarded by mu
  std::string heartbeat_error;         // guarded by mu
  std::atomic<bool> heartbeat_failed{false};

  uint32_t seq = 0;                                         // engine thread only
  std::vector<ScratchBuffer> host_scratch, device_scratch;  // by slot
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
  MemoryType memory_type(const CollectiveOptions& o) const;
  void execute(Task& task);
  void record_begin(const Task& task);
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
  void finalize();
  bool finalize_barrier(Deadline deadline);
};

// The Channel a running collective sees: tags scoped to the collective,
// waits bounded by its deadline and aware of abort and dead peers.
class EngineChannel final : public Channel {
 public:
  EngineChannel(Communicator::Impl& impl, const Task& task)
      : impl_(impl), task_(task), signature_(task.what.signature()), point_to_point_(task.what.point_to_point()) {
    // An exchange has no fingerprints: only the ranks it addresses take part.
    fingerprint_posted_ = fingerprint_compared_ = point_to_point_;
    // Without shared memory every collective goes over UCX: post at once (a
    // zero-count call sends nothing, yet must be checked).
    if (!impl_.shm && impl_.opts.size > 1 && !point_to_point_) post_fingerprint();
  }
  ~EngineChannel() override {
    // Anything still posted belongs to a collective that failed: cancel it so
    // UCX never touches the caller's buffers after we return.
    for (auto& p : live_) impl_.ucx->cancel(p);
  }

  int rank() const override { return impl_.opts.rank; }
  int size() const override { return impl_.opts.size; }

  Pending send(int peer, Tag tag, const void* data, size_t bytes) override {
    if (!fingerprint_posted_) post_fingerprint();
    return blaming_first_failure([&] { return track(impl_.ucx->send(peer, full_tag(rank(), tag), data, bytes)); });
  }
  Pending recv(int peer, Tag tag, void* data, size_t bytes) override {
    if (!fingerprint_posted_) post_fingerprint();
    return track(impl_.ucx->recv(peer, full_tag(peer, tag), data, bytes));
  }

  bool test(Pending& p) override {
    if (p.done()) return true;
    impl_.ucx->progress();
    void* handle = p.handle();
    try {
      if (!impl_.ucx->poll(p)) return false;
    } catch (const PeerFailure& e) {
      untrack(handle);  // poll() released the request
      impl_.blame_first_failure(e, task_);
    } catch (const CollectiveMismatch&) {
      // A message of the wrong size: the fingerprint says which field differs.
      untrack(handle);
      if (fingerprint_posted_ && !fingerprint_compared_) {
        wait(fp_in_);
        compare_fingerprint();
      }
      impl_.explain_mismatch();  // the predecessor agrees: another rank differs
      throw;
    } catch (...) {
      untrack(handle);
      throw;
    }
    untrack(handle);
    return true;
  }

  void wait(Pending& p) override {
    // Spin: small messages land within microseconds.
    Clock::time_point spin_until{};
    for (unsigned spins = 1; !test(p); ++spins) {
      back_off(p.peer(), spins);
      if (spins % 16 != 0) continue;
      const auto now = Clock::now();
      if (spin_until == Clock::time_point{}) {
        spin_until = now + kUcxSpin;
      } else if (now >= spin_until) {
        break;
      }
    }
    // While the worker keeps making progress, poll (yielding the core between
    // passes); once it has been quiet for kUcxBusyWindow, sleep on the worker's
    // event fd, waking for the next health check at the latest, and after
    // kUcxSleepSlice in any case: UCX's TCP transport does not signal the fd
    // when a full socket drains, so a send queued behind it would otherwise
    // wait out the whole health-check interval (200 ms stalls on a shaped link).
    while (!test(p)) {
      poll_fingerprint();  // a stalled wait is what a mismatch looks like
      impl_.check_health(task_, p.peer());
      if (Clock::now() - impl_.ucx->last_progress() < kUcxBusyWindow) {
        std::this_thread::yield();
      } else {
        impl_.ucx->sleep(std::min(impl_.until_next_check(task_), kUcxSleepSlice));
      }
    }
  }

  const SharedSegments* shared_segments() const override { return impl_.shm ? &impl_.shm->view() : nullptr; }
  const Topology* topology() const override { return &impl_.topology; }
  const SharedSegments* host_segments() const override { return impl_.host_shm ? &impl_.host_view : nullptr; }
  bool find_shared(const void* p, size_t bytes, SharedRef& out) const override {
    return impl_.shm && impl_.allocations->find(p, bytes, out);
  }
  std::byte* map_shared(int /*peer*/, const SharedRef& ref) override { return impl_.allocations->map(ref); }
  bool can_copy_peer() const override { return impl_.cma; }
  void read_peer(int peer, const void* remote, void* local, size_t bytes) override {
    blaming_first_failure([&] { impl_.shm->read_peer(peer, remote, local, bytes); });
  }
  void write_peer(int peer, void* remote, const void* local, size_t bytes) override {
    blaming_first_failure([&] { impl_.shm->write_peer(peer, remote, local, bytes); });
  }

  void idle(int peer, unsigned spins) override {
    if (spins % 128 == 0) {
      impl_.check_health(task_, peer);
      if (spins % 1024 == 0 && !point_to_point_) watch_for_fingerprints();
    }
    const bool yield_soon = impl_.oversubscribed && spins > kSpinsBeforeYield;
    if (spins <= kIdleSpins && !yield_soon) {
      if (spins % kIdlePauseRun == 0) {
        sched_yield();
      } else {
        _mm_pause();  // spinning on another core's cache line
      }
      return;
    }
    if (yield_soon && spins <= kIdleSpins) {
      sched_yield();
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (spins == kIdleSpins + 1) yielding_since_ = now;
    const auto waited = now - yielding_since_;
    if (waited < kIdleYieldWindow) {
      sched_yield();
    } else {
      // A long wait: leave the core to the process's other threads.
      std::this_thread::sleep_for(waited < kIdleLongWait ? kIdleSleep : kIdleLongSleep);
    }
  }

  void* scratch(size_t bytes, int slot) override { return impl_.scratch_buffer(bytes, slot, MemoryType::host); }
  void* device_scratch(size_t bytes, int slot) override { return impl_.scratch_buffer(bytes, slot, MemoryType::cuda); }

 private:
  // Runs f; a PeerFailure it throws names the rank the store saw die first.
  template <class F>
  auto blaming_first_failure(F f) -> decltype(f()) {
    try {
      return f();
    } catch (const PeerFailure& e) {
      impl_.blame_first_failure(e, task_);
    }
  }

  // Busy-poll like MPI; yield when ranks outnumber cores, or now and then anyway.
  void back_off(int peer, unsigned spins) {
    if (spins % 128 == 0) impl_.check_health(task_, peer);
    if ((impl_.oversubscribed && spins > kSpinsBeforeYield) || spins % 65536 == 0) std::this_thread::yield();
  }

  Tag full_tag(int sender, Tag local, uint32_t signature) const {
    if (local >> kLocalBits) throw InvalidArgument("algorithm tag exceeds 32 bits");
    static_assert(kSignatureBits + kSeqBits + kRankBits + kLocalBits == 64);
    // Exchanges are not numbered: their tags are their own, across calls.
    const Tag seq = point_to_point_ ? 0 : impl_.seq & ((1u << kSeqBits) - 1);
    return (Tag(signature) << (kSeqBits + kRankBits + kLocalBits)) | (seq << (kRankBits + kLocalBits)) |
           (Tag(sender) << kLocalBits) | local;
  }
  Tag full_tag(int sender, Tag local) const { return full_tag(sender, local, signature_); }

  // Fingerprints (collective calls over UCX). Each rank sends its call's
  // fingerprint to its ring successor with its first message and compares the
  // predecessor's when a wait stalls, and in any case before the call may
  // succeed (finish()): in a matching call it has long arrived by then, so
  // the check costs no round trip. Ranks in a mismatched call fail inside it:
  // those that see the mismatch at once, the others when the store tells them
  // (check_health). The fingerprint signature matches whatever the
  // predecessor called, unlike the data tags.
  void post_fingerprint() {
    fingerprint_posted_ = true;
    const int n = size(), r = rank();
    prev_ = (r + n - 1) % n;
    mine_ = Fingerprint::of(task_.what, impl_.seq);
    fp_in_ = track(impl_.ucx->recv(prev_, full_tag(prev_, 0, kFingerprintSignature), &theirs_, sizeof theirs_));
    fp_out_ = blaming_first_failure([&] {
      return track(impl_.ucx->send((r + 1) % n, full_tag(r, 0, kFingerprintSignature), &mine_, sizeof mine_));
    });
  }
  void poll_fingerprint() {
    if (fingerprint_posted_ && !fingerprint_compared_ && test(fp_in_)) compare_fingerprint();
  }
  void compare_fingerprint() {
    fingerprint_compared_ = true;
    compare(prev_, theirs_);
  }

 public:
  // After the algorithm: the call succeeds only once the predecessor's
  // fingerprint matched and this rank's has left.
  void finish() {
    if (!fingerprint_posted_ || point_to_point_) return;
    if (!fingerprint_compared_) {
      wait(fp_in_);
      if (!fingerprint_compared_) compare_fingerprint();
    }
    wait(fp_out_);
  }

 private:
  // On the shared-memory path, now and then during a long wait: a peer that
  // sent a fingerprint for this call runs it over UCX, so it called something else.
  void watch_for_fingerprints() {
    if (fingerprint_posted_) return;
    impl_.ucx->progress();
    const Tag mask = ~((Tag(1) << (kRankBits + kLocalBits)) - 1);  // signature and sequence number, any sender
    if (!impl_.ucx->probe(full_tag(0, 0, kFingerprintSignature), mask)) return;
    for (int p = 0; p < size(); ++p) {
      if (p == rank() || !impl_.ucx->probe(full_tag(p, 0, kFingerprintSignature), ~Tag(0))) continue;
      fingerprint_posted_ = fingerprint_compared_ = true;
      mine_ = Fingerprint::of(task_.what, impl_.seq);
      Pending in = track(impl_.ucx->recv(p, full_tag(p, 0, kFingerprintSignature), &theirs_, sizeof theirs_));
      wait(in);
      compare(p, theirs_);
      throw CollectiveMismatch("call #" + std::to_string(impl_.seq) + ": rank " + std::to_string(p) + " runs " +
                               theirs_.description().str() + " over UCX while rank " + std::to_string(rank()) +
                               " runs it through shared memory; TANDEM_SHM, TANDEM_SHM_CHUNK_BYTES and TANDEM_ALGO "
                               "must agree on every rank");
    }
  }

  void compare(int peer, const Fingerprint& theirs) {
    if (const char* field = mine_.differing(theirs)) {
      const Description other = theirs.description();
      if (rank() < peer) throw CollectiveMismatch(mismatch_text(impl_.seq, field, rank(), task_.what, peer, other));
      throw CollectiveMismatch(mismatch_text(impl_.seq, field, peer, other, rank(), task_.what));
    }
  }
  Pending track(Pending p) {
    // Keep a shadow handle so a failed collective can cancel what it posted.
    if (!p.done()) live_.emplace_back(p.handle(), p.peer(), p.bytes(), p.is_recv());
    return p;
  }
  void untrack(void* handle) {
    for (size_t i = 0; i < live_.size(); ++i) {
      if (live_[i].handle() == handle) {
        live_[i].mark_done();
        live_[i] = std::move(live_.back());
        live_.pop_back();
        return;
      }
    }
  }

  Communicator::Impl& impl_;
  const Task& task_;
  uint32_t signature_;
  bool point_to_point_;
  std::chrono::steady_clock::time_point yielding_since_;  // when the current shared-memory wait stopped pausing
  std::vector<Pending> live_;
  bool fingerprint_posted_ = false, fingerprint_compared_ = false;
  int prev_ = 0;
  Pending fp_in_, fp_out_;
  Fingerprint mine_, theirs_;  // sent and received in place: they outlive the messages
};

namespace {

// The rank the store saw die first (kFailedRanksKey lists them in order).
std::optional<int> first_failed_rank(const std::optional<std::string>& failed_ranks) {
  if (!failed_ranks || failed_ranks->empty()) return std::nullopt;
  return std::atoi(failed_ranks->c_str());
}

}  // namespace

// "rank 1 (host vm, pid 42) failed: <why the store recorded it><detail>".
PeerFailure Communicator::Impl::rank_died(int rank, const std::string& detail) {
  const Deadline until = Clock::now() + std::chrono::milliseconds(500);
  std::optional<std::string> host, why;
  try {
    host = store->try_get(key("host/" + std::to_string(rank)), until);
    why = store->try_get(failure_reason_key(rank), until);
  } catch (const Error&) {
    // The store may be going away too; name what we know.
  }
  return PeerFailure(rank, "rank " + std::to_string(rank) + (host ? " (" + *host + ")" : std::string()) +
                               " failed: " + (why ? *why : "its process exited or lost its connection") + detail);
}

void Communicator::Impl::throw_store_lost(const std::exception& e) {
  if (store_host_rank >= 0) {
    throw PeerFailure(store_host_rank, "rank " + std::to_string(store_host_rank) +
                                           " failed: the bootstrap store it hosted is gone (" + e.what() + ")");
  }
  if (opts.store) throw PeerFailure(-1, std::string("lost the store handed to the communicator: ") + e.what());
  throw PeerFailure(-1, std::string("lost the bootstrap store (launcher gone?): ") + e.what());
}

// A transport error names the peer at the other end of one message, which may
// only have died because another rank did (and then exited on its own error).
// The store knows which rank died first; name that one when it says so.
void Communicator::Impl::blame_first_failure(const PeerFailure& seen, const Task& task) {
  const std::string during = "; during " + describe_wait(task.what, seq, opts.rank, std::max(0, seen.rank()));
  const Deadline until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until) {
    std::optional<std::string> failed;
    try {
      failed = store->try_get(kFailedRanksKey, until);
    } catch (const Error&) {
      break;
    }
    if (auto r = first_failed_rank(failed)) {
      throw rank_died(*r, during + "; rank " + std::to_string(opts.rank) + " saw: " + seen.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (seen.rank() >= 0) throw rank_died(seen.rank(), during + "; rank " + std::to_string(opts.rank) + " saw: " + seen.what());
  throw seen;
}

void Communicator::Impl::publish_mismatch(const std::string& text) {
  if (!store) return;
  try {
    const Deadline until = Clock::now() + std::chrono::milliseconds(500);
    if (!store->try_get(key("mismatch"), until)) store->set(key("mismatch"), text, until);  // the first finding stays
  } catch (const Error& e) {
    spdlog::debug("tandem rank {}: could not publish the mismatch: {}", opts.rank, e.what());
  }
}

// What other ranks found out about this call: a mismatch, or a rank that
// left the communicator after the previous call (it skipped this one).
void Communicator::Impl::check_calls_match(const Task& task, int waiting_on, Deadline until) {
  std::optional<std::string> mismatch, left, abandoned;
  try {
    mismatch = store->try_get(key("mismatch"), until);
    // An exchange has no call numbers: a peer that gave up after an error is all it can learn.
    if (task.what.point_to_point()) abandoned = store->try_get(key("abandoned"), until);
    if (seq > 1 && !task.what.point_to_point()) left = store->try_get(key("left/" + std::to_string(seq - 1)), until);
  } catch (const Timeout&) {
    return;  // a slow store: ask again at the next poll
  } catch (const PeerFailure& e) {
    throw_store_lost(e);
  }
  const std::string during = describe_wait(task.what, seq, opts.rank, waiting_on);
  if (mismatch) throw CollectiveMismatch(*mismatch + " (rank " + std::to_string(opts.rank) + " learned it during " + during + ")");
  if (abandoned) {
    throw PeerFailure(std::atoi(abandoned->c_str()), "rank " + *abandoned +
                                                         " left the communicator after an error or abort(), during " + during);
  }
  if (left) {
    throw CollectiveMismatch("rank " + *left + " skipped call #" + std::to_string(seq) +
                             ": it destroyed its communicator after call #" + std::to_string(seq - 1) + ", while " +
                             during + "; every rank must issue the same collectives in the same order");
  }
}

void Communicator::Impl::explain_mismatch() {
  if (!store) return;
  const Deadline until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until) {
    std::optional<std::string> found;
    try {
      found = store->try_get(key("mismatch"), until);
    } catch (const Error&) {
      return;
    }
    if (found) throw CollectiveMismatch(*found + " (rank " + std::to_string(opts.rank) + " learned it from the store)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Communicator::Impl::throw_aborted() {
  std::lock_guard<std::mutex> lock(mu);
  throw Aborted("communicator aborted: " + abort_reason);
}

void Communicator::Impl::check_open_locked() const {
  if (aborted) throw Aborted("communicator aborted: " + abort_reason);
  if (stopping) throw Aborted("communicator is shutting down");
}

Task Communicator::Impl::make_task(std::function<void(Channel&)> body, const CollectiveOptions& o,
                                   const Description& what) const {
  Task task{std::move(body), std::make_shared<Request::State>(), o.timeout.value_or(opts.timeout), {}, what};
  task.deadline = Clock::now() + task.timeout;
  task.state->deadline = task.deadline;
  return task;
}

void Communicator::Impl::check_health(const Task& task, int waiting_on) {
  const Description& what = task.what;
  flight->waiting_on(waiting_on);
  if (aborted.load(std::memory_order_relaxed)) throw_aborted();
  if (heartbeat_failed.load(std::memory_order_relaxed)) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu);
      why = heartbeat_error;
    }
    throw_store_lost(Error(why + "; during " + describe_wait(what, seq, opts.rank, waiting_on)));
  }
  const auto now = Clock::now();
  int dead = ucx->failed_peer();
  if (dead >= 0) {
    throw rank_died(dead, "; its UCX endpoint reported an error during " + describe_wait(what, seq, opts.rank, waiting_on));
  }
  if (now >= next_failure_poll) {
    next_failure_poll = now + opts.failure_poll;
    std::optional<std::string> failed_ranks;
    try {
      failed_ranks = store->try_get(kFailedRanksKey, now + store_patience());
    } catch (const Timeout&) {
      // A slow store is not a dead peer; the collective deadline still bounds us.
    } catch (const PeerFailure& e) {
      throw_store_lost(e);
    }
    if (auto r = first_failed_rank(failed_ranks))
      throw rank_died(*r, "; during " + describe_wait(what, seq, opts.rank, waiting_on));
    check_calls_match(task, waiting_on, now + store_patience());
  }
  if (now >= task.deadline) {
    throw Timeout(describe_wait(what, seq, opts.rank, waiting_on) + " timed out after " +
                  std::to_string(task.timeout.count()) + " ms" +
                  "; check that every rank calls the same collectives with the same dtype in the same order "
                  "(mismatched calls never match); if the job is just slow, raise CommOptions::timeout "
                  "(TANDEM_TIMEOUT_MS)");
  }
}

std::chrono::microseconds Communicator::Impl::until_next_check(const Task& task) const {
  const auto now = Clock::now();
  const auto next = std::min({task.deadline, next_failure_poll, now + opts.failure_poll});
  return std::max(std::chrono::microseconds(0), std::chrono::duration_cast<std::chrono::microseconds>(next - now));
}

void* Communicator::Impl::scratch_buffer(size_t bytes, int slot, MemoryType memory) {
  if (slot < 0 || slot > 64) throw InvalidArgument("scratch slot out of range");
  auto& buffers = memory == MemoryType::host ? host_scratch : device_scratch;
  while (buffers.size() <= size_t(slot)) buffers.emplace_back(memory);
  return buffers[slot].get(bytes);
}

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
  if (host_shm) transports += " + shared memory within each host";
}

// Rank 0 compares every rank's (protocol, build, world size, job) with its
// own and publishes the verdict; every rank waits for it, so a mismatch fails
// them all as soon as the odd rank has announced itself, naming both values.
void Communicator::Impl::check_versions(Deadline deadline) {
  const std::string mine = "protocol " + std::to_string(kWireProtocol) + ", build " + TANDEM_BUILD_ID +
                           ", world size " + std::to_string(opts.size) +
                           ", job " + (opts.job_id.empty() ? "(none)" : opts.job_id);
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
                  "slowly (" + e.what() + ")");
  }
  if (verdict != "ok") throw InvalidArgument(verdict);
}

void Communicator::Impl::start_heartbeat(Deadline deadline) {
  heartbeat_store = store->connect_again(deadline);
  // Registered (or the first beat) before any collective.
  if (heartbeat_store->tracks_liveness()) {
    heartbeat_store->heartbeat(opts.rank, opts.heartbeat, deadline);
  } else {
    peer_watch = std::make_unique<PeerWatch>(*heartbeat_store, opts.prefix, opts.rank, opts.size, opts.heartbeat);
    peer_watch->beat(deadline);
  }
  const auto interval = peer_watch ? peer_watch->step_interval() : opts.heartbeat / 2;
  heartbeat_thread = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (cv_heartbeat.wait_for(lock, interval, [&] { return heartbeat_stopping; })) return;
      lock.unlock();
      std::string error;
      try {
        const Deadline until = Clock::now() + opts.heartbeat;
        if (peer_watch) {
          peer_watch->step(Clock::now(), until);
        } else {
          heartbeat_store->heartbeat(opts.rank, opts.heartbeat, until);
        }
      } catch (const std::exception& e) {
        error = std::string("rank ") + std::to_string(opts.rank) + " cannot reach the store to send its heartbeat (" +
                e.what() + ")";
      }
      lock.lock();
      if (!error.empty()) {
        heartbeat_error = error;
        heartbeat_failed = true;
        return;
      }
    }
  });
}

void Communicator::Impl::stop_heartbeat() {
  if (!heartbeat_thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    heartbeat_stopping = true;
  }
  cv_heartbeat.notify_all();
  heartbeat_thread.join();
  if (!heartbeat_failed) {
    try {
      const Deadline until = Clock::now() + std::chrono::seconds(2);
      if (peer_watch) {
        peer_watch->leave(until);
      } else {
        heartbeat_store->goodbye(until);
      }
    } catch (const std::exception& e) {
      spdlog::debug("tandem rank {}: heartbeat goodbye: {}", opts.rank, e.what());
    }
  }
  peer_watch.reset();
  heartbeat_store.reset();
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
        spdlog::warn("tandem: rank {} sizes its shared segment differently (TANDEM_SHM_CHUNK_BYTES must agree); "
                     "its host's ranks go through UCX only", p);
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
      if (opts.rank == group[0]) spdlog::warn("tandem: shared memory off, collectives go through UCX only ({})", verdict);
      return;
    }
    cma_everywhere = cma_everywhere && verdict == "ok+cma";
  }
  if (everyone) {
    shm = std::move(set);
    cma = cma_everywhere;
    return;
  }
  host_shm = std::move(set);
  host_view.bytes = bytes;
  for (int p : group) host_view.segment.push_back(host_shm->view().segment[size_t(p)]);
}

std::shared_ptr<Request::State> Communicator::Impl::enqueue(std::function<void(Channel&)> body,
                                                            const CollectiveOptions& o, const Description& what) {
  Task task = make_task(std::move(body), o, what);
  auto state = task.state;
  {
    std::lock_guard<std::mutex> lock(mu);
    check_open_locked();
    queue.push_back(std::move(task));
  }
  cv.notify_one();
  return state;
}

void Communicator::Impl::execute(Task& task) {
  // Exchanges are not collectives: other ranks do not count them, and the
  // flight recorder (compared across ranks) leaves them out.
  const bool collective = !task.what.point_to_point();
  if (collective) {
    ++seq;
    record_begin(task);
  }
  if (sticky) {
    task.state->finish(sticky);
    if (collective) flight->end(seq, false, "not run: an earlier call failed");
    return;
  }
  try {
    if (aborted) throw_aborted();
    EngineChannel channel(*this, task);
    task.body(channel);
    channel.finish();
    task.state->finish(nullptr);
    if (collective) flight->end(seq, true);
  } catch (const CollectiveMismatch& e) {
    // The shared-memory path does not know the call's number.
    std::string text = e.what();
    if (text.find("call #") == std::string::npos) text = "call #" + std::to_string(seq) + ": " + text;
    spdlog::error("tandem rank {}: {}", opts.rank, text);
    publish_mismatch(text);
    sticky = std::make_exception_ptr(CollectiveMismatch(text));
    failed = true;
    record_failure(text, "mismatch", collective);
    task.state->finish(sticky);
  } catch (const std::exception& e) {
    // Any failure leaves peers in an unknown state (a mismatched collective
    // too): sticky. Only a mismatch is logged here, as nothing else names it.
    if (dynamic_cast<const InvalidArgument*>(&e)) spdlog::error("tandem rank {}: {}", opts.rank, e.what());
    sticky = std::current_exception();
    failed = true;
    record_failure(e.what(), dynamic_cast<const Timeout*>(&e)        ? "timeout"
                             : dynamic_cast<const Aborted*>(&e)      ? "abort"
                             : dynamic_cast<const PeerFailure*>(&e) ? "peer failure"
                                                                      : "failure",
                   collective);
    task.state->finish(sticky);
  }
}

void Communicator::Impl::record_begin(const Task& task) {
  const Description& d = task.what;
  flight->begin(seq, {d.name, d.dtype, d.op, d.count, d.root}, shm != nullptr);
}

void Communicator::Impl::record_failure(const std::string& error, const char* reason, bool collective) {
  if (collective) flight->end(seq, false, error);
  flight->dump(std::string(reason) + " at call #" + std::to_string(seq));
}

MemoryType Communicator::Impl::memory_type(const CollectiveOptions& o) const {
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

void Communicator::Impl::run_engine() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return (stopping && !busy) || (!queue.empty() && !busy); });
      if (queue.empty()) return;  // stopping
      task = std::move(queue.front());
      queue.pop_front();
      busy = true;
    }
    execute(task);
    std::lock_guard<std::mutex> lock(mu);
    busy = false;  // only this thread waits on `busy` here: nobody to wake
  }
}

// Blocking calls on an idle communicator run on the caller's thread: no
// hand-off to the engine and back, which is most of a small collective's cost.
// Anything already queued keeps its place: then the call queues behind it.
void Communicator::Impl::run_blocking(std::function<void(Channel&)> body, const CollectiveOptions& o,
                                      const Description& what) {
  bool run_here = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    check_open_locked();
    run_here = queue.empty() && !busy;
    if (run_here) busy = true;
  }
  if (!run_here) {
    Request(enqueue(std::move(body), o, what)).wait();
    return;
  }
  Task task = make_task(std::move(body), o, what);
  execute(task);
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    busy = false;
    queued = !queue.empty() || stopping;
  }
  // Wake the engine only if work arrived meanwhile: a futex wake per small
  // collective would cost more than the collective.
  if (queued) cv.notify_all();
  if (task.state->error) std::rethrow_exception(task.state->error);
}

void Communicator::Impl::finalize() {
  if (!store) return;
  const Deadline deadline = Clock::now() + std::chrono::seconds(10);
  try {
    // A rank still waiting in a later call learns that this one skipped it.
    store->set(key("left/" + std::to_string(seq)), std::to_string(opts.rank), deadline);
    if (failed || aborted) {
      // Tell the others not to wait for us at the finalize barrier.
      // The first rank to give up stays named (exchanges report it).
      if (!store->try_get(key("abandoned"), deadline)) store->set(key("abandoned"), std::to_string(opts.rank), deadline);
    } else if (finalize_barrier(deadline)) {
      // Everyone has finished its last collective before endpoints go away.
      ucx->close_endpoints(deadline);
      if (server) {
        // Keep hosting the store until every other rank has left.
        while (store->add(key("departed"), 0, deadline) < opts.size - 1 && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      } else {
        store->add(key("departed"), 1, deadline);
      }
    }
    store->goodbye(deadline);
  } catch (const std::exception& e) {
    spdlog::debug("tandem rank {}: finalize: {}", opts.rank, e.what());
  }
}

bool Communicator::Impl::finalize_barrier(Deadline deadline) {
  const std::string done = arrive("finalize", deadline);
  while (Clock::now() < deadline) {
    if (store->try_get(done, deadline)) return true;
    if (store->try_get(key("abandoned"), deadline) || store->try_get(kFailedRanksKey, deadline)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// ---- Communicator ----------------------------------------------------------

bool ranks_outnumber_cores(const CommOptions& options) {
  return options.local_size > int(std::thread::hardware_concurrency());
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Communicator> Communicator::create(const CommOptions& options, std::shared_ptr<Algorithms> algorithms) {
  if (!algorithms) throw InvalidArgument("Communicator::create needs algorithms (e.g. tandem::ring::algorithms())");
  if (options.size < 1 || options.size > kMaxRanks) {
    throw InvalidArgument("world size " + std::to_string(options.size) + " is out of range 1.." +
                          std::to_string(kMaxRanks));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    throw InvalidArgument("rank " + std::to_string(options.rank) + " is out of range for world size " +
                          std::to_string(options.size));
  }
  if (options.size > 1 && options.store_address.empty() && !options.store) {
    throw InvalidArgument("world size " + std::to_string(options.size) +
                          " needs a store address: run under `tandem launch`, or set TANDEM_STORE_ADDR=host:port");
  }
  if (options.heartbeat.count() < 0 || (options.heartbeat.count() > 0 && options.heartbeat < std::chrono::milliseconds(100))) {
    throw InvalidArgument("CommOptions::heartbeat of " + std::to_string(options.heartbeat.count()) +
                          " ms: use 0 (off) or at least 100 ms (TANDEM_HEARTBEAT_MS)");
  }
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  if (options.store) impl->opts.host_store = false;  // a handed-in store is never hosted
  impl->algorithms = std::move(algorithms);
  impl->oversubscribed = ranks_outnumber_cores(options);
  impl->topology = make_topology({"this host"}, 0);
  if (options.size > 1) impl->connect();
  impl->allocations = std::make_unique<SharedAllocations>(impl->shm != nullptr);
  impl->flight = std::make_unique<FlightRecorder>(options, options.flight_entries, options.flight_dir);
  Impl* raw = impl.get();
  impl->engine = std::thread([raw] { raw->run_engine(); });
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->engine.joinable()) impl_->engine.join();
  for (auto& t : impl_->queue) t.state->finish(std::make_exception_ptr(Aborted("communicator destroyed")));
  impl_->finalize();
  impl_->stop_heartbeat();
  // After a failure a peer may never acknowledge a flush: close at once.
  if (impl_->ucx && (impl_->failed || impl_->aborted)) {
    impl_->ucx->close_endpoints(Clock::now() + std::chrono::seconds(2), /*force=*/true);
  }
  impl_->ucx.reset();
  impl_->shm.reset();
  impl_->host_shm.reset();
  impl_->allocations.reset();
  impl_->store.reset();
  impl_->server.reset();
}

int Communicator::rank() const { return impl_->opts.rank; }
int Communicator::size() const { return impl_->opts.size; }
const CommOptions& Communicator::options() const { return impl_->opts; }
const Topology& Communicator::topology() const { return impl_->topology; }

namespace {

void require_buffers(const char* what, const void* input, const void* output, size_t count) {
  if (count > 0 && (!input || !output)) {
    throw InvalidArgument(std::string(what) + ": null buffer with count " + std::to_string(count));
  }
}

Description describe(const char* what, size_t count, DataType dtype) { return {what, count, dtype, std::nullopt}; }

Description describe(const char* what, size_t count, DataType dtype, ReduceOp op) { return {what, count, dtype, op}; }

}  // namespace

std::function<void(Channel&)> Communicator::allreduce_body(const void* input, void* output, size_t count,
                                                           DataType dtype, ReduceOp op, const CollectiveOptions& opts) {
  require_buffers("allreduce", input, output, count);
  if (opts.chunk_bytes != 0 && opts.chunk_bytes < 4096) {
    throw InvalidArgument("allreduce: CollectiveOptions::chunk_bytes must be 0 (the communicator's) or >= 4096 (got " +
                          std::to_string(opts.chunk_bytes) + ")");
  }
  AllreduceArgs args{input, output, count, dtype, op, impl_->memory_type(opts), opts.chunk_bytes};
  return [algorithms = impl_->algorithms, args](Channel& ch) { algorithms->allreduce(ch, args); };
}

Request Communicator::allreduce_async(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                                      const CollectiveOptions& opts) {
  return Request(impl_->enqueue(allreduce_body(input, output, count, dtype, op, opts), opts,
                                describe("allreduce", count, dtype, op)));
}

void Communicator::allreduce(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                             const CollectiveOptions& opts) {
  impl_->run_blocking(allreduce_body(input, output, count, dtype, op, opts), opts,
                      describe("allreduce", count, dtype, op));
}

std::function<void(Channel&)> Communicator::reduce_scatter_body(const void* input, void* output, size_t count,
                                                                DataType dtype, ReduceOp op,
                                                                const CollectiveOptions& opts) {
  require_buffers("reduce_scatter", input, output, count);
  ReduceScatterArgs args{input, output, count, dtype, op, impl_->memory_type(opts)};
  return [algorithms = impl_->algorithms, args](Channel& ch) { algorithms->reduce_scatter(ch, args); };
}

Request Communicator::reduce_scatter_async(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                                           const CollectiveOptions& opts) {
  return Request(impl_->enqueue(reduce_scatter_body(input, output, count, dtype, op, opts), opts,
                                describe("reduce_scatter", count, dtype, op)));
}

void Communicator::reduce_scatter(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                                  const CollectiveOptions& opts) {
  impl_->run_blocking(reduce_scatter_body(input, output, count, dtype, op, opts), opts,
                      describe("reduce_scatter", count, dtype, op));
}

std::function<void(Channel&)> Communicator::allgather_body(const void* input, void* output, size_t count,
                                                           DataType dtype, const CollectiveOptions& opts) {
  require_buffers("allgather", input, output, count);
  AllgatherArgs args{input, output, count, dtype, impl_->memory_type(opts)};
  return [algorithms = impl_->algorithms, args](Channel& ch) { algorithms->allgather(ch, args); };
}

Request Communicator::allgather_async(const void* input, void* output, size_t count, DataType dtype,
                                      const CollectiveOptions& opts) {
  return Request(
      impl_->enqueue(allgather_body(input, output, count, dtype, opts), opts, describe("allgather", count, dtype)));
}

void Communicator::allgather(const void* input, void* output, size_t count, DataType dtype,
                             const CollectiveOptions& opts) {
  impl_->run_blocking(allgather_body(input, output, count, dtype, opts), opts, describe("allgather", count, dtype));
}

std::function<void(Channel&)> Communicator::broadcast_body(const void* input, void* output, size_t count,
                                                           DataType dtype, int root, const CollectiveOptions& opts) {
  if (root < 0 || root >= size()) {
    throw InvalidArgument("broadcast: root " + std::to_string(root) + " is out of range for world size " +
                          std::to_string(size()));
  }
  if (count > 0 && (!output || (rank() == root && !input))) {
    throw InvalidArgument("broadcast: null buffer with count " + std::to_string(count));
  }
  BroadcastArgs args{input, output, count, dtype, root, impl_->memory_type(opts)};
  return [algorithms = impl_->algorithms, args](Channel& ch) { algorithms->broadcast(ch, args); };
}

Request Communicator::broadcast_async(const void* input, void* output, size_t count, DataType dtype, int root,
                                      const CollectiveOptions& opts) {
  return Request(impl_->enqueue(broadcast_body(input, output, count, dtype, root, opts), opts,
                                Description{"broadcast", count, dtype, std::nullopt, root}));
}

void Communicator::broadcast(const void* input, void* output, size_t count, DataType dtype, int root,
                             const CollectiveOptions& opts) {
  impl_->run_blocking(broadcast_body(input, output, count, dtype, root, opts), opts,
                      Description{"broadcast", count, dtype, std::nullopt, root});
}

Request Communicator::barrier_async(const CollectiveOptions& opts) {
  return Request(impl_->enqueue([algorithms = impl_->algorithms](Channel& ch) { algorithms->barrier(ch); }, opts,
                                Description{"barrier", 0, std::nullopt, std::nullopt}));
}

void Communicator::barrier(const CollectiveOptions& opts) {
  impl_->run_blocking([algorithms = impl_->algorithms](Channel& ch) { algorithms->barrier(ch); }, opts,
                      Description{"barrier", 0, std::nullopt, std::nullopt});
}

void Communicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->aborted) return;
    impl_->abort_reason = reason;
    impl_->aborted = true;
  }
  impl_->cv.notify_all();
  if (impl_->ucx) impl_->ucx->wake();  // a wait sleeping on the worker sees the abort now
  impl_->flight->dump("abort: " + reason);
}

Request Communicator::exchange_async(std::function<void(Channel&)> body, const CollectiveOptions& opts) {
  if (!body) throw InvalidArgument("exchange: empty body");
  return Request(impl_->enqueue(std::move(body), opts, Description{"exchange", 0, std::nullopt, std::nullopt}));
}

void Communicator::exchange(std::function<void(Channel&)> body, const CollectiveOptions& opts) {
  if (!body) throw InvalidArgument("exchange: empty body");
  impl_->run_blocking(std::move(body), opts, Description{"exchange", 0, std::nullopt, std::nullopt});
}

bool Communicator::aborted() const { return impl_->aborted; }

void* Communicator::allocate_shared(size_t bytes) { return impl_->allocations->allocate(bytes); }

void Communicator::free_shared(void* p) { impl_->allocations->deallocate(p); }

std::string Communicator::transport_summary() const {
  if (!impl_->ucx) return "none (world size 1)";
  return impl_->transports;
}

}  // namespace tandem
