// Communicator: create and destroy (finalize), and the calls that are not
// operations (exchange, abort, shared allocations); the operations start in
// start.cc. The parts it joins are in communicator_impl.h.
#include "tandem/communicator.h"

#include <algorithm>
#include <thread>

#include "communicator_impl.h"
#include "subsystem_log.h"
#include "tandem/logging.h"

namespace tandem {

namespace {

CommOptions effective(const CommOptions& options) {
  CommOptions o = options;
  if (o.store) o.host_store = false;  // a handed-in store is never hosted
  return o;
}

}  // namespace

Communicator::Impl::Impl(const CommOptions& options) : ctx{effective(options)} {}

void Communicator::Impl::finalize() {
  if (!ctx.store) return;
  KeyValueStore& store = *ctx.store;
  const Deadline deadline = Clock::now() + std::chrono::seconds(10);
  try {
    // A rank still waiting in a later call learns that this one skipped it.
    store.set(ctx.key("left/" + std::to_string(engine.seq())), std::to_string(ctx.rank()), deadline);
    if (!engine.healthy()) {
      // Tell the others not to wait for us at the finalize barrier.
      // The first rank to give up stays named (exchanges report it).
      if (!store.try_get(ctx.key(CallCheck::kAbandonedKey), deadline)) {
        store.set(ctx.key(CallCheck::kAbandonedKey), std::to_string(ctx.rank()), deadline);
      }
    } else if (finalize_barrier(deadline)) {
      // Everyone has finished its last collective before endpoints go away.
      endpoints.ucx->close_endpoints(deadline);
      if (server) {
        // Keep hosting the store until every other rank has left.
        while (store.add(ctx.key("departed"), 0, deadline) < ctx.size() - 1 && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      } else {
        store.add(ctx.key("departed"), 1, deadline);
      }
    }
    store.goodbye(deadline);
  } catch (const std::exception& e) {
    subsystem_log(Subsystem::comm).debug("tandem rank {}: finalize: {}", ctx.rank(), e.what());
  }
}

bool Communicator::Impl::finalize_barrier(Deadline deadline) {
  const std::string done = ctx.arrive("finalize", deadline);
  while (Clock::now() < deadline) {
    if (ctx.store->try_get(done, deadline)) return true;
    if (ctx.store->try_get(ctx.key(CallCheck::kAbandonedKey), deadline) ||
        ctx.store->try_get(kFailedRanksKey, deadline)) {
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// ---- Communicator ----------------------------------------------------------

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Communicator> Communicator::create(const CommOptions& options, std::shared_ptr<Algorithms> algorithms) {
  configure_logging();  // once per process, before the first line any subsystem logs
  if (!algorithms) throw InvalidArgument("Communicator::create needs algorithms (e.g. tandem::ring::algorithms())");
  if (options.join) return join(options, std::move(algorithms));
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
  if (options.failure_poll < std::chrono::milliseconds(1)) {
    throw InvalidArgument("CommOptions::failure_poll of " + std::to_string(options.failure_poll.count()) +
                          " ms: use at least 1 ms");
  }
  auto impl = std::make_unique<Impl>(options);
  impl->algorithms = std::move(algorithms);
  if (options.size > 1) impl->connect();
  impl->endpoints.allocations = std::make_unique<SharedAllocations>(impl->endpoints.shm != nullptr);
  impl->ctx.flight = std::make_unique<FlightRecorder>(options, options.flight_entries, options.flight_dir);
  impl->engine.start();
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

Communicator::~Communicator() {
  impl_->engine.stop();
  impl_->finalize();
  impl_->liveness.stop();
  impl_->endpoints.close(!impl_->engine.healthy());
  impl_->ctx.store.reset();
  impl_->server.reset();
}

int Communicator::rank() const { return impl_->ctx.rank(); }
int Communicator::size() const { return impl_->ctx.size(); }
const CommOptions& Communicator::options() const { return impl_->ctx.opts; }
const Topology& Communicator::topology() const { return impl_->endpoints.topology; }

void Communicator::abort(const std::string& reason) { impl_->engine.abort(reason); }

void Communicator::revoke(const std::string& reason) {
  CommContext& ctx = impl_->ctx;
  const std::string text = "rank " + std::to_string(ctx.rank()) + " revoked the communicator: " + reason;
  impl_->engine.abort(text, /*revoked=*/true);  // this rank's calls first: they need nothing from the store
  if (ctx.size() == 1) return;
  try {
    // Its own handle: the engine's thread may be using the communicator's.
    const Deadline deadline = Clock::now() + ctx.store_patience();
    ctx.store->connect_again(deadline)->set(ctx.key(Liveness::kRevokedKey), text, deadline);
  } catch (const std::exception& e) {
    // The others then stop on this rank's silence, as on any failure.
    subsystem_log(Subsystem::engine)
        .warn("tandem rank {}: revoke() could not tell the others: {}", ctx.rank(), e.what());
  }
}

bool Communicator::revoked() const { return impl_->engine.revoked(); }

Request Communicator::exchange_async(std::function<void(Channel&)> body, const CollectiveOptions& opts) {
  if (!body) throw InvalidArgument("exchange: empty body");
  return impl_->engine.submit(true, std::move(body), opts,
                              Description{Collective::exchange, 0, std::nullopt, std::nullopt});
}

void Communicator::exchange(std::function<void(Channel&)> body, const CollectiveOptions& opts) {
  if (!body) throw InvalidArgument("exchange: empty body");
  impl_->engine.run_blocking(std::move(body), opts, Description{Collective::exchange, 0, std::nullopt, std::nullopt});
}

bool Communicator::aborted() const { return impl_->engine.aborted(); }

void* Communicator::allocate_shared(size_t bytes) { return impl_->endpoints.allocations->allocate(bytes); }

void Communicator::free_shared(void* p) { impl_->endpoints.allocations->deallocate(p); }

std::string Communicator::transport_summary() const {
  if (!impl_->endpoints.ucx) return "none (world size 1)";
  return impl_->endpoints.transports;
}

uint64_t Communicator::shared_memory_traffic() const {
  return impl_->endpoints.shm_traffic.load(std::memory_order_relaxed);
}

}  // namespace tandem
