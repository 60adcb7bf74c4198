// Probe server and clients (protocol in netif_probe.h). Blocking sockets with
// poll() and explicit deadlines; no Asio, to keep the probe self-contained.
#include "netif_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace tandem::netif {
namespace {

// Per-connection bound on the server side: probes are short.
constexpr int kServerIdleMs = 3000;
// A small send buffer bounds how much is still queued when the client stops
// streaming, so a slow link does not stretch the probe much past its duration.
constexpr int kSendBufferBytes = 1 << 20;

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

bool make_sockaddr(const std::string& address, uint16_t port, sockaddr_storage& ss, socklen_t& len) {
  std::memset(&ss, 0, sizeof ss);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    len = sizeof(sockaddr_in);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

int remaining_ms(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Waits for `events` on fd until the deadline; false on timeout or error.
bool wait_for(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int ms = remaining_ms(deadline);
    int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool send_all(int fd, const void* data, size_t n, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      p += w;
      n -= size_t(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= size_t(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLIN, deadline)) return false;
    } else {
      return false;  // EOF or error
    }
  }
  return true;
}

// Connects from local_address (bound, port 0) to peer:port before the deadline; throws std::runtime_error.
int connect_from(const std::string& local_interface, const std::string& local_address, const std::string& peer,
                 uint16_t port, Deadline deadline) {
  if (port == 0) throw std::runtime_error("the peer could not listen on " + peer);
  sockaddr_storage local{}, remote{};
  socklen_t local_len = 0, remote_len = 0;
  if (!make_sockaddr(local_address, 0, local, local_len) || !make_sockaddr(peer, port, remote, remote_len))
    throw std::runtime_error("bad address " + local_address + " or " + peer);
  int fd = ::socket(remote.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  Fd guard(fd);
  // Tie the socket to the device where permitted (root / CAP_NET_RAW); the
  // bound source address alone already selects the interface in a shared subnet.
  if (!local_interface.empty())
    (void)::setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, local_interface.c_str(), socklen_t(local_interface.size()));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int sndbuf = kSendBufferBytes;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&local), local_len) != 0)
    throw std::runtime_error("cannot bind " + local_address + ": " + std::strerror(errno));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&remote), remote_len) != 0 && errno != EINPROGRESS)
    throw std::runtime_error("connect to " + peer + ":" + std::to_string(port) + ": " + std::strerror(errno));
  if (!wait_for(fd, POLLOUT, deadline))
    throw std::runtime_error("connect to " + peer + ":" + std::to_string(port) + " timed out");
  int err = 0;
  socklen_t err_len = sizeof err;
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
  if (err != 0) throw std::runtime_error("connect to " + peer + ":" + std::to_string(port) + ": " + std::strerror(err));
  guard.fd = -1;
  return fd;
}

void handle_connection(int fd) {
  Fd guard(fd);
  const auto idle = [] { return Clock::now() + std::chrono::milliseconds(kServerIdleMs); };
  char op = 0;
  if (!recv_all(fd, &op, 1, idle())) return;
  if (op == 'P') {
    char buf[8];
    while (recv_all(fd, buf, sizeof buf, idle()) && send_all(fd, buf, sizeof buf, idle())) {
    }
  } else if (op == 'B') {
    std::vector<char> buf(1 << 16);
    uint64_t bytes = 0;
    Clock::time_point first{};
    while (true) {
      ssize_t r = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
      if (r > 0) {
        if (bytes == 0) first = Clock::now();
        bytes += uint64_t(r);
      } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!wait_for(fd, POLLIN, idle())) return;
      } else {
        break;  // EOF: the client finished streaming
      }
    }
    uint64_t reply[2] = {
        bytes,
        bytes ? uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - first).count()) : 0};
    send_all(fd, reply, sizeof reply, idle());
  }
}

}  // namespace

ProbeServer::ProbeServer(const std::vector<std::string>& addresses) {
  if (::pipe2(wake_, O_CLOEXEC) != 0) wake_[0] = wake_[1] = -1;
  for (const auto& a : addresses) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    int fd = -1;
    uint16_t port = 0;
    if (make_sockaddr(a, 0, ss, len)) fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 && ::listen(fd, 64) == 0) {
      sockaddr_storage bound{};
      socklen_t blen = sizeof bound;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &blen);
      port = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                              : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    } else if (fd >= 0) {
      ::close(fd);
      fd = -1;
    }
    listeners_.push_back(fd);
    ports_.push_back(port);
  }
  thread_ = std::thread([this] { serve(); });
}

ProbeServer::~ProbeServer() {
  stop_ = true;
  if (wake_[1] >= 0) {
    char c = 0;
    (void)!::write(wake_[1], &c, 1);
  }
  thread_.join();
  for (int fd : listeners_)
    if (fd >= 0) ::close(fd);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

void ProbeServer::serve() {
  while (!stop_) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    for (int fd : listeners_)
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    // The timeout only guards against a lost wake-up.
    if (::poll(fds.data(), fds.size(), 200) <= 0) continue;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      int c = ::accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) continue;
      int one = 1;
      ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      workers_.emplace_back([c] { handle_connection(c); });
    }
  }
  // Workers end on their own within kServerIdleMs once clients are gone.
  for (auto& w : workers_) w.join();
}

void probe_rtt(PairProbe& out, const std::string& local_interface, const std::string& local_address,
               const std::string& peer_address, uint16_t port, int rounds, Deadline deadline) {
  try {
    Fd s(connect_from(local_interface, local_address, peer_address, port, deadline));
    char op = 'P';
    if (!send_all(s.fd, &op, 1, deadline)) throw std::runtime_error("send failed");
    std::vector<double> rtts;
    char buf[8] = {'t', 'a', 'n', 'd', 'e', 'm', '!', '\n'};
    for (int i = 0; i < rounds; ++i) {
      auto t0 = Clock::now();
      if (!send_all(s.fd, buf, sizeof buf, deadline) || !recv_all(s.fd, buf, sizeof buf, deadline))
        throw std::runtime_error("ping-pong with " + peer_address + " failed or timed out");
      rtts.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    std::nth_element(rtts.begin(), rtts.begin() + long(rtts.size() / 2), rtts.end());
    out.rtt_us = rtts[rtts.size() / 2];
    out.ok = true;
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = e.what();
  }
}

void probe_bandwidth(PairProbe& out, const std::string& local_interface, const std::string& local_address,
                     const std::string& peer_address, uint16_t port, std::chrono::milliseconds duration,
                     Deadline deadline) {
  try {
    Fd s(connect_from(local_interface, local_address, peer_address, port, deadline));
    char op = 'B';
    if (!send_all(s.fd, &op, 1, deadline)) throw std::runtime_error("send failed");
    std::vector<char> chunk(1 << 16, 'x');
    const Deadline stop = std::min(deadline, Clock::now() + duration);
    while (Clock::now() < stop) {
      ssize_t w = ::send(s.fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno != EAGAIN && errno != EINTR)
        throw std::runtime_error(std::string("stream to ") + peer_address + ": " + std::strerror(errno));
      if (w < 0 && !wait_for(s.fd, POLLOUT, stop)) break;
    }
    ::shutdown(s.fd, SHUT_WR);
    uint64_t reply[2] = {0, 0};
    if (!recv_all(s.fd, reply, sizeof reply, deadline))
      throw std::runtime_error("no bandwidth report from " + peer_address + " before the deadline");
    if (reply[0] == 0 || reply[1] == 0) throw std::runtime_error("nothing arrived at " + peer_address);
    out.bandwidth_gbps = double(reply[0]) / double(reply[1]);  // bytes per ns = GB/s
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = e.what();
  }
}

std::string route_source(const std::string& peer_address) {
  sockaddr_storage remote{};
  socklen_t len = 0;
  if (!make_sockaddr(peer_address, 9, remote, len)) return {};
  Fd s(::socket(remote.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (s.fd < 0 || ::connect(s.fd, reinterpret_cast<sockaddr*>(&remote), len) != 0) return {};
  sockaddr_storage local{};
  socklen_t llen = sizeof local;
  if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  const void* src = local.ss_family == AF_INET
                        ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                        : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
  inet_ntop(local.ss_family, src, text, sizeof text);
  return text;
}

}  // namespace tandem::netif
