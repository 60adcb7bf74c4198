// Bootstrap store server: one io_context on one thread. All store state
// (data, waiters, connections) is touched only on that thread, so it needs no
// locks; the failed-rank list is mirrored under a mutex for failed_ranks().
//
// Terms: a connection is "identified" once it has sent a complete frame and,
// with a secret, proved it; "buffered" bytes are those of frames in transit
// (received but not yet handled, or replies not yet written), summed over all
// connections and capped by max_buffered_bytes. Reads go through one scratch
// buffer owned by the server, so an idle connection costs a socket and a few
// hundred bytes.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include "rendezvous/store_admission.h"
#include "store_protocol.h"
#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem {

namespace asio = boost::asio;
using asio::ip::tcp;
namespace sp = store_protocol;

namespace {

std::string join_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string endpoint_text(const tcp::endpoint& ep) { return join_host_port(ep.address().to_string(), ep.port()); }

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

// A parked wait longer than this is treated as "forever"; keeps chrono arithmetic in range.
constexpr uint64_t kMaxParkMs = 7ull * 24 * 3600 * 1000;

}  // namespace

struct StoreServer::Impl {
  struct Connection;

  StoreServerOptions options;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  asio::steady_timer heartbeat_timer{io};
  std::chrono::milliseconds heartbeat_tick{0};  // 0 until a rank beats
  uint16_t port = 0;
  std::thread thread;

  // io-thread state
  bool stopping = false;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Connection>>> waiters;  // key -> parked requests
  std::set<std::shared_ptr<Connection>> connections;
  uint64_t accepted = 0;       // connections accepted so far (each one's serial)
  size_t data_bytes = 0;       // keys + values in `data`
  size_t buffered = 0;         // see the top of this file
  std::array<char, 64 * 1024> scratch;  // every read lands here first

  mutable std::mutex failed_mu;
  std::vector<int> failed;  // guarded by failed_mu; written on the io thread only

  explicit Impl(StoreServerOptions opts);
  ~Impl();
  void listen();
  void accept();
  void notify(const std::string& key);
  void record_failure(int rank, const std::string& reason);
  // Checks heartbeats every tenth of the shortest interval seen.
  void watch_heartbeats(std::chrono::milliseconds interval);
  void check_heartbeats();
  bool has(const std::string& key) const { return data.count(key) != 0; }
  // Stores key = value unless that would pass max_data_bytes (then false).
  bool put(const std::string& key, std::string value, bool over_cap_ok = false);
  bool erase(const std::string& key);
  // At max_connections: closes the oldest unidentified connection; false if there is none.
  bool make_room();
  // Closes the connections with the most bytes in transit while over max_buffered_bytes.
  void enforce_budget();
};

struct StoreServer::Impl::Connection : std::enable_shared_from_this<Connection> {
  Impl& server;
  tcp::socket socket;
  std::string peer;
  asio::steady_timer frame_timer;  // first-frame deadline, then per-frame completion deadline
  asio::steady_timer park_timer;   // server-side expiry of a parked GET/WAIT
  asio::steady_timer write_timer;  // a reply must be taken within frame_timeout
  Clock::time_point first_frame_deadline;
  uint64_t serial = 0;             // order of acceptance
  size_t counted = 0;              // this connection's share of server.buffered
  std::string rbuf;           // received, not yet processed bytes
  std::string wpending;       // replies queued while a write is in flight
  std::string winflight;      // bytes of the write in flight
  bool writing = false;
  bool closed = false;
  bool got_first_frame = false;
  bool frame_timer_armed = false;  // armed for a partial frame (or for the first frame)
  int rank = -1;                   // registered by HELLO or HEARTBEAT
  bool said_goodbye = false;
  std::chrono::milliseconds heartbeat_interval{0};  // > 0 once the rank beats on this connection
  Clock::time_point last_beat;
  // With a secret: nothing but the handshake until the proof checks out.
  Admission admission{server.options.secret};
  bool close_after_write = false;   // rejected: the error reply goes out, then the connection closes

  // At most one parked request: the client is synchronous, later frames wait in rbuf.
  bool parked = false;
  sp::Op parked_op = sp::Op::get;
  std::vector<std::string> parked_keys;

  Connection(Impl& s, tcp::socket sock)
      : server(s), socket(std::move(sock)), frame_timer(s.io), park_timer(s.io), write_timer(s.io) {}

  bool identified() const { return got_first_frame && admission.authenticated(); }

  // Brings server.buffered up to date with this connection's buffers. Past
  // the budget, the connections holding the most are closed until it fits;
  // false if that closed this one.
  bool account() {
    const size_t now = closed ? 0 : rbuf.size() + wpending.size() + winflight.size();
    server.buffered = server.buffered - counted + now;
    counted = now;
    if (!closed) server.enforce_budget();
    return !closed;
  }

  void start() {
    boost::system::error_code ec;
    auto ep = socket.remote_endpoint(ec);
    peer = ec ? std::string("<unknown peer>") : endpoint_text(ep);
    socket.set_option(tcp::no_delay(true), ec);
    socket.non_blocking(true, ec);
    first_frame_deadline = Clock::now() + server.options.first_frame_timeout;
    arm_frame_timer(first_frame_deadline);
    read();
  }

  void read() {
    socket.async_wait(tcp::socket::wait_read, [self = shared_from_this()](boost::system::error_code ec) {
      self->on_readable(ec);
    });
  }

  void on_readable(boost::system::error_code ec) {
    if (closed) return;
    size_t n = 0;
    if (!ec) n = socket.read_some(asio::buffer(server.scratch), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return read();
    if (ec) {
      // EOF and resets are how clients leave; not worth a warning.
      close(ec == asio::error::eof ? "peer closed" : ec.message(), false);
      return;
    }
    rbuf.append(server.scratch.data(), n);
    if (!account()) return;
    // A synchronous client never has more than one request outstanding; bound what a pipelining one can queue.
    if (parked && rbuf.size() > sp::kHeaderBytes + kMaxKeyBytes + kMaxValueBytes) {
      close("sent more than one maximal frame while a request was waiting", true);
      return;
    }
    process();
    if (!closed) read();
  }

  // Handles every complete frame in rbuf, stopping at a partial one or a parked request.
  void process() {
    size_t pos = 0;
    while (!closed && !parked && !close_after_write) {
      // A bad header is refused as soon as it is here, before waiting for a (possibly huge) body.
      sp::Scan scan = sp::scan_frame(std::string_view(rbuf).substr(pos), /*expect_request=*/true);
      if (scan.kind == sp::Scan::broken) return close(scan.error, true);
      if (scan.kind == sp::Scan::partial) break;
      got_first_frame = true;
      frame_timer_armed = false;  // the frame being timed is complete
      handle(static_cast<sp::Op>(scan.header.opcode), std::string(scan.key), scan.value);
      pos += scan.header.frame_bytes();
    }
    if (closed) return;
    rbuf.erase(0, pos);
    if (rbuf.empty() && rbuf.capacity() > sizeof server.scratch) std::string().swap(rbuf);  // after a big frame
    if (!account()) return;
    update_frame_timer();
  }

  bool has_partial_frame() const {
    if (rbuf.empty()) return false;
    if (rbuf.size() < sp::kHeaderBytes) return true;
    return rbuf.size() < sp::decode_header(rbuf.data()).frame_bytes();
  }

  void update_frame_timer() {
    if (has_partial_frame()) {
      if (frame_timer_armed && got_first_frame) return;  // already timing this partial frame
      auto deadline = Clock::now() + server.options.frame_timeout;
      if (!got_first_frame) deadline = std::min(deadline, first_frame_deadline);
      arm_frame_timer(deadline);
    } else if (got_first_frame) {
      // Idle between frames is fine once the client has spoken.
      frame_timer_armed = false;
      frame_timer.cancel();
    }
  }

  void arm_frame_timer(Clock::time_point deadline) {
    frame_timer_armed = true;
    frame_timer.expires_at(deadline);
    frame_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->closed || !self->frame_timer_armed) return;
      if (self->frame_timer.expiry() > Clock::now()) return;  // re-armed after this wait completed
      if (!self->got_first_frame && self->rbuf.empty()) {
        self->close(fmt::format("no frame within first_frame_timeout ({} ms)",
                                self->server.options.first_frame_timeout.count()),
                    true);
      } else {
        self->close(fmt::format("frame incomplete after {} ms ({} bytes received)",
                                (self->got_first_frame ? self->server.options.frame_timeout
                                                       : self->server.options.first_frame_timeout)
                                    .count(),
                                self->rbuf.size()),
                    true);
      }
    });
  }

  void reply(sp::Op op, std::string_view key, std::string_view value) {
    if (closed) return;
    sp::append_frame(wpending, op, key, value);
    if (!account()) return;
    if (!writing) flush();
  }

  void flush() {
    if (!closed && wpending.empty() && close_after_write) close("rejected: " + peer, false);
    if (closed || wpending.empty()) return;
    writing = true;
    std::string().swap(winflight);  // a big reply's memory goes with it
    std::swap(winflight, wpending);
    // A client that stops reading its replies would pin them here: cut it off.
    write_timer.expires_after(server.options.frame_timeout);
    write_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || self->closed || !self->writing || self->write_timer.expiry() > Clock::now()) return;
      self->close(fmt::format("left a reply of {} bytes unread for {} ms (frame_timeout)", self->winflight.size(),
                              self->server.options.frame_timeout.count()),
                  true);
    });
    asio::async_write(socket, asio::buffer(winflight), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      self->writing = false;
      self->write_timer.cancel();
      if (self->closed) return;
      if (ec) {
        self->close("write failed: " + ec.message(), false);
        return;
      }
      self->winflight.clear();
      if (!self->account()) return;
      self->flush();
    });
  }

  void error_reply(const std::string& message) { reply(sp::Op::error, {}, message); }

  // Closes the connection once the error reply is out; no state has changed.
  void reject(const std::string& message) {
    spdlog::warn("tandem store: rejected {}: {}", peer, message);
    close_after_write = true;
    error_reply(message);
  }

  // The handshake (store_admission.h); false if `op` may not run yet.
  bool admit(sp::Op op, std::string_view value) {
    AdmissionStep step = admission.on(op, value);
    if (step.run) return true;
    if (step.close) {
      reject(step.value);
    } else {
      reply(step.reply, {}, step.value);
    }
    return false;
  }

  void handle(sp::Op op, const std::string& key, std::string_view value) {
    if (!admit(op, value)) return;
    switch (op) {
      case sp::Op::set:
        if (!server.put(key, std::string(value))) return error_reply(full(key, value.size()));
        reply(sp::Op::ok, {}, {});
        server.notify(key);
        return;
      case sp::Op::get: {
        auto wait_ms = sp::read_u64(value);
        if (!wait_ms || value.size() != 8) return error_reply("get: value must be the 8-byte wait in ms");
        if (auto it = server.data.find(key); it != server.data.end()) return reply(sp::Op::value, key, it->second);
        return park(sp::Op::get, {key}, *wait_ms);
      }
      case sp::Op::try_get:
        if (auto it = server.data.find(key); it != server.data.end()) return reply(sp::Op::value, key, it->second);
        return reply(sp::Op::not_found, key, {});
      case sp::Op::add: {
        auto delta = sp::parse_int64(value);
        if (!delta) return error_reply(fmt::format("add to key '{}': delta '{}' is not an int64", key, value));
        int64_t current = 0;
        if (auto it = server.data.find(key); it != server.data.end()) {
          auto parsed = sp::parse_int64(it->second);
          if (!parsed) return error_reply(fmt::format("add to key '{}': stored value is not an integer", key));
          current = *parsed;
        }
        int64_t total = 0;
        if (__builtin_add_overflow(current, *delta, &total))
          return error_reply(fmt::format("add to key '{}': int64 overflow", key));
        std::string text = std::to_string(total);
        if (!server.put(key, text)) return error_reply(full(key, text.size()));
        reply(sp::Op::value, key, text);
        server.notify(key);
        return;
      }
      case sp::Op::wait: {
        auto wait_ms = sp::read_u64(value);
        auto keys = wait_ms ? sp::decode_key_list(value.substr(8)) : std::nullopt;
        if (!keys) return error_reply("wait: malformed key list");
        if (keys->size() > server.options.max_wait_keys)
          return error_reply(fmt::format("wait: {} keys, more than the store's max_wait_keys ({})", keys->size(),
                                         server.options.max_wait_keys));
        if (missing(*keys).empty()) return reply(sp::Op::ok, {}, {});
        return park(sp::Op::wait, std::move(*keys), *wait_ms);
      }
      case sp::Op::check: {
        auto keys = sp::decode_key_list(value);
        if (!keys) return error_reply("check: malformed key list");
        if (keys->size() > server.options.max_wait_keys)
          return error_reply(fmt::format("check: {} keys, more than the store's max_wait_keys ({})", keys->size(),
                                         server.options.max_wait_keys));
        return reply(missing(*keys).empty() ? sp::Op::ok : sp::Op::not_found, {}, {});
      }
      case sp::Op::erase:
        return reply(server.erase(key) ? sp::Op::ok : sp::Op::not_found, key, {});
      case sp::Op::hello: {
        auto r = sp::parse_int64(value);
        if (!r || *r < 0 || *r > INT32_MAX) return error_reply(fmt::format("hello: bad rank '{}'", value));
        if (rank >= 0 && rank != *r)
          return error_reply(fmt::format("hello: connection already registered as rank {}", rank));
        rank = static_cast<int>(*r);
        said_goodbye = false;
        return reply(sp::Op::ok, {}, {});
      }
      case sp::Op::goodbye:
        said_goodbye = true;
        return reply(sp::Op::ok, {}, {});
      case sp::Op::heartbeat: {
        auto beat = sp::parse_heartbeat(value, int64_t(kMaxParkMs));
        if (!beat) return error_reply(fmt::format("heartbeat: expected '<rank>:<interval ms>', got '{}'", value));
        if (rank >= 0 && rank != beat->rank)
          return error_reply(fmt::format("heartbeat: connection already registered as rank {}", rank));
        rank = beat->rank;
        said_goodbye = false;
        heartbeat_interval = std::chrono::milliseconds(beat->interval_ms);
        last_beat = Clock::now();
        server.watch_heartbeats(heartbeat_interval);
        return reply(sp::Op::ok, {}, {});
      }
      default:
        // validate_header already rejected everything else.
        return error_reply("unexpected opcode");
    }
  }

  std::string full(const std::string& key, size_t value_bytes) const {
    return fmt::format("store full: {} more bytes for key '{}' would pass max_data_bytes ({}, {} in use); "
                       "delete keys the job no longer needs or start the store with a larger cap",
                       key.size() + value_bytes, key, server.options.max_data_bytes, server.data_bytes);
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!server.has(k)) out.push_back(k);
    return out;
  }

  void park(sp::Op op, std::vector<std::string> keys, uint64_t wait_ms) {
    parked = true;
    parked_op = op;
    parked_keys = std::move(keys);
    for (const auto& k : parked_keys) server.waiters[k].push_back(shared_from_this());
    park_timer.expires_after(std::chrono::milliseconds(std::min(wait_ms, kMaxParkMs)));
    park_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (ec || !self->parked || self->closed) return;
      if (self->park_timer.expiry() > Clock::now()) return;
      // Expired: answer so the client's connection stays in step, then continue with queued frames.
      auto still_missing = self->missing(self->parked_keys);
      self->unpark();
      self->reply(sp::Op::not_found, {}, join(still_missing, ","));
      self->process();
    });
  }

  void unpark() {
    if (!parked) return;
    parked = false;
    park_timer.cancel();
    auto self = shared_from_this();
    for (const auto& k : parked_keys) {
      auto it = server.waiters.find(k);
      if (it == server.waiters.end()) continue;
      auto& list = it->second;
      list.erase(std::remove(list.begin(), list.end(), self), list.end());
      if (list.empty()) server.waiters.erase(it);
    }
    parked_keys.clear();
  }

  // Called when one of the parked keys changed; completes the request if all keys exist now.
  void try_complete() {
    if (!parked || closed || !missing(parked_keys).empty()) return;
    if (parked_op == sp::Op::get) {
      const std::string key = parked_keys.front();
      reply(sp::Op::value, key, server.data[key]);
    } else {
      reply(sp::Op::ok, {}, {});
    }
    unpark();
    // Resume queued frames later, not inside the notifier's loop.
    asio::post(server.io, [self = shared_from_this()] {
      if (!self->closed) self->process();
    });
  }

  void close(const std::string& reason, bool warn) {
    if (closed) return;
    auto self = shared_from_this();  // keep alive while we remove ourselves
    closed = true;
    if (warn) spdlog::warn("tandem store: closing connection from {}: {}", peer, reason);
    unpark();
    frame_timer.cancel();
    park_timer.cancel();
    write_timer.cancel();
    account();  // returns this connection's buffered bytes
    std::string().swap(rbuf);
    std::string().swap(wpending);
    boost::system::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    server.connections.erase(self);
    if (rank >= 0 && !said_goodbye && !server.stopping) {
      spdlog::warn("tandem store: rank {} ({}) disconnected without goodbye: {}", rank, peer, reason);
      server.record_failure(rank, "its process exited or lost its connection to the store (" + reason + ")");
    }
  }
};

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
        spdlog::error("tandem store: handler threw: {}", e.what());
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
      spdlog::warn("tandem store: accept failed: {}", ec.message());
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](boost::system::error_code e) {
        if (!e && !stopping) accept();
      });
      return;
    }
    if (connections.size() >= options.max_connections && !make_room()) {
      boost::system::error_code ignored;
      socket.close(ignored);
      spdlog::warn("tandem store: refused a connection: {} connections (max_connections), every one identified",
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
  for (const auto& c : connections) {
    if (c->closed || c->said_goodbye || c->heartbeat_interval.count() == 0) continue;
    const auto silent = now - c->last_beat;
    if (silent <= kSilentHeartbeats * c->heartbeat_interval) continue;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
    spdlog::warn("tandem store: rank {} ({}) sent no heartbeat for {} ms (interval {} ms)", c->rank, c->peer, ms,
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
    for (size_t i = 0; i < failed.size(); ++i) csv += (i ? "," : "") + std::to_string(failed[i]);
  }
  put(failure_reason_key(rank), reason, /*over_cap_ok=*/true);  // small, and must never be lost
  put(kFailedRanksKey, csv, /*over_cap_ok=*/true);
  notify(kFailedRanksKey);
}

StoreServer::StoreServer(StoreServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreServer::~StoreServer() = default;

uint16_t StoreServer::port() const { return impl_->port; }

std::string StoreServer::address() const { return join_host_port(impl_->options.host, impl_->port); }

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

}  // namespace tandem
