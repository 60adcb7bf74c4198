#include "flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
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

#include "coarse_clock.h"
#include "subsystem_log.h"
#include "transport/shared_segments.h"

namespace tandem {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t steady_us(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
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
  for (char c : text)
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out.empty() ? "job" : out;
}

// An entry's small fields in one word: kind, dtype + 1 and op + 1 (0: none)
// a byte each, then the path bit and the state, and the root in the high half.
constexpr const char* kStates[] = {"", "running", "completed", "failed"};
enum State : uint64_t { kRunning = 1, kCompleted = 2, kFailed = 3 };
constexpr uint64_t kStateShift = 25, kStateMask = uint64_t(3) << kStateShift;

uint64_t pack(const FlightRecorder::Call& what, bool shared_memory) {
  return uint64_t(uint8_t(what.kind)) | uint64_t(what.dtype ? uint8_t(*what.dtype) + 1 : 0) << 8 |
         uint64_t(what.op ? uint8_t(*what.op) + 1 : 0) << 16 | uint64_t(shared_memory) << 24 |
         uint64_t(kRunning) << kStateShift | uint64_t(uint32_t(what.root)) << 32;
}

void unpack(uint64_t w, FlightRecorder::Entry& e) {
  e.kind = Collective(uint8_t(w));
  if (const uint8_t d = uint8_t(w >> 8)) e.dtype = DataType(d - 1);
  if (const uint8_t o = uint8_t(w >> 16)) e.op = ReduceOp(o - 1);
  e.shared_memory = (w >> 24) & 1;
  e.state = kStates[(w & kStateMask) >> kStateShift];
  e.root = int32_t(uint32_t(w >> 32));
}

}  // namespace

FlightRecorder::FlightRecorder(const CommOptions& options, size_t capacity, std::string dir)
    : rank_(options.rank),
      size_(options.size),
      job_(options.job_id),
      capacity_(capacity),
      epoch_offset_us_(now_us() - steady_us(coarse_now())),
      ring_(capacity),
      errors_(capacity) {
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

template <class Change>
void FlightRecorder::write(Slot& slot, Change change) {
  const uint64_t v = slot.version.load(std::memory_order_relaxed);
  slot.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  change();
  slot.version.store(v + 2, std::memory_order_release);
}

std::optional<FlightRecorder::Entry> FlightRecorder::read(const Slot& slot) const {
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint64_t v = slot.version.load(std::memory_order_acquire);
    Entry e;
    e.seq = slot.seq.load(std::memory_order_relaxed);
    const uint64_t packed = slot.packed.load(std::memory_order_relaxed);
    e.count = slot.count.load(std::memory_order_relaxed);
    e.started_us = slot.started_us.load(std::memory_order_relaxed);
    e.finished_us = slot.finished_us.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (v % 2 == 0 && slot.version.load(std::memory_order_relaxed) == v) {
      unpack(packed, e);
      return e;
    }
    std::this_thread::yield();
  }
  return std::nullopt;  // rewritten throughout: left out of the dump
}

int64_t FlightRecorder::epoch_us(Clock::time_point t) const { return steady_us(t) + epoch_offset_us_; }

FlightRecorder::Slot& FlightRecorder::slot_of(uint64_t seq) {
  if (begun_slot_ && seq == begun_seq_) return *begun_slot_;
  if (begun_slot_ && seq == begun_seq_ + 1) {
    Slot* next = begun_slot_ + 1;
    return next == ring_.data() + ring_.size() ? ring_.front() : *next;
  }
  return ring_[seq % capacity_];
}

void FlightRecorder::begin(uint64_t seq, const Call& what, bool shared_memory, Clock::time_point started) {
  if (capacity_ == 0) return;
  const int64_t now = epoch_us(started);
  waiting_on_.store(-1, std::memory_order_relaxed);
  Slot& slot = slot_of(seq);
  begun_seq_ = seq, begun_slot_ = &slot;
  write(slot, [&] {
    slot.seq.store(seq, std::memory_order_relaxed);
    slot.packed.store(pack(what, shared_memory), std::memory_order_relaxed);
    slot.count.store(what.count, std::memory_order_relaxed);
    slot.started_us.store(now, std::memory_order_relaxed);
    slot.finished_us.store(0, std::memory_order_relaxed);
  });
  if (seq > last_.load(std::memory_order_relaxed)) last_.store(seq, std::memory_order_release);
}

void FlightRecorder::end(uint64_t seq, bool ok, const std::string& error) {
  if (capacity_ == 0) return;
  Slot& slot = slot_of(seq);
  if (slot.seq.load(std::memory_order_relaxed) != seq) return;
  if (!ok) {
    std::lock_guard lock(mu_);
    errors_[seq % capacity_] = {seq, error};
  }
  const uint64_t packed = slot.packed.load(std::memory_order_relaxed) & ~kStateMask;
  const int64_t now = epoch_us(coarse_now());
  write(slot, [&] {
    slot.packed.store(packed | uint64_t(ok ? kCompleted : kFailed) << kStateShift, std::memory_order_relaxed);
    slot.finished_us.store(now, std::memory_order_relaxed);
  });
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
  // Held throughout: a failing call (which records its error under it first)
  // cannot overwrite the error of an entry this dump read as failed.
  std::lock_guard lock(mu_);
  const uint64_t last = last_.load(std::memory_order_acquire);
  const uint64_t first = last >= capacity_ ? last - capacity_ + 1 : 1;
  for (uint64_t s = first; s <= last && capacity_ > 0; ++s) {
    const std::optional<Entry> read_entry = read(ring_[s % capacity_]);
    if (!read_entry || read_entry->seq != s) continue;
    const Entry& e = *read_entry;
    // Shared memory: every rank reads every other's segment; UCX: the ring neighbours.
    std::vector<int> peers;
    if (e.shared_memory) {
      for (int p = 0; p < size_; ++p)
        if (p != rank_) peers.push_back(p);
    } else if (size_ > 1) {
      peers = {(rank_ + size_ - 1) % size_, (rank_ + 1) % size_};
      if (peers[0] == peers[1]) peers.pop_back();
    }
    nlohmann::json x = {{"seq", e.seq},     {"kind", to_string(e.kind)},
                        {"count", e.count}, {"root", e.root},
                        {"peers", peers},   {"path", e.shared_memory ? "shared_memory" : "ucx"},
                        {"state", e.state}, {"started_us", e.started_us}};
    if (e.dtype) x["dtype"] = std::string(to_string(*e.dtype));
    if (e.op) x["op"] = std::string(to_string(*e.op));
    if (e.finished_us) x["finished_us"] = e.finished_us;
    if (std::string_view(e.state) == "failed") {
      const Error& error = errors_[s % capacity_];
      if (error.seq == s && !error.text.empty()) x["error"] = error.text;
    }
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
    subsystem_log(Subsystem::comm)
        .warn(
            "tandem rank {}: cannot write the flight recorder to {} ({}); set TANDEM_FLIGHT_DIR to a writable "
            "directory",
            rank_, file_, std::strerror(errno));
    std::remove(tmp.c_str());
    return {};
  }
  subsystem_log(Subsystem::comm)
      .info("tandem rank {}: flight recorder ({}) written to {}; compare ranks with `tandem doctor`", rank_, reason,
            file_);
  return file_;
}

}  // namespace tandem
