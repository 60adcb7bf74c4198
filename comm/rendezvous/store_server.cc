// Bootstrap store server: one io_context on one thread. All store state
// (data, waiters, connections) is touched only on that thread, so it needs no
// locks; the failed-rank list is mirrored under a mutex for failed_ranks().
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

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
  uint16_t port = 0;
  std::thread thread;

  // io-thread state
  bool stopping = false;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Connection>>> waiters;  // key -> parked requests
  std::set<std::shared_ptr<Connection>> connections;

  mutable std::mutex failed_mu;
  std::vector<int> failed;  // guarded by failed_mu; written on the io thread only

  explicit Impl(StoreServerOptions opts);
  ~Impl();
  void listen();
  void accept();
  void notify(const std::string& key);
  void record_failure(int rank);
  bool has(const std::string& key) const { return data.count(key) != 0; }
};

struct StoreServer::Impl::Connection : std::enable_shared_from_this<Connection> {
  Impl& server;
  tcp::socket socket;
  std::string peer;
  asio::steady_timer frame_timer;  // first-frame deadline, then per-frame completion deadline
  asio::steady_timer park_timer;   // server-side expiry of a parked GET/WAIT
  Clock::time_point first_frame_deadline;
  std::array<char, 64 * 1024> chunk;
  std::string rbuf;           // received, not yet processed bytes
  std::string wpending;       // replies queued while a write is in flight
  std::string winflight;      // bytes of the write in flight
  bool writing = false;
  bool closed = false;
  bool got_first_frame = false;
  bool frame_timer_armed = false;  // armed for a partial frame (or for the first frame)
  int rank = -1;                   // registered by HELLO
  bool said_goodbye = false;

  // At most one parked request: the client is synchronous, later frames wait in rbuf.
  bool parked = false;
  sp::Op parked_op = sp::Op::get;
  std::vector<std::string> parked_keys;

  Connection(Impl& s, tcp::socket sock)
      : server(s), socket(std::move(sock)), frame_timer(s.io), park_timer(s.io) {}

  void start() {
    boost::system::error_code ec;
    auto ep = socket.remote_endpoint(ec);
    peer = ec ? std::string("<unknown peer>") : endpoint_text(ep);
    socket.set_option(tcp::no_delay(true), ec);
    first_frame_deadline = Clock::now() + server.options.first_frame_timeout;
    arm_frame_timer(first_frame_deadline);
    read();
  }

  void read() {
    socket.async_read_some(asio::buffer(chunk), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
      self->on_read(ec, n);
    });
  }

  void on_read(boost::system::error_code ec, size_t n) {
    if (closed) return;
    if (ec) {
      // EOF and resets are how clients leave; not worth a warning.
      close(ec == asio::error::eof ? "peer closed" : ec.message(), false);
      return;
    }
    rbuf.append(chunk.data(), n);
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
    while (!closed && !parked && rbuf.size() - pos >= sp::kHeaderBytes) {
      sp::Header h = sp::decode_header(rbuf.data() + pos);
      // Validate as soon as the header is here, before waiting for a (possibly huge) body.
      if (auto why = sp::validate_header(h, /*expect_request=*/true)) {
        close(*why, true);
        return;
      }
      if (rbuf.size() - pos < h.frame_bytes()) break;
      std::string_view frame(rbuf.data() + pos, h.frame_bytes());
      std::string key(frame.substr(sp::kHeaderBytes, h.key_bytes));
      std::string_view value = frame.substr(sp::kHeaderBytes + h.key_bytes, h.value_bytes);
      got_first_frame = true;
      frame_timer_armed = false;  // the frame being timed is complete
      handle(static_cast<sp::Op>(h.opcode), key, value);
      pos += h.frame_bytes();
    }
    if (closed) return;
    rbuf.erase(0, pos);
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
    sp::append_frame(wpending, op, key, value);
    if (!writing) flush();
  }

  void flush() {
    if (closed || wpending.empty()) return;
    writing = true;
    winflight.clear();
    std::swap(winflight, wpending);
    asio::async_write(socket, asio::buffer(winflight), [self = shared_from_this()](boost::system::error_code ec, size_t) {
      self->writing = false;
      if (self->closed) return;
      if (ec) {
        self->close("write failed: " + ec.message(), false);
        return;
      }
      self->flush();
    });
  }

  void error_reply(const std::string& message) { reply(sp::Op::error, {}, message); }

  void handle(sp::Op op, const std::string& key, std::string_view value) {
    switch (op) {
      case sp::Op::set:
        server.data[key] = std::string(value);
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
        server.data[key] = text;
        reply(sp::Op::value, key, text);
        server.notify(key);
        return;
      }
      case sp::Op::wait: {
        auto wait_ms = sp::read_u64(value);
        auto keys = wait_ms ? sp::decode_key_list(value.substr(8)) : std::nullopt;
        if (!keys) return error_reply("wait: malformed key list");
        if (missing(*keys).empty()) return reply(sp::Op::ok, {}, {});
        return park(sp::Op::wait, std::move(*keys), *wait_ms);
      }
      case sp::Op::check: {
        auto keys = sp::decode_key_list(value);
        if (!keys) return error_reply("check: malformed key list");
        return reply(missing(*keys).empty() ? sp::Op::ok : sp::Op::not_found, {}, {});
      }
      case sp::Op::erase:
        return reply(server.data.erase(key) ? sp::Op::ok : sp::Op::not_found, key, {});
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
      default:
        // validate_header already rejected everything else.
        return error_reply("unexpected opcode");
    }
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
    boost::system::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    server.connections.erase(self);
    if (rank >= 0 && !said_goodbye && !server.stopping) {
      spdlog::warn("tandem store: rank {} ({}) disconnected without goodbye: {}", rank, peer, reason);
      server.record_failure(rank);
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
    auto conn = std::make_shared<Connection>(*this, std::move(socket));
    connections.insert(conn);
    conn->start();
    accept();
  });
}

void StoreServer::Impl::notify(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto parked = it->second;  // try_complete() edits the list
  for (auto& c : parked) c->try_complete();
}

void StoreServer::Impl::record_failure(int rank) {
  std::string csv;
  {
    std::lock_guard lock(failed_mu);
    if (std::find(failed.begin(), failed.end(), rank) != failed.end()) return;
    failed.push_back(rank);
    for (size_t i = 0; i < failed.size(); ++i) csv += (i ? "," : "") + std::to_string(failed[i]);
  }
  data[kFailedRanksKey] = csv;
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

void StoreServer::mark_failed(int rank) {
  if (impl_->io.get_executor().running_in_this_thread()) {
    impl_->record_failure(rank);
    return;
  }
  // Run on the io thread (it owns the data and the waiters) and return once the key is visible.
  std::promise<void> done;
  asio::post(impl_->io, [this, rank, &done] {
    impl_->record_failure(rank);
    done.set_value();
  });
  done.get_future().wait();
}

}  // namespace tandem
