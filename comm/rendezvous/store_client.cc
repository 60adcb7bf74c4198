// Bootstrap store client: a plain non-blocking POSIX socket driven by ppoll(),
// so every call is bounded by its deadline and a round trip costs two
// syscalls each way (no event loop to spin up per call).
//
// Blocking GET/WAIT send the caller's remaining time minus a small margin; the
// server answers NOT_FOUND when that expires, so a plain "key never arrived"
// timeout leaves the connection usable (the client waits up to 2 s past its
// deadline for that promised reply, which a loaded host delays). Only when a
// reply does not arrive by then (server stalled, or the connection died half-way) is the
// connection in an unknown state: it is then closed and marked broken, and
// every later call throws PeerFailure(-1) saying why. Callers that want to
// continue create a new StoreClient (a registered rank would, by then, already
// have been reported as failed by the server, so silent reconnection would lie).
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "job_secret.h"
#include "store_protocol.h"
#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem {
namespace {

// The state a name lookup shares with the thread running it.
struct Lookup {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false, abandoned = false;
  int gai = 0;
  addrinfo* res = nullptr;
};

// getaddrinfo with a deadline. Numeric addresses resolve at once; names are
// looked up on a helper thread, which we stop waiting for at the deadline
// (getaddrinfo cannot be interrupted; the thread then ends on its own).
bool resolve(const std::string& host, uint16_t port, Deadline deadline, addrinfo*& out, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST;
  const std::string port_text = std::to_string(port);
  if (getaddrinfo(host.c_str(), port_text.c_str(), &hints, &out) == 0) return true;
  hints.ai_flags = AI_NUMERICSERV;
  auto lookup = std::make_shared<Lookup>();
  std::thread([lookup, host, port_text, hints] {
    addrinfo* res = nullptr;
    const int gai = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
    std::lock_guard<std::mutex> lock(lookup->mu);
    if (lookup->abandoned) {
      if (gai == 0) freeaddrinfo(res);
      return;
    }
    lookup->gai = gai;
    lookup->res = res;
    lookup->done = true;
    lookup->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(lookup->mu);
  if (!lookup->cv.wait_until(lock, deadline, [&] { return lookup->done; })) {
    lookup->abandoned = true;
    error = "resolving '" + host + "' did not finish in time (check DNS, or give an IP address)";
    return false;
  }
  if (lookup->gai != 0) {
    error = "cannot resolve host '" + host + "': " + gai_strerror(lookup->gai);
    return false;
  }
  out = lookup->res;
  return true;
}

}  // namespace

namespace sp = store_protocol;
using std::chrono::duration_cast;
using std::chrono::milliseconds;

namespace {

long long ms_between(Clock::time_point from, Clock::time_point to) {
  return duration_cast<milliseconds>(to - from).count();
}

std::string quote_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size(); ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  return out;
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_fd(int fd, short events, Deadline deadline) {
  for (;;) {
    auto now = Clock::now();
    if (now >= deadline) return false;
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
    pollfd p{fd, events, 0};
    int rc = ppoll(&p, 1, &ts, nullptr);
    if (rc > 0) return true;  // ready, or error/hangup for the next send/recv to report
    if (rc < 0 && errno != EINTR) return true;
  }
}

}  // namespace

struct StoreClient::Impl {
  std::string host;
  uint16_t port;
  std::string address;  // "host:port" for messages
  std::string secret;   // for connect_again()
  int rank = -1;        // the rank this connection said it is (hello, heartbeat); -1: none
  int fd = -1;
  std::string broken;  // why the connection is unusable; empty while healthy
  std::string wbuf;
  std::string body;

  // What a failed I/O step ran into.
  enum class Io { ok, timeout, closed };
  struct Reply {
    sp::Op op;
    std::string key;
    std::string value;
  };

  Impl(std::string h, uint16_t p) : host(std::move(h)), port(p) {
    address = host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                                  : host + ":" + std::to_string(port);
  }
  ~Impl() { close_fd(); }

  void close_fd() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  void connect(Deadline deadline) {
    const auto start = Clock::now();
    auto backoff = milliseconds(10);
    std::string last_error;
    for (;;) {
      if (try_connect_once(deadline, last_error)) return;
      auto now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, milliseconds(500));
      if (Clock::now() >= deadline) break;
    }
    throw Timeout("tandem store: could not connect to " + address + " within " +
                  std::to_string(ms_between(start, deadline)) + " ms (last error: " + last_error +
                  "); is the store running and TANDEM_STORE_ADDR right?");
  }

  bool try_connect_once(Deadline deadline, std::string& error) {
    addrinfo* res = nullptr;
    if (!resolve(host, port, deadline, res, error)) return false;
    bool connected = false;
    for (addrinfo* ai = res; ai && !connected; ai = ai->ai_next) {
      int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (s < 0) {
        error = std::strerror(errno);
        continue;
      }
      int rc = ::connect(s, ai->ai_addr, ai->ai_addrlen);
      if (rc < 0 && errno == EINPROGRESS) {
        if (!wait_fd(s, POLLOUT, deadline)) {
          error = "connect timed out";
          ::close(s);
          continue;
        }
        int so_error = 0;
        socklen_t len = sizeof so_error;
        getsockopt(s, SOL_SOCKET, SO_ERROR, &so_error, &len);
        rc = so_error ? -1 : 0;
        errno = so_error;
      }
      if (rc < 0) {
        error = std::strerror(errno);
        ::close(s);
        continue;
      }
      int one = 1;
      setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fd = s;
      connected = true;
    }
    freeaddrinfo(res);
    return connected;
  }

  Io send_all(const std::string& data, Deadline deadline) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!wait_fd(fd, POLLOUT, deadline)) return Io::timeout;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return Io::closed;
      }
    }
    return Io::ok;
  }

  Io recv_exact(char* out, size_t size, Deadline deadline) {
    size_t off = 0;
    while (off < size) {
      ssize_t n = ::recv(fd, out + off, size - off, 0);
      if (n > 0) {
        off += static_cast<size_t>(n);
      } else if (n == 0) {
        return Io::closed;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_fd(fd, POLLIN, deadline)) return Io::timeout;
      } else if (errno != EINTR) {
        return Io::closed;
      }
    }
    return Io::ok;
  }

  [[noreturn]] void fail_broken(const std::string& what, const std::string& why) {
    broken = why + " during " + what;
    close_fd();
    throw PeerFailure(-1, "tandem store: store at " + address + " closed the connection during " + what);
  }

  // One request/response exchange. `what` names the operation and key for error messages.
  Reply call(sp::Op op, std::string_view key, std::string_view value, Deadline deadline, const std::string& what,
             Clock::time_point started) {
    if (!broken.empty())
      throw PeerFailure(
          -1, "tandem store: connection to " + address + " is unusable (" + broken + "); create a new StoreClient");
    auto timed_out = [&] {
      broken = "an earlier " + what + " timed out before the server replied";
      close_fd();
      return Timeout("tandem store: " + what + " at " + address + " timed out after " +
                     std::to_string(ms_between(started, deadline)) + " ms (no reply from the server)");
    };
    wbuf.clear();
    sp::append_frame(wbuf, op, key, value);
    Io io = send_all(wbuf, deadline);
    if (io == Io::timeout) throw timed_out();
    if (io == Io::closed) fail_broken(what, "the server closed the connection");

    char header_bytes[sp::kHeaderBytes];
    io = recv_exact(header_bytes, sizeof header_bytes, deadline);
    if (io == Io::timeout) throw timed_out();
    if (io == Io::closed) fail_broken(what, "the server closed the connection");
    sp::Header h = sp::decode_header(header_bytes);
    if (auto why = sp::validate_header(h, /*expect_request=*/false)) {
      broken = "malformed reply: " + *why;
      close_fd();
      throw PeerFailure(-1, "tandem store: store at " + address + " sent a malformed reply to " + what + ": " + *why +
                                " (is it a tandem store of the same version?)");
    }
    body.resize(h.key_bytes + h.value_bytes);
    io = recv_exact(body.data(), body.size(), deadline);
    if (io == Io::timeout) throw timed_out();
    if (io == Io::closed) fail_broken(what, "the server closed the connection");
    Reply r{static_cast<sp::Op>(h.opcode), body.substr(0, h.key_bytes), body.substr(h.key_bytes)};
    if (r.op == sp::Op::error && r.value.rfind(sp::kFencedPrefix, 0) == 0)
      throw Excluded("tandem store: " + what + " refused: " + r.value.substr(std::strlen(sp::kFencedPrefix)) +
                     " (a process the others went on without must not rejoin but as a new one)");
    if (r.op == sp::Op::error)
      throw InvalidArgument("tandem store: store at " + address + " rejected " + what + ": " + r.value);
    return r;
  }

  // Entry checks shared by every call: a passed deadline fails without touching the connection.
  void precheck(const std::string& what, Clock::time_point now, Deadline deadline) {
    if (now >= deadline)
      throw Timeout("tandem store: " + what + " at " + address + " timed out (deadline already passed)");
  }

  static void check_key(const std::string& key) {
    if (key.size() > kMaxKeyBytes)
      throw InvalidArgument("tandem store: key of " + std::to_string(key.size()) + " bytes exceeds kMaxKeyBytes (" +
                            std::to_string(kMaxKeyBytes) + ")");
  }

  // How long past the caller's deadline a blocking get/wait waits for the
  // "expired" reply the server promised: on a loaded host it comes late, and
  // giving up on it would leave the connection out of step (broken).
  static constexpr auto kPromisedReplyGrace = std::chrono::seconds(2);

  // Server-side wait: the remaining time minus a margin, so the server's "expired"
  // reply reaches us before our own deadline and the connection stays in step.
  static uint64_t server_wait_ms(Clock::time_point now, Deadline deadline) {
    auto left = duration_cast<milliseconds>(deadline - now);
    auto margin = std::clamp(left / 10, milliseconds(1), milliseconds(50));
    return static_cast<uint64_t>(std::max<long long>(0, (left - margin).count()));
  }

  Reply simple(sp::Op op, const std::string& key, std::string_view value, Deadline deadline, const std::string& what) {
    auto now = Clock::now();
    precheck(what, now, deadline);
    check_key(key);
    return call(op, key, value, deadline, what, now);
  }
};

StoreClient::StoreClient(const std::string& host, uint16_t port, Deadline deadline, const std::string& secret)
    : impl_(std::make_unique<Impl>(host, port)) {
  impl_->connect(deadline);
  impl_->secret = secret;
  if (secret.empty()) return;
  const std::string nonce = impl_->simple(sp::Op::auth_begin, {}, {}, deadline, "authentication").value;
  if (nonce.empty()) return;  // the store has no secret
  try {
    impl_->simple(sp::Op::auth, {}, auth_proof(secret, nonce), deadline, "authentication");
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(e.what()) +
                          "; the ranks and the store must share one job secret (TANDEM_SECRET or TANDEM_SECRET_FILE)");
  }
}

StoreClient::~StoreClient() = default;

// The new connection is known as this one's rank (hello) but not watched
// (goodbye at once: it may close without recording a failure). A process
// recorded as failed is refused writes on every connection it has.
std::unique_ptr<KeyValueStore> StoreClient::connect_again(Deadline deadline) {
  auto again = std::make_unique<StoreClient>(impl_->host, impl_->port, deadline, impl_->secret);
  if (impl_->rank >= 0) {
    again->hello(impl_->rank, deadline);
    again->goodbye(deadline);
  }
  return again;
}

void StoreClient::set(const std::string& key, const std::string& value, Deadline deadline) {
  if (value.size() > kMaxValueBytes)
    throw InvalidArgument("tandem store: value for key '" + key + "' is " + std::to_string(value.size()) +
                          " bytes, over kMaxValueBytes (" + std::to_string(kMaxValueBytes) + ")");
  impl_->simple(store_protocol::Op::set, key, value, deadline, "set of key '" + key + "'");
}

std::string StoreClient::get(const std::string& key, Deadline deadline) {
  const std::string what = "get of key '" + key + "'";
  auto now = Clock::now();
  impl_->precheck(what, now, deadline);
  Impl::check_key(key);
  std::string wait;
  sp::append_u64(wait, Impl::server_wait_ms(now, deadline));
  auto r = impl_->call(sp::Op::get, key, wait, deadline + Impl::kPromisedReplyGrace, what, now);
  if (r.op == sp::Op::not_found)
    throw Timeout("tandem store: " + what + " at " + impl_->address + " timed out after " +
                  std::to_string(ms_between(now, deadline)) + " ms (the key was never set)");
  return std::move(r.value);
}

std::optional<std::string> StoreClient::try_get(const std::string& key, Deadline deadline) {
  auto r = impl_->simple(sp::Op::try_get, key, {}, deadline, "try_get of key '" + key + "'");
  if (r.op == sp::Op::not_found) return std::nullopt;
  return std::move(r.value);
}

int64_t StoreClient::add(const std::string& key, int64_t delta, Deadline deadline) {
  const std::string what = "add to key '" + key + "'";
  auto r = impl_->simple(sp::Op::add, key, std::to_string(delta), deadline, what);
  auto total = sp::parse_int64(r.value);
  if (r.op != sp::Op::value || !total)
    throw PeerFailure(-1, "tandem store: store at " + impl_->address + " sent a malformed reply to " + what);
  return *total;
}

void StoreClient::wait(const std::vector<std::string>& keys, Deadline deadline) {
  const std::string what = "wait for keys " + quote_keys(keys);
  auto now = Clock::now();
  impl_->precheck(what, now, deadline);
  if (keys.empty()) return;
  for (const auto& k : keys) Impl::check_key(k);
  std::string value;
  sp::append_u64(value, Impl::server_wait_ms(now, deadline));
  value += sp::encode_key_list(keys);
  if (value.size() > kMaxValueBytes) throw InvalidArgument("tandem store: " + what + ": key list too large");
  auto r = impl_->call(sp::Op::wait, {}, value, deadline + Impl::kPromisedReplyGrace, what, now);
  if (r.op == sp::Op::not_found)
    throw Timeout("tandem store: " + what + " at " + impl_->address + " timed out after " +
                  std::to_string(ms_between(now, deadline)) + " ms (still missing: " + r.value + ")");
}

bool StoreClient::check(const std::vector<std::string>& keys, Deadline deadline) {
  const std::string what = "check of keys " + quote_keys(keys);
  for (const auto& k : keys) Impl::check_key(k);
  std::string value = sp::encode_key_list(keys);
  if (value.size() > kMaxValueBytes) throw InvalidArgument("tandem store: " + what + ": key list too large");
  auto r = impl_->simple(sp::Op::check, {}, value, deadline, what);
  return r.op == sp::Op::ok;
}

void StoreClient::erase(const std::string& key, Deadline deadline) {
  impl_->simple(sp::Op::erase, key, {}, deadline, "delete of key '" + key + "'");
}

void StoreClient::hello(int rank, Deadline deadline) {
  if (rank < 0) throw InvalidArgument("tandem store: hello needs a rank >= 0, got " + std::to_string(rank));
  impl_->simple(sp::Op::hello, {}, std::to_string(rank), deadline, "hello of rank " + std::to_string(rank));
  impl_->rank = rank;
}

void StoreClient::goodbye(Deadline deadline) { impl_->simple(sp::Op::goodbye, {}, {}, deadline, "goodbye"); }

void StoreClient::heartbeat(int rank, std::chrono::milliseconds interval, Deadline deadline) {
  if (rank < 0 || interval.count() <= 0) {
    throw InvalidArgument("tandem store: heartbeat needs a rank >= 0 and a positive interval");
  }
  impl_->simple(sp::Op::heartbeat, {}, std::to_string(rank) + ":" + std::to_string(interval.count()), deadline,
                "heartbeat of rank " + std::to_string(rank));
  impl_->rank = rank;
}

std::pair<std::string, uint16_t> parse_host_port(const std::string& address) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("tandem: bad store address '" + address + "': " + why +
                           " (expected host:port or [ipv6]:port)");
  };
  std::string host, port_text;
  if (!address.empty() && address.front() == '[') {
    auto close = address.find(']');
    if (close == std::string::npos) throw bad("missing ']'");
    host = address.substr(1, close - 1);
    if (close + 1 >= address.size() || address[close + 1] != ':') throw bad("missing ':port' after ']'");
    port_text = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos) throw bad("missing ':port'");
    host = address.substr(0, colon);
    if (host.find(':') != std::string::npos) throw bad("IPv6 addresses need brackets, e.g. [::1]:29500");
    port_text = address.substr(colon + 1);
  }
  if (host.empty()) throw bad("empty host");
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    throw bad("port '" + port_text + "' is not a number");
  unsigned long port = std::stoul(port_text);
  if (port < 1 || port > 65535) throw bad("port " + port_text + " is outside 1..65535");
  return {host, static_cast<uint16_t>(port)};
}

}  // namespace tandem
