// One client connection of the bootstrap store: reads and checks frames,
// runs the requests (parking GET and WAIT until their keys exist), queues the
// replies, and enforces the frame, write and buffer limits (terms: store_server_impl.h).

#include <algorithm>
#include <utility>  // boost/asio/awaitable.hpp uses std::exchange without including it

#include "rendezvous/store_server_impl.h"
#include "src/subsystem_log.h"

namespace tandem {

std::string StoreServer::Impl::join_host_port(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string StoreServer::Impl::endpoint_text(const tcp::endpoint& ep) {
  return join_host_port(ep.address().to_string(), ep.port());
}

std::string StoreServer::Impl::join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

// Brings server.buffered up to date with this connection's buffers. Past
// the budget, the connections holding the most are closed until it fits;
// false if that closed this one.
bool StoreServer::Impl::Connection::account() {
  const size_t now = closed ? 0 : rbuf.size() + wpending.size() + winflight.size();
  server.buffered = server.buffered - counted + now;
  counted = now;
  if (!closed) server.enforce_budget();
  return !closed;
}

void StoreServer::Impl::Connection::start() {
  boost::system::error_code ec;
  auto ep = socket.remote_endpoint(ec);
  peer = ec ? std::string("<unknown peer>") : endpoint_text(ep);
  socket.set_option(tcp::no_delay(true), ec);
  socket.non_blocking(true, ec);
  first_frame_deadline = Clock::now() + server.options.first_frame_timeout;
  arm_frame_timer(first_frame_deadline);
  read();
}

void StoreServer::Impl::Connection::read() {
  socket.async_wait(tcp::socket::wait_read,
                    [self = shared_from_this()](boost::system::error_code ec) { self->on_readable(ec); });
}

void StoreServer::Impl::Connection::on_readable(boost::system::error_code ec) {
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
void StoreServer::Impl::Connection::process() {
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

bool StoreServer::Impl::Connection::has_partial_frame() const {
  if (rbuf.empty()) return false;
  if (rbuf.size() < sp::kHeaderBytes) return true;
  return rbuf.size() < sp::decode_header(rbuf.data()).frame_bytes();
}

void StoreServer::Impl::Connection::update_frame_timer() {
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

void StoreServer::Impl::Connection::arm_frame_timer(Clock::time_point deadline) {
  frame_timer_armed = true;
  frame_timer.expires_at(deadline);
  frame_timer.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (ec || self->closed || !self->frame_timer_armed) return;
    if (self->frame_timer.expiry() > Clock::now()) return;  // re-armed after this wait completed
    if (!self->got_first_frame && self->rbuf.empty()) {
      self->close(
          fmt::format("no frame within first_frame_timeout ({} ms)", self->server.options.first_frame_timeout.count()),
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

void StoreServer::Impl::Connection::reply(sp::Op op, std::string_view key, std::string_view value) {
  if (closed) return;
  sp::append_frame(wpending, op, key, value);
  if (!account()) return;
  if (!writing) flush();
}

void StoreServer::Impl::Connection::flush() {
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

// Closes the connection once the error reply is out; no state has changed.
void StoreServer::Impl::Connection::reject(const std::string& message) {
  subsystem_log(Subsystem::store).warn("tandem store: rejected {}: {}", peer, message);
  close_after_write = true;
  error_reply(message);
}

// The handshake (store_admission.h); false if `op` may not run yet.
bool StoreServer::Impl::Connection::admit(sp::Op op, std::string_view value) {
  AdmissionStep step = admission.on(op, value);
  if (step.run) return true;
  if (step.close) {
    reject(step.value);
  } else {
    reply(step.reply, {}, step.value);
  }
  return false;
}

void StoreServer::Impl::Connection::handle(sp::Op op, const std::string& key, std::string_view value) {
  if (!admit(op, value)) return;
  // A process recorded as failed may be one that was stopped and woke after
  // the others went on without it: it may read, but not write.
  if ((op == sp::Op::set || op == sp::Op::add || op == sp::Op::erase) && rank >= 0 && server.is_failed(rank)) {
    return error_reply(fmt::format("{}rank {} is recorded as failed; its writes are refused", sp::kFencedPrefix, rank));
  }
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
    case sp::Op::add: return handle_add(key, value);
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
    case sp::Op::erase: return reply(server.erase(key) ? sp::Op::ok : sp::Op::not_found, key, {});
    case sp::Op::hello: {
      auto r = sp::parse_int64(value);
      if (!r || *r < 0 || *r > INT32_MAX) return error_reply(fmt::format("hello: bad rank '{}'", value));
      if (rank >= 0 && rank != *r)
        return error_reply(fmt::format("hello: connection already registered as rank {}", rank));
      rank = static_cast<int>(*r);
      said_goodbye = false;
      return reply(sp::Op::ok, {}, {});
    }
    case sp::Op::goodbye: said_goodbye = true; return reply(sp::Op::ok, {}, {});
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

void StoreServer::Impl::Connection::handle_add(const std::string& key, std::string_view value) {
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
}

std::string StoreServer::Impl::Connection::full(const std::string& key, size_t value_bytes) const {
  return fmt::format(
      "store full: {} more bytes for key '{}' would pass max_data_bytes ({}, {} in use); "
      "delete keys the job no longer needs or start the store with a larger cap",
      key.size() + value_bytes, key, server.options.max_data_bytes, server.data_bytes);
}

std::vector<std::string> StoreServer::Impl::Connection::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!server.has(k)) out.push_back(k);
  return out;
}

void StoreServer::Impl::Connection::park(sp::Op op, std::vector<std::string> keys, uint64_t wait_ms) {
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

void StoreServer::Impl::Connection::unpark() {
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
void StoreServer::Impl::Connection::try_complete() {
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

void StoreServer::Impl::Connection::close(const std::string& reason, bool warn) {
  if (closed) return;
  auto self = shared_from_this();  // keep alive while we remove ourselves
  closed = true;
  if (warn) subsystem_log(Subsystem::store).warn("tandem store: closing connection from {}: {}", peer, reason);
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
    subsystem_log(Subsystem::store)
        .warn("tandem store: rank {} ({}) disconnected without goodbye: {}", rank, peer, reason);
    server.record_failure(rank, "its process exited or lost its connection to the store (" + reason + ")");
  }
}

}  // namespace tandem
