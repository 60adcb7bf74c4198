// Wire-up: the store (hosted here, reached, or handed in), the start-up
// check that every rank runs the same build, the heartbeat, then the
// endpoints; every rank leaves through a store barrier once all are connected.
#include <unistd.h>

#include <cstdlib>

#include "communicator_impl.h"

namespace tandem {

void Communicator::Impl::connect() {
  CommOptions& opts = ctx.opts;
  const Deadline deadline = Clock::now() + opts.connect_timeout;
  if (opts.store) {
    ctx.store = opts.store;
  } else {
    auto [host, port] = parse_host_port(opts.store_address);
    if (opts.host_store) {
      StoreServerOptions so;
      so.host = host;
      so.port = port;
      so.secret = opts.secret;
      server = std::make_shared<StoreServer>(so);
    }
    ctx.store = std::make_shared<StoreClient>(host, port, deadline, opts.secret);
  }
  KeyValueStore& store = *ctx.store;
  store.hello(opts.rank, deadline);
  char hostname[256] = "?";
  gethostname(hostname, sizeof hostname - 1);
  store.set(ctx.key("host/" + std::to_string(opts.rank)),
            "host " + std::string(hostname) + ", pid " + std::to_string(getpid()), deadline);
  calls.check_versions(deadline);
  if (opts.heartbeat.count() > 0) liveness.start(deadline);
  if (opts.host_store) store.set(ctx.key("store_host"), std::to_string(opts.rank), deadline);
  endpoints.connect(*algorithms, deadline);
  // Every rank published its UCX address after this key: it is there by now.
  if (auto h = store.try_get(ctx.key("store_host"), deadline)) ctx.store_host_rank = std::atoi(h->c_str());
  ctx.store_barrier("connected", deadline);
}

}  // namespace tandem
