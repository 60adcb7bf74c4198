// Bootstrap store server: one io_context on one thread. All store state
// (data, waiters, connections) is touched only on that thread, so it needs no
// locks; the failed-rank list is mirrored under a mutex for failed_ranks().
//
// (Terms and state: store_server_impl.h; one client's connection: store_connection.cc.)

#include <algorithm>
#include <future>
#include <mutex>
#include <utility>  // boost/asio/awaitable.hpp uses std::exchange without including it

#include "rendezvous/store_server_impl.h"
#include "src/subsystem_log.h"
#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem {

StoreServer::Impl::Impl(StoreServerOptions opts) : options(std::move(opts)) {
  listen();
  accept();
  thread = std::thread([this] {
    // A throwing handler must not take the server thread down (the destructor relies on it).
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        subsystem_log(Subsystem::store).error("tandem store: handler threw: {}", e.what());
      }
    }
  });
}

StoreServer::Impl::~Impl() {
  std::promise<void> done;
  asio::post(io, [this, &done] {
    stopping = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    accept_retry.cancel();
    heartbeat_timer.cancel();
    auto all = connections;  // close() erases from the set
    for (auto& c : all) c->close("server shutting down", false);
    done.set_value();
  });
  done.get_future().wait();
  work.reset();
  io.stop();
  thread.join();
}

void StoreServer::Impl::listen() {
  const std::string where = join_host_port(options.host, options.port);
  boost::system::error_code ec;
  tcp::endpoint ep;
  auto addr = asio::ip::make_address(options.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, options.port);
  } else {
    tcp::resolver resolver(io);
    auto results = resolver.resolve(options.host, std::to_string(options.port), tcp::resolver::passive, ec);
    if (ec || results.empty())
      throw Error("tandem store: cannot resolve listen address " + where + ": " + ec.message());
    ep = results.begin()->endpoint();
  }
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error("tandem store: cannot listen on " + where + ": " + ec.message());
  port = acceptor.local_endpoint().port();
}

void StoreServer::Impl::accept() {
  acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (stopping || ec == asio::error::operation_aborted) return;
    if (ec) {
      // E.g. out of file descriptors: back off instead of spinning.
      subsystem_log(Subsystem::store).warn("tandem store: accept failed: {}", ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](boost::system::error_code e) {
        if (!e && !stopping) accept();
      });
      return;
    }
    if (connections.size() >= options.max_connections && !make_room()) {
      boost::system::error_code ignored;
      socket.close(ignored);
      subsystem_log(Subsystem::store)
          .warn("tandem store: refused a connection: {} connections (max_connections), every one identified",
                connections.size());
      accept();
      return;
    }
    auto conn = std::make_shared<Connection>(*this, std::move(socket));
    conn->serial = ++accepted;
    connections.insert(conn);
    conn->start();
    accept();
  });
}

bool StoreServer::Impl::put(const std::string& key, std::string value, bool over_cap_ok) {
  auto it = data.find(key);
  const size_t old_bytes = it == data.end() ? 0 : key.size() + it->second.size();
  const size_t new_bytes = key.size() + value.size();
  if (!over_cap_ok && data_bytes - old_bytes + new_bytes > options.max_data_bytes) return false;
  data_bytes = data_bytes - old_bytes + new_bytes;
  if (it == data.end()) {
    data.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  return true;
}

bool StoreServer::Impl::erase(const std::string& key) {
  auto it = data.find(key);
  if (it == data.end()) return false;
  data_bytes -= key.size() + it->second.size();
  data.erase(it);
  return true;
}

bool StoreServer::Impl::make_room() {
  std::shared_ptr<Connection> oldest;
  for (const auto& c : connections)
    if (!c->closed && !c->identified() && (!oldest || c->serial < oldest->serial)) oldest = c;
  if (!oldest) return false;
  oldest->close(fmt::format("evicted: the store is at max_connections ({}) and this connection had not identified "
                            "itself",
                            options.max_connections),
                true);
  return true;
}

void StoreServer::Impl::enforce_budget() {
  while (buffered > options.max_buffered_bytes) {
    std::shared_ptr<Connection> biggest;
    for (const auto& c : connections)
      if (!c->closed && (!biggest || c->counted > biggest->counted)) biggest = c;
    if (!biggest || biggest->counted == 0) return;
    biggest->close(fmt::format("holds {} bytes in transit while the store's {} (max_buffered_bytes) are used up",
                               biggest->counted, options.max_buffered_bytes),
                   true);
  }
}

void StoreServer::Impl::notify(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto parked = it->second;  // try_complete() edits the list
  for (auto& c : parked) c->try_complete();
}

void StoreServer::Impl::watch_heartbeats(std::chrono::milliseconds interval) {
  const auto tick = std::max(std::chrono::milliseconds(1), interval / 10);
  const bool running = heartbeat_tick.count() > 0;
  if (running && heartbeat_tick <= tick) return;
  heartbeat_tick = tick;
  if (!running) check_heartbeats();
}

void StoreServer::Impl::check_heartbeats() {
  if (stopping) return;
  const auto now = Clock::now();
  // Woken a heartbeat interval or more late, this thread was not running:
  // beats may wait unread in the sockets. Judge once they have been read.
  const bool stalled = last_heartbeat_check != Clock::time_point{} && now - last_heartbeat_check > 10 * heartbeat_tick;
  last_heartbeat_check = now;
  for (const auto& c : connections) {
    if (stalled || c->closed || c->said_goodbye || c->heartbeat_interval.count() == 0) continue;
    const auto silent = now - c->last_beat;
    if (silent <= kSilentHeartbeats * c->heartbeat_interval) continue;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
    subsystem_log(Subsystem::store)
        .warn("tandem store: rank {} ({}) sent no heartbeat for {} ms (interval {} ms)", c->rank, c->peer, ms,
              c->heartbeat_interval.count());
    record_failure(c->rank, fmt::format("no heartbeat for {}.{} s, {} intervals of {} ms (the process is stopped, "
                                        "hung or cut off from the store)",
                                        ms / 1000, ms % 1000 / 100, kSilentHeartbeats, c->heartbeat_interval.count()));
    c->heartbeat_interval = std::chrono::milliseconds(0);  // reported once
  }
  heartbeat_timer.expires_after(heartbeat_tick);
  heartbeat_timer.async_wait([this](boost::system::error_code ec) {
    if (!ec) check_heartbeats();
  });
}

void StoreServer::Impl::record_failure(int rank, const std::string& reason) {
  std::string csv;
  {
    std::lock_guard lock(failed_mu);
    if (std::find(failed.begin(), failed.end(), rank) != failed.end()) return;
    failed.push_back(rank);
    csv = format_rank_list(failed);
  }
  put(failure_reason_key(rank), reason, /*over_cap_ok=*/true);  // small, and must never be lost
  put(kFailedRanksKey, csv, /*over_cap_ok=*/true);
  notify(kFailedRanksKey);
}

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreServer::~StoreServer() = default;

uint16_t StoreServer::port() const { return impl_->port; }

std::string StoreServer::address() const { return Impl::join_host_port(impl_->options.host, impl_->port); }

std::vector<int> StoreServer::failed_ranks() const {
  std::lock_guard lock(impl_->failed_mu);
  return impl_->failed;
}

void StoreServer::mark_failed(int rank, const std::string& reason) {
  if (impl_->io.get_executor().running_in_this_thread()) {
    impl_->record_failure(rank, reason);
    return;
  }
  // Run on the io thread (it owns the data and the waiters) and return once the key is visible.
  std::promise<void> done;
  asio::post(impl_->io, [this, rank, &reason, &done] {
    impl_->record_failure(rank, reason);
    done.set_value();
  });
  done.get_future().wait();
}

std::string format_rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) {
    if (!out.empty()) out += ',';
    out += std::to_string(r);
  }
  return out;
}

std::vector<int> parse_rank_list(const std::string& csv) {
  std::vector<int> out;
  for (size_t at = 0; at < csv.size();) {
    const size_t comma = std::min(csv.find(',', at), csv.size());
    const std::string item = csv.substr(at, comma - at);
    char* end = nullptr;
    const long rank = std::strtol(item.c_str(), &end, 10);
    if (!item.empty() && end && *end == '\0') out.push_back(int(rank));
    at = comma + 1;
  }
  return out;
}

}  // namespace tandem
