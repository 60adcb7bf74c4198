// Communicator: the public API, and the engine that runs collectives in issue
// order (queue, execute, finalize). Wire-up: wireup.cc; liveness: liveness.cc.
#include "tandem/communicator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "communicator_impl.h"
#include "engine_channel.h"

namespace tandem {

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

std::shared_ptr<Request::State> Communicator::Impl::enqueue(std::function<void(Channel&)> body,
                                                            const CollectiveOptions& o, const Description& what) {
  return enqueue(make_task(std::move(body), o, what));
}

std::shared_ptr<Request::State> Communicator::Impl::enqueue(Task task) {
  auto state = task.state;
  {
    std::lock_guard<std::mutex> lock(mu);
    check_open_locked();
    queue.push_back(std::move(task));
  }
  cv.notify_one();
  if (engine_sleeping) wake_sleeping_engine();
  return state;
}

namespace {

// A state only the task holds (a blocking call's on the caller's thread) has
// nobody to wake: no lock, whose locked instruction would wait for this
// call's last stores to reach the peers.
void finish(Task& task, std::exception_ptr e) {
  if (task.state.use_count() == 1) {
    task.state->done = true;
    task.state->error = std::move(e);
    return;
  }
  task.state->finish(std::move(e));
}

}  // namespace

void Communicator::Impl::execute(Task& task, Clock::time_point started) {
  if (task.what.collective == Collective::send_recv) return post(std::move(task));
  // Exchanges are not collectives: other ranks do not count them, and the
  // flight recorder (compared across ranks) leaves them out.
  const bool collective = !task.what.point_to_point();
  if (collective) {
    ++seq;
    record_begin(task, started);
  }
  if (sticky) {
    finish(task, sticky);
    if (collective) flight->end(seq, false, "not run: an earlier call failed");
    return;
  }
  try {
    if (aborted) throw_aborted();
    EngineChannel channel(*this, task);
    task.body(channel);
    channel.finish();
    finish(task, nullptr);
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
    finish(task, sticky);
  } catch (const std::exception& e) {
    // Any failure leaves peers in an unknown state (a mismatched collective
    // too): sticky. Only a mismatch is logged here, as nothing else names it.
    if (dynamic_cast<const InvalidArgument*>(&e)) spdlog::error("tandem rank {}: {}", opts.rank, e.what());
    sticky = std::current_exception();
    failed = true;
    record_failure(e.what(),
                   dynamic_cast<const Timeout*>(&e)       ? "timeout"
                   : dynamic_cast<const Aborted*>(&e)     ? "abort"
                   : dynamic_cast<const PeerFailure*>(&e) ? "peer failure"
                                                          : "failure",
                   collective);
    finish(task, sticky);
  }
}

void Communicator::Impl::record_begin(const Task& task, Clock::time_point started) {
  const Description& d = task.what;
  flight->begin(seq, {d.collective, d.dtype, d.op, d.count, d.root}, shm != nullptr, started);
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
  // `posted` changes only under `busy`: reading it here, with busy clear, is safe.
  for (;;) {
    Task task;
    bool have_task = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !busy && (stopping || !queue.empty() || !posted.empty()); });
      if (queue.empty() && posted.empty()) return;  // stopping
      if (!queue.empty()) {
        task = std::move(queue.front());
        queue.pop_front();
        have_task = true;
      }
      busy = true;
    }
    if (have_task) {
      execute(task, Clock::now());
    } else {
      // Posted sends and receives finish even while the communicator shuts
      // down, within their deadlines; their health checks see an abort.
      progress_posted();
    }
    std::lock_guard<std::mutex> lock(mu);
    busy = false;  // only this thread waits on `busy` here: nobody to wake
  }
}

// Blocking calls on an idle communicator run on the caller's thread: no
// hand-off to the engine and back, which is most of a small collective's cost.
// Anything already queued keeps its place: then the call queues behind it.
void Communicator::Impl::run_blocking(std::function<void(Channel&)> body, const CollectiveOptions& o,
                                      const Description& what) {
  if (!try_run_here(body, o, what)) Request(enqueue(std::move(body), o, what)).wait();
}

bool Communicator::Impl::try_run_here(std::function<void(Channel&)>& body, const CollectiveOptions& o,
                                      const Description& what) {
  {
    std::lock_guard<std::mutex> lock(mu);
    check_open_locked();
    if (!queue.empty() || busy) return false;
    busy = true;
  }
  // The inline calls' request state, reused: nothing else holds it between calls.
  if (!inline_state || inline_state.use_count() > 1) inline_state = std::make_shared<Request::State>();
  inline_state->done = false;
  inline_state->error = nullptr;
  inline_state->source = -1;
  Task task{std::move(body), std::move(inline_state), o.timeout.value_or(opts.timeout), {}, what};
  const Clock::time_point now = Clock::now();
  task.deadline = now + task.timeout;
  task.state->deadline = task.deadline;
  execute(task, now);
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    busy = false;
    queued = !queue.empty() || stopping || !posted.empty();
  }
  // Wake the engine only if work arrived meanwhile: a futex wake per small
  // collective would cost more than the collective.
  if (queued) cv.notify_all();
  const std::exception_ptr error = task.state->error;
  inline_state = std::move(task.state);  // moved, not copied: no reference count to change
  if (error) std::rethrow_exception(error);
  return true;
}

Request Communicator::Impl::submit(bool async, std::function<void(Channel&)> body, const CollectiveOptions& o,
                                   const Description& what) {
  if (async) return Request(enqueue(std::move(body), o, what));
  run_blocking(std::move(body), o, what);
  return Request();
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
      if (!store->try_get(key("abandoned"), deadline))
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
  if (options.size > 1 && options.store_address.empty() && !options.store) {
    throw InvalidArgument("world size " + std::to_string(options.size) +
                          " needs a store address: run under `tandem launch`, or set TANDEM_STORE_ADDR=host:port");
  }
  if (options.heartbeat.count() < 0 ||
      (options.heartbeat.count() > 0 && options.heartbeat < std::chrono::milliseconds(100))) {
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

Description describe(Collective what, size_t count, DataType dtype) { return {what, count, dtype, std::nullopt}; }

Description describe(Collective what, size_t count, DataType dtype, ReduceOp op) { return {what, count, dtype, op}; }

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
                                describe(Collective::allreduce, count, dtype, op)));
}

void Communicator::allreduce(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                             const CollectiveOptions& opts) {
  impl_->run_blocking(allreduce_body(input, output, count, dtype, op, opts), opts,
                      describe(Collective::allreduce, count, dtype, op));
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
                                describe(Collective::reduce_scatter, count, dtype, op)));
}

void Communicator::reduce_scatter(const void* input, void* output, size_t count, DataType dtype, ReduceOp op,
                                  const CollectiveOptions& opts) {
  impl_->run_blocking(reduce_scatter_body(input, output, count, dtype, op, opts), opts,
                      describe(Collective::reduce_scatter, count, dtype, op));
}

std::function<void(Channel&)> Communicator::allgather_body(const void* input, void* output, size_t count,
                                                           DataType dtype, const CollectiveOptions& opts) {
  require_buffers("allgather", input, output, count);
  AllgatherArgs args{input, output, count, dtype, impl_->memory_type(opts)};
  return [algorithms = impl_->algorithms, args](Channel& ch) { algorithms->allgather(ch, args); };
}

Request Communicator::allgather_async(const void* input, void* output, size_t count, DataType dtype,
                                      const CollectiveOptions& opts) {
  return Request(impl_->enqueue(allgather_body(input, output, count, dtype, opts), opts,
                                describe(Collective::allgather, count, dtype)));
}

void Communicator::allgather(const void* input, void* output, size_t count, DataType dtype,
                             const CollectiveOptions& opts) {
  impl_->run_blocking(allgather_body(input, output, count, dtype, opts), opts,
                      describe(Collective::allgather, count, dtype));
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
                                Description{Collective::broadcast, count, dtype, std::nullopt, root}));
}

void Communicator::broadcast(const void* input, void* output, size_t count, DataType dtype, int root,
                             const CollectiveOptions& opts) {
  impl_->run_blocking(broadcast_body(input, output, count, dtype, root, opts), opts,
                      Description{Collective::broadcast, count, dtype, std::nullopt, root});
}

Request Communicator::barrier_async(const CollectiveOptions& opts) {
  return Request(impl_->enqueue([algorithms = impl_->algorithms](Channel& ch) { algorithms->barrier(ch); }, opts,
                                Description{Collective::barrier, 0, std::nullopt, std::nullopt}));
}

void Communicator::barrier(const CollectiveOptions& opts) {
  impl_->run_blocking([algorithms = impl_->algorithms](Channel& ch) { algorithms->barrier(ch); }, opts,
                      Description{Collective::barrier, 0, std::nullopt, std::nullopt});
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
  return Request(
      impl_->enqueue(std::move(body), opts, Description{Collective::exchange, 0, std::nullopt, std::nullopt}));
}

void Communicator::exchange(std::function<void(Channel&)> body, const CollectiveOptions& opts) {
  if (!body) throw InvalidArgument("exchange: empty body");
  impl_->run_blocking(std::move(body), opts, Description{Collective::exchange, 0, std::nullopt, std::nullopt});
}

bool Communicator::aborted() const { return impl_->aborted; }

void* Communicator::allocate_shared(size_t bytes) { return impl_->allocations->allocate(bytes); }

void Communicator::free_shared(void* p) { impl_->allocations->deallocate(p); }

std::string Communicator::transport_summary() const {
  if (!impl_->ucx) return "none (world size 1)";
  return impl_->transports;
}

uint64_t Communicator::shared_memory_traffic() const { return impl_->shm_traffic.load(std::memory_order_relaxed); }

}  // namespace tandem
