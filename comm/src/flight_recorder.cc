#include "flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "transport/shared_segments.h"

namespace tandem {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---- SIGUSR1 -----------------------------------------------------------------
// The handler writes one byte to `pipe_fds[1]`; `dumper` reads it and dumps
// every recorder in `live`. A forked child starts its own pipe and thread.
struct SignalDump {
  std::mutex mu;
  std::set<const FlightRecorder*> live;
  pid_t owner = 0;  // the process that made the pipe and thread
  int pipe_fds[2] = {-1, -1};
};

SignalDump& signal_dump() {
  static SignalDump* s = new SignalDump;  // never destroyed: the thread may outlive static destructors
  return *s;
}

std::atomic<int> g_signal_pipe{-1};

extern "C" void on_sigusr1(int) {
  const int saved = errno;
  const int fd = g_signal_pipe.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char byte = 1;
    [[maybe_unused]] ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved;
}

void dump_loop(int fd) {
  char buf[64];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    SignalDump& s = signal_dump();
    std::lock_guard lock(s.mu);
    for (const auto* r : s.live) r->dump("SIGUSR1");
  }
}

void register_recorder(const FlightRecorder* r) {
  SignalDump& s = signal_dump();
  std::lock_guard lock(s.mu);
  s.live.insert(r);
  if (s.owner == ::getpid()) return;
  struct sigaction current {};
  if (::sigaction(SIGUSR1, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) {
    if (current.sa_handler != on_sigusr1) return;  // the program handles SIGUSR1 itself: leave it
  }
  if (::pipe2(s.pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) return;
  // The reader blocks; only the handler's end stays non-blocking (a full pipe drops a byte, not the handler).
  ::fcntl(s.pipe_fds[0], F_SETFL, 0);
  s.owner = ::getpid();
  g_signal_pipe.store(s.pipe_fds[1]);
  std::thread(dump_loop, s.pipe_fds[0]).detach();
  struct sigaction act {};
  act.sa_handler = on_sigusr1;
  sigemptyset(&act.sa_mask);
  act.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &act, nullptr);
}

void unregister_recorder(const FlightRecorder* r) {
  SignalDump& s = signal_dump();
  std::lock_guard lock(s.mu);
  s.live.erase(r);
}

std::string file_safe(const std::string& text) {
  std::string out;
  for (char c : text) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out.empty() ? "job" : out;
}

}  // namespace

FlightRecorder::FlightRecorder(const CommOptions& options, size_t capacity, std::string dir)
    : rank_(options.rank), size_(options.size), job_(options.job_id), capacity_(capacity), ring_(capacity) {
  if (capacity_ == 0) return;
  if (dir.empty()) {
    // TMPDIR's directory, as users of a library expect; /tmp when that is unset or missing.
    std::error_code error;
    const std::filesystem::path temp = std::filesystem::temp_directory_path(error);
    dir = error ? "/tmp" : temp.string();
  }
  const std::string job = job_.empty() ? "pid" + std::to_string(::getpid()) : file_safe(job_);
  file_ = dir + "/tandem-flight-" + job + "-rank" + std::to_string(rank_) + ".json";
  register_recorder(this);
}

FlightRecorder::~FlightRecorder() {
  if (capacity_ > 0) unregister_recorder(this);
}

void FlightRecorder::begin(uint64_t seq, const Call& what, bool shared_memory) {
  if (capacity_ == 0) return;
  const int64_t now = now_us();
  waiting_on_.store(-1, std::memory_order_relaxed);
  std::lock_guard lock(mu_);
  Entry& e = ring_[seq % capacity_];
  e.seq = seq;
  e.kind = what.kind;
  e.dtype = what.dtype;
  e.op = what.op;
  e.count = what.count;
  e.root = what.root;
  e.shared_memory = shared_memory;
  e.state = "running";
  e.started_us = now;
  e.finished_us = 0;
  e.error.clear();
  last_ = std::max(last_, seq);
}

void FlightRecorder::end(uint64_t seq, bool ok, const std::string& error) {
  if (capacity_ == 0) return;
  std::lock_guard lock(mu_);
  Entry& e = ring_[seq % capacity_];
  if (e.seq != seq) return;
  e.state = ok ? "completed" : "failed";
  e.finished_us = now_us();
  if (!ok) e.error = error;
}

std::string FlightRecorder::json(const std::string& reason) const {
  nlohmann::json j;
  j["rank"] = rank_;
  j["size"] = size_;
  j["host"] = host_identity();
  j["pid"] = ::getpid();
  j["job"] = job_;
  j["reason"] = reason;
  j["dumped_at_us"] = now_us();
  j["entries"] = nlohmann::json::array();
  std::lock_guard lock(mu_);
  const uint64_t first = last_ >= capacity_ ? last_ - capacity_ + 1 : 1;
  for (uint64_t s = first; s <= last_ && capacity_ > 0; ++s) {
    const Entry& e = ring_[s % capacity_];
    if (e.seq != s) continue;
    // Shared memory: every rank reads every other's segment; UCX: the ring neighbours.
    std::vector<int> peers;
    if (e.shared_memory) {
      for (int p = 0; p < size_; ++p)
        if (p != rank_) peers.push_back(p);
    } else if (size_ > 1) {
      peers = {(rank_ + size_ - 1) % size_, (rank_ + 1) % size_};
      if (peers[0] == peers[1]) peers.pop_back();
    }
    nlohmann::json x = {{"seq", e.seq},     {"kind", to_string(e.kind)},   {"count", e.count},
                        {"root", e.root},   {"peers", peers},   {"path", e.shared_memory ? "shared_memory" : "ucx"},
                        {"state", e.state}, {"started_us", e.started_us}};
    if (e.dtype) x["dtype"] = std::string(to_string(*e.dtype));
    if (e.op) x["op"] = std::string(to_string(*e.op));
    if (e.finished_us) x["finished_us"] = e.finished_us;
    if (!e.error.empty()) x["error"] = e.error;
    if (std::string_view(e.state) == "running" && waiting_on_.load() >= 0) x["waiting_on"] = waiting_on_.load();
    j["entries"].push_back(std::move(x));
  }
  return j.dump(1);
}

std::string FlightRecorder::dump(const std::string& reason) const {
  if (capacity_ == 0) return {};
  const std::string text = json(reason);
  const std::string tmp = file_ + ".tmp" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f) ok = std::fclose(f) == 0 && ok;
  if (!ok || std::rename(tmp.c_str(), file_.c_str()) != 0) {
    spdlog::warn("tandem rank {}: cannot write the flight recorder to {} ({}); set TANDEM_FLIGHT_DIR to a writable "
                 "directory",
                 rank_, file_, std::strerror(errno));
    std::remove(tmp.c_str());
    return {};
  }
  spdlog::info("tandem rank {}: flight recorder ({}) written to {}; compare ranks with `tandem doctor`", rank_, reason,
               file_);
  return file_;
}

}  // namespace tandem
