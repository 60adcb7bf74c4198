// Communicator: bootstrap through the store, UCX wire-up, and the engine
// thread that runs collectives in issue order.
#include "tandem/communicator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <immintrin.h>
#include <sched.h>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "tandem/netif.h"
#include "tandem/reduce.h"
#include "tandem/store.h"
#include "transport/shared_segments.h"
#include "transport/ucx_transport.h"

namespace tandem {

namespace {

// Tag layout: collective signature | sequence number | sending rank |
// algorithm's own tag. The signature (which collective, which dtype) keeps
// mismatched calls from ever matching each other: they time out instead of
// silently mixing data. Sequence numbers wrap; collectives are strictly ordered.
constexpr int kSignatureBits = 6;
constexpr int kSeqBits = 14;
constexpr int kRankBits = 12;
constexpr int kLocalBits = 32;
constexpr int kMaxRanks = 1 << kRankBits;
// Waiting has three phases, so that a short wait stays fast and a long one
// leaves the core to the threads that have work (the backward pass):
//  - spin: poll (UCX: progress the worker; shared memory: re-read a flag);
//  - UCX: arm the worker and sleep on its event fd, woken by the next message;
//    shared memory, which has no event to sleep on: sched_yield a while, then
//    sleep kIdleSleep per turn.
// Ranks outnumber cores: the rank we wait for may need our core, so yield soon
// (16 spins measured 2-3x faster than 256 for small all-reduces, 4 ranks on 2 cores).
constexpr unsigned kSpinsBeforeYield = 16;
// UCX waits spin this long before sleeping on the event fd.
constexpr auto kUcxSpin = std::chrono::microseconds(40);
// Shared-memory waits: pause this many turns (tens of microseconds), then yield
// kIdleYields turns, then sleep kIdleSleep per turn; after kIdleShortSleeps
// such turns (over 20 ms: the peer is late, not slow) kIdleLongSleep, which
// costs at most that much latency on a wait already a hundred times longer.
constexpr unsigned kIdleSpins = 2048;
constexpr unsigned kIdleYields = 64;
constexpr unsigned kIdleShortSleeps = 400;
constexpr auto kIdleSleep = std::chrono::microseconds(50);
constexpr auto kIdleLongSleep = std::chrono::microseconds(250);

// What a collective is, for error messages; formatted only when one is thrown,
// since building strings would cost more than a small collective.
struct Description {
  const char* name = "";
  size_t count = 0;
  std::optional<DataType> dtype;
  std::optional<ReduceOp> op;

  // 3 bits of collective kind, 3 of dtype.
  uint32_t signature() const {
    static constexpr const char* kKinds[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"};
    uint32_t kind = 0;
    for (uint32_t i = 0; i < 5; ++i) {
      if (std::strcmp(name, kKinds[i]) == 0) kind = i + 1;
    }
    return (kind << 3) | (dtype ? uint32_t(*dtype) + 1 : 0);
  }

  std::string str() const {
    if (!dtype) return name;
    std::string s = std::string(name) + "(" + std::to_string(count) + " x " + std::string(to_string(*dtype));
    if (op) s += ", " + std::string(to_string(*op));
    return s + ")";
  }
};

std::string describe_wait(const Description& what, int rank, int peer) {
  return what.str() + " on rank " + std::to_string(rank) + " (waiting for rank " + std::to_string(peer) + ")";
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

struct Communicator::Impl {
  CommOptions opts;
  std::shared_ptr<Algorithms> algorithms;
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<StoreClient> store;
  std::unique_ptr<UcxTransport> ucx;
  std::unique_ptr<SharedSegmentSet> shm;  // when all ranks share this host
  bool cma = false;                        // and every rank may copy from every other's memory
  std::unique_ptr<SharedAllocations> allocations;  // allocate_shared()
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

  uint32_t seq = 0;                                         // engine thread only
  std::vector<ScratchBuffer> host_scratch, device_scratch;  // by slot
  Clock::time_point next_failure_poll{};

  std::string key(const std::string& k) const { return opts.prefix + "/" + k; }
  void store_barrier(const std::string& name, Deadline deadline);
  void connect();
  void map_shared_memory(Deadline deadline);
  void run_engine();
  void run_blocking(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what);
  MemoryType memory_type(const CollectiveOptions& o) const;
  void execute(Task& task);
  void check_health(const Task& task, int waiting_on);
  // How long a sleeping wait may last before the next check_health is due.
  std::chrono::microseconds until_next_check(const Task& task) const;
  [[noreturn]] void throw_store_lost(const std::exception& e);
  [[noreturn]] void throw_aborted();
  void check_open_locked() const;  // caller holds mu
  Task make_task(std::function<void(Channel&)> body, const CollectiveOptions& o, const Description& what) const;
  std::string arrive(const std::string& barrier, Deadline deadline);
  [[noreturn]] void blame_first_failure(const PeerFailure& seen);
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
      : impl_(impl), task_(task), signature_(task.what.signature()) {}
  ~EngineChannel() override {
    // Anything still posted belongs to a collective that failed: cancel it so
    // UCX never touches the caller's buffers after we return.
    for (auto& p : live_) impl_.ucx->cancel(p);
  }

  int rank() const override { return impl_.opts.rank; }
  int size() const override { return impl_.opts.size; }

  Pending send(int peer, Tag tag, const void* data, size_t bytes) override {
    return blaming_first_failure([&] { return track(impl_.ucx->send(peer, full_tag(rank(), tag), data, bytes)); });
  }
  Pending recv(int peer, Tag tag, void* data, size_t bytes) override {
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
      impl_.blame_first_failure(e);
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
    // Sleep on the worker's event fd, waking for the next health check at the latest.
    while (!test(p)) {
      impl_.check_health(task_, p.peer());
      impl_.ucx->sleep(impl_.until_next_check(task_));
    }
  }

  const SharedSegments* shared_segments() const override { return impl_.shm ? &impl_.shm->view() : nullptr; }
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
    if (spins % 128 == 0) impl_.check_health(task_, peer);
    const bool yield_soon = impl_.oversubscribed && spins > kSpinsBeforeYield;
    if (spins <= kIdleSpins && !yield_soon) {
      _mm_pause();  // spinning on another core's cache line
    } else if (spins <= kIdleSpins + kIdleYields || (yield_soon && spins <= kIdleSpins)) {
      sched_yield();
    } else {
      // A long wait: leave the core to the process's other threads.
      std::this_thread::sleep_for(spins <= kIdleSpins + kIdleYields + kIdleShortSleeps ? kIdleSleep : kIdleLongSleep);
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
      impl_.blame_first_failure(e);
    }
  }

  // Busy-poll like MPI; yield when ranks outnumber cores, or now and then anyway.
  void back_off(int peer, unsigned spins) {
    if (spins % 128 == 0) impl_.check_health(task_, peer);
    if ((impl_.oversubscribed && spins > kSpinsBeforeYield) || spins % 65536 == 0) std::this_thread::yield();
  }

  Tag full_tag(int sender, Tag local) const {
    if (local >> kLocalBits) throw InvalidArgument("algorithm tag exceeds 32 bits");
    static_assert(kSignatureBits + kSeqBits + kRankBits + kLocalBits == 64);
    return (Tag(signature_) << (kSeqBits + kRankBits + kLocalBits)) |
           (Tag(impl_.seq & ((1u << kSeqBits) - 1)) << (kRankBits + kLocalBits)) | (Tag(sender) << kLocalBits) | local;
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
  std::vector<Pending> live_;
};

namespace {

// The rank the store saw die first (kFailedRanksKey lists them in order).
std::optional<int> first_failed_rank(const std::optional<std::string>& failed_ranks) {
  if (!failed_ranks || failed_ranks->empty()) return std::nullopt;
  return std::atoi(failed_ranks->c_str());
}

PeerFailure rank_died(int rank, const std::string& detail) {
  return PeerFailure(rank,
                     "rank " + std::to_string(rank) + " failed (its process exited or lost its connection)" + detail);
}

}  // namespace

void Communicator::Impl::throw_store_lost(const std::exception& e) {
  if (store_host_rank >= 0) {
    throw PeerFailure(store_host_rank, "rank " + std::to_string(store_host_rank) +
                                           " failed: the bootstrap store it hosted is gone (" + e.what() + ")");
  }
  throw PeerFailure(-1, std::string("lost the bootstrap store (launcher gone?): ") + e.what());
}

// A transport error names the peer at the other end of one message, which may
// only have died because another rank did (and then exited on its own error).
// The store knows which rank died first; name that one when it says so.
void Communicator::Impl::blame_first_failure(const PeerFailure& seen) {
  const Deadline until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until) {
    std::optional<std::string> failed;
    try {
      failed = store->try_get(kFailedRanksKey, until);
    } catch (const Error&) {
      break;
    }
    if (auto r = first_failed_rank(failed)) {
      throw rank_died(*r, "; rank " + std::to_string(opts.rank) + " saw: " + seen.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw seen;
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
  if (aborted.load(std::memory_order_relaxed)) throw_aborted();
  const auto now = Clock::now();
  int dead = ucx->failed_peer();
  if (dead >= 0) {
    throw PeerFailure(dead, "rank " + std::to_string(dead) + " failed: its UCX endpoint reported an error during " +
                                describe_wait(what, opts.rank, waiting_on));
  }
  if (now >= next_failure_poll) {
    next_failure_poll = now + opts.failure_poll;
    std::optional<std::string> failed_ranks;
    try {
      failed_ranks = store->try_get(kFailedRanksKey, now + std::chrono::seconds(2));
    } catch (const Timeout&) {
      // A slow store is not a dead peer; the collective deadline still bounds us.
    } catch (const PeerFailure& e) {
      throw_store_lost(e);
    }
    if (auto r = first_failed_rank(failed_ranks))
      throw rank_died(*r, " during " + describe_wait(what, opts.rank, waiting_on));
  }
  if (now >= task.deadline) {
    throw Timeout(what.str() + " timed out after " + std::to_string(task.timeout.count()) + " ms on rank " +
                  std::to_string(opts.rank) + " waiting for rank " + std::to_string(waiting_on) +
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
  auto [host, port] = parse_host_port(opts.store_address);
  if (opts.host_store) {
    StoreServerOptions so;
    so.host = host;
    so.port = port;
    server = std::make_unique<StoreServer>(so);
  }
  store = std::make_unique<StoreClient>(host, port, deadline);
  store->hello(opts.rank, deadline);
  if (opts.host_store) store->set(key("store_host"), std::to_string(opts.rank), deadline);
  // Interface selection (netif.h): every rank takes part; it logs the decision.
  network = select_interface(*store, opts, deadline);
  if (!opts.ucx_net_devices_pinned && !network.chosen.empty()) opts.ucx_net_devices = network.chosen;

  ucx = std::make_unique<UcxTransport>(opts.rank, opts.size, opts.ucx_peer_error_handling, opts.ucx_net_devices);
  store->set(key("ucx/" + std::to_string(opts.rank)), ucx->worker_address(), deadline);
  for (int p = 0; p < opts.size; ++p) {
    ucx->connect(p, store->get(key("ucx/" + std::to_string(p)), deadline));
  }
  if (auto h = store->try_get(key("store_host"), deadline)) store_host_rank = std::atoi(h->c_str());
  map_shared_memory(deadline);
  store_barrier("connected", deadline);
  transports = ucx->describe();
  if (shm) transports += cma ? " + shared memory, cross-memory attach" : " + shared memory";
}

// Every rank reaches the same verdict from the same store keys: all ranks on
// this host, all willing, and every segment mapped everywhere; or no shared
// memory at all. A rank that turned it off still answers, so the others
// neither wait for it nor disagree with it.
void Communicator::Impl::map_shared_memory(Deadline deadline) {
  const std::string me = std::to_string(opts.rank);
  const size_t bytes = algorithms->shared_bytes();
  const bool willing = opts.shared_memory && bytes > 0;
  // "<segment bytes>@<host>": segment sizes must agree too, they fix where every slot lies.
  const std::string host = willing ? host_identity() : "";
  const std::string here = willing ? std::to_string(bytes) + "@" + host : "off";
  store->set(key("shm/host/" + me), here, deadline);
  if (!willing) return;
  for (int p = 0; p < opts.size; ++p) {
    const std::string theirs = store->get(key("shm/host/" + std::to_string(p)), deadline);
    if (theirs == here) continue;
    // Ranks span hosts, or one turned shared memory off or sized it differently.
    const auto at = theirs.find('@');
    if (opts.rank == 0 && theirs == "off") {
      spdlog::warn("tandem: rank {} has shared memory off (TANDEM_SHM=0); every rank goes through UCX only", p);
    } else if (opts.rank == 0 && at != std::string::npos && theirs.substr(at + 1) == host) {
      spdlog::warn("tandem: rank {} sizes its shared segment differently (TANDEM_SHM_CHUNK_BYTES must agree); "
                   "every rank goes through UCX only", p);
    }
    return;
  }
  std::string why;
  try {
    shm = std::make_unique<SharedSegmentSet>(opts.rank, opts.size, bytes);
  } catch (const Error& e) {
    why = "rank " + me + " could not create its segment: " + e.what();
  }
  store->set(key("shm/at/" + me), shm ? shm->locator() : "", deadline);
  for (int p = 0; p < opts.size && why.empty(); ++p) {
    if (p == opts.rank) continue;
    const std::string locator = store->get(key("shm/at/" + std::to_string(p)), deadline);
    if (locator.empty()) break;  // that rank says why itself
    const std::string failed = shm->map_peer(p, locator);
    if (!failed.empty()) why = "rank " + me + " cannot map rank " + std::to_string(p) + "'s segment: " + failed;
  }
  bool cma_here = why.empty();
  for (int p = 0; p < opts.size && cma_here; ++p) cma_here = p == opts.rank || shm->cma_works(p);
  store->set(key("shm/ok/" + me), !why.empty() ? why : cma_here ? "ok+cma" : "ok", deadline);
  bool cma_everywhere = true;
  for (int p = 0; p < opts.size; ++p) {
    const std::string verdict = store->get(key("shm/ok/" + std::to_string(p)), deadline);
    if (verdict.rfind("ok", 0) != 0) {
      if (opts.rank == 0) spdlog::warn("tandem: shared memory off, collectives go through UCX only ({})", verdict);
      shm.reset();
      return;
    }
    cma_everywhere = cma_everywhere && verdict == "ok+cma";
  }
  cma = cma_everywhere;
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
  ++seq;
  if (sticky) {
    task.state->finish(sticky);
    return;
  }
  try {
    if (aborted) throw_aborted();
    EngineChannel channel(*this, task);
    task.body(channel);
    task.state->finish(nullptr);
  } catch (const std::exception& e) {
    // Any failure leaves peers in an unknown state (a mismatched collective
    // too): sticky. Only a mismatch is logged here, as nothing else names it.
    if (dynamic_cast<const InvalidArgument*>(&e)) spdlog::error("tandem rank {}: {}", opts.rank, e.what());
    sticky = std::current_exception();
    failed = true;
    task.state->finish(sticky);
  }
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
    if (failed || aborted) {
      // Tell the others not to wait for us at the finalize barrier.
      store->set(key("abandoned"), std::to_string(opts.rank), deadline);
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
  if (options.size > 1 && options.store_address.empty()) {
    throw InvalidArgument("world size " + std::to_string(options.size) +
                          " needs a store address: run under `tandem launch`, or set TANDEM_STORE_ADDR=host:port");
  }
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->algorithms = std::move(algorithms);
  impl->oversubscribed = ranks_outnumber_cores(options);
  if (options.size > 1) impl->connect();
  impl->allocations = std::make_unique<SharedAllocations>(impl->shm != nullptr);
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
  impl_->ucx.reset();
  impl_->shm.reset();
  impl_->allocations.reset();
  impl_->store.reset();
  impl_->server.reset();
}

int Communicator::rank() const { return impl_->opts.rank; }
int Communicator::size() const { return impl_->opts.size; }
const CommOptions& Communicator::options() const { return impl_->opts; }

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
                                describe("broadcast", count, dtype)));
}

void Communicator::broadcast(const void* input, void* output, size_t count, DataType dtype, int root,
                             const CollectiveOptions& opts) {
  impl_->run_blocking(broadcast_body(input, output, count, dtype, root, opts), opts,
                      describe("broadcast", count, dtype));
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
}

bool Communicator::aborted() const { return impl_->aborted; }

void* Communicator::allocate_shared(size_t bytes) { return impl_->allocations->allocate(bytes); }

void Communicator::free_shared(void* p) { impl_->allocations->deallocate(p); }

std::string Communicator::transport_summary() const {
  if (!impl_->ucx) return "none (world size 1)";
  return impl_->transports;
}

}  // namespace tandem
