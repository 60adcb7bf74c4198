// The bootstrap store server's state and its connections, shared by
// store_server.cc (listening, data, heartbeats, the public API) and
// store_connection.cc (one client's frames, requests, parked waits and replies).
//
// Terms: a connection is "identified" once it has sent a complete frame and,
// with a secret, proved it; "buffered" bytes are those of frames in transit
// (received but not yet handled, or replies not yet written), summed over all
// connections and capped by max_buffered_bytes. Reads go through one scratch
// buffer owned by the server, so an idle connection costs a socket and a few
// hundred bytes.
#pragma once

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "rendezvous/store_admission.h"
#include "store_protocol.h"
#include "tandem/store.h"

namespace tandem {

namespace asio = boost::asio;
using asio::ip::tcp;
namespace sp = store_protocol;

struct StoreServer::Impl {
  struct Connection;

  StoreServerOptions options;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  asio::steady_timer heartbeat_timer{io};
  std::chrono::milliseconds heartbeat_tick{0};  // 0 until a rank beats
  Clock::time_point last_heartbeat_check{};     // when check_heartbeats() last ran
  uint16_t port = 0;
  std::thread thread;

  // io-thread state
  bool stopping = false;
  std::unordered_map<std::string, std::string> data;
  std::unordered_map<std::string, std::vector<std::shared_ptr<Connection>>> waiters;  // key -> parked requests
  std::set<std::shared_ptr<Connection>> connections;
  uint64_t accepted = 0;                // connections accepted so far (each one's serial)
  size_t data_bytes = 0;                // keys + values in `data`
  size_t buffered = 0;                  // see the top of this file
  std::array<char, 64 * 1024> scratch;  // every read lands here first

  mutable std::mutex failed_mu;
  std::vector<int> failed;  // guarded by failed_mu; written on the io thread only
  bool is_failed(int rank) {
    std::lock_guard lock(failed_mu);
    return std::find(failed.begin(), failed.end(), rank) != failed.end();
  }

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

  // Text of addresses and key lists; the longest parked wait (store_connection.cc).
  static std::string join_host_port(const std::string& host, uint16_t port);
  static std::string endpoint_text(const tcp::endpoint& ep);
  static std::string join(const std::vector<std::string>& items, const char* sep);
  // A parked wait longer than this is treated as "forever"; keeps chrono arithmetic in range.
  static constexpr uint64_t kMaxParkMs = 7ull * 24 * 3600 * 1000;
};

struct StoreServer::Impl::Connection : std::enable_shared_from_this<Connection> {
  Impl& server;
  tcp::socket socket;
  std::string peer;
  asio::steady_timer frame_timer;  // first-frame deadline, then per-frame completion deadline
  asio::steady_timer park_timer;   // server-side expiry of a parked GET/WAIT
  asio::steady_timer write_timer;  // a reply must be taken within frame_timeout
  Clock::time_point first_frame_deadline;
  uint64_t serial = 0;    // order of acceptance
  size_t counted = 0;     // this connection's share of server.buffered
  std::string rbuf;       // received, not yet processed bytes
  std::string wpending;   // replies queued while a write is in flight
  std::string winflight;  // bytes of the write in flight
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
  bool close_after_write = false;  // rejected: the error reply goes out, then the connection closes

  // At most one parked request: the client is synchronous, later frames wait in rbuf.
  bool parked = false;
  sp::Op parked_op = sp::Op::get;
  std::vector<std::string> parked_keys;

  Connection(Impl& s, tcp::socket sock)
      : server(s), socket(std::move(sock)), frame_timer(s.io), park_timer(s.io), write_timer(s.io) {}

  bool identified() const { return got_first_frame && admission.authenticated(); }

  bool account();
  void start();
  void read();
  void on_readable(boost::system::error_code ec);
  void process();
  bool has_partial_frame() const;
  void update_frame_timer();
  void arm_frame_timer(Clock::time_point deadline);
  void reply(sp::Op op, std::string_view key, std::string_view value);
  void flush();
  void error_reply(const std::string& message) { reply(sp::Op::error, {}, message); }
  void reject(const std::string& message);
  bool admit(sp::Op op, std::string_view value);
  void handle(sp::Op op, const std::string& key, std::string_view value);
  void handle_add(const std::string& key, std::string_view value);  // add: parse, check overflow, store, wake waiters
  std::string full(const std::string& key, size_t value_bytes) const;
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  void park(sp::Op op, std::vector<std::string> keys, uint64_t wait_ms);
  void unpark();
  void try_complete();
  void close(const std::string& reason, bool warn);
};

}  // namespace tandem
