#include "shared_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "tandem/errors.h"

namespace tandem {
namespace {

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_target(const char* path) {
  char buf[256];
  ssize_t n = ::readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, size_t(n)) : std::string("?");
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// The segments' pages are faulted in when mapped: otherwise the first
// collectives staging through each slot pay a fault per page on the writing
// and on every reading rank (64 KiB all-to-all at 2 ranks: 30 us a call for
// the first four staged calls against 5 after). And each page is written
// once: under a hypervisor that shadows the guest's page tables a page's
// first read in a process costs 2 us even when faulted in, and its first
// write 6 more, so the first 32 4 KiB all-to-alls at 2 ranks, each on a
// new run of cells, took 40-60 us against 1 (docs/algorithms.md, 'shm:
// cells'). The write is a compare-exchange of a byte with itself: a peer
// writing its segment meanwhile loses nothing, and no compiler turns it
// into a load.
enum class Populate : bool { no, yes };
int populate_flag(Populate p) { return p == Populate::yes ? MAP_POPULATE : 0; }
void touch_pages(std::byte* p, size_t bytes, Populate populate) {
  if (populate == Populate::no || p == nullptr) return;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < bytes; i += page) {
    std::atomic_ref<unsigned char> byte(*reinterpret_cast<unsigned char*>(p + i));
    unsigned char seen = byte.load(std::memory_order_relaxed);
    byte.compare_exchange_strong(seen, seen, std::memory_order_relaxed);
  }
}

// A memfd of `bytes` mapped read-write here; fd -1 maps private anonymous memory instead.
struct MappedFile {
  int fd = -1;
  std::byte* base = nullptr;
};
MappedFile map_new(bool shareable, const char* name, size_t bytes, Populate populate = Populate::no) {
  MappedFile m;
  const std::string what = std::string(name) + " (" + std::to_string(bytes) + " bytes): ";
  if (shareable) {
    m.fd = ::memfd_create(name, MFD_CLOEXEC);
    if (m.fd < 0) throw Error(errno_text((what + "memfd_create").c_str()));
    if (::ftruncate(m.fd, off_t(bytes)) != 0) {
      const std::string why = errno_text((what + "ftruncate").c_str());
      ::close(m.fd);
      throw Error(why);
    }
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   (shareable ? MAP_SHARED : MAP_PRIVATE | MAP_ANONYMOUS) | populate_flag(populate), m.fd, 0);
  if (p == MAP_FAILED) {
    const std::string why = errno_text((what + "mmap").c_str());
    if (m.fd >= 0) ::close(m.fd);
    throw Error(why);
  }
  m.base = static_cast<std::byte*>(p);
  touch_pages(m.base, bytes, populate);
  return m;
}

// Maps `bytes` of another process's memfd, found through /proc/<pid>/fd/<fd>;
// nullptr with `why` set when that fails.
std::byte* map_peer_file(long pid, long fd, size_t bytes, std::string& why, Populate populate = Populate::no) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int peer_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (peer_fd < 0) {
    why = errno_text(("open " + path).c_str());
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag(populate), peer_fd, 0);
  if (p == MAP_FAILED) why = errno_text("mmap");
  ::close(peer_fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return nullptr;
  touch_pages(static_cast<std::byte*>(p), bytes, populate);
  return static_cast<std::byte*>(p);
}

}  // namespace

std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return read_first_line("/proc/sys/kernel/random/boot_id") + "|" + host + "|" + link_target("/proc/self/ns/net") +
         "|" + link_target("/proc/self/ns/pid") + "|" + link_target("/proc/self/ns/ipc");
}

SharedSegmentSet::SharedSegmentSet(int rank, int size, size_t bytes) : rank_(rank) {
  view_.bytes = bytes;
  view_.segment.assign(size_t(size), nullptr);
  const MappedFile m = map_new(true, "tandem-segment", bytes, Populate::yes);
  fd_ = m.fd;
  view_.segment[size_t(rank)] = m.base;
  pids_.assign(size_t(size), 0);
  remote_address_.assign(size_t(size), 0);
}

SharedSegmentSet::~SharedSegmentSet() {
  for (auto* p : view_.segment) {
    if (p) ::munmap(p, view_.bytes);
  }
  if (fd_ >= 0) ::close(fd_);
}

std::string SharedSegmentSet::locator() const {
  return std::to_string(::getpid()) + ":" + std::to_string(fd_) + ":" +
         std::to_string(uintptr_t(view_.segment[size_t(rank_)]));
}

std::optional<SegmentLocator> parse_locator(std::string_view text) {
  SegmentLocator l;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  auto field = [&](auto& out, bool last) {
    auto [next, ec] = std::from_chars(p, end, out);
    if (ec != std::errc() || next == p) return false;
    p = next;
    if (last) return p == end;
    if (p == end || *p != ':') return false;
    ++p;
    return true;
  };
  if (!field(l.pid, false) || !field(l.fd, false) || !field(l.address, true)) return std::nullopt;
  if (l.pid <= 0 || l.fd < 0) return std::nullopt;
  return l;
}

std::string SharedSegmentSet::map_peer(int rank, const std::string& locator) {
  const auto where = parse_locator(locator);
  if (!where) return "malformed locator '" + locator + "'";
  pids_[size_t(rank)] = where->pid;
  remote_address_[size_t(rank)] = where->address;
  std::string why;
  view_.segment[size_t(rank)] = map_peer_file(where->pid, where->fd, view_.bytes, why, Populate::yes);
  return why;
}

bool SharedSegmentSet::cma_works(int rank) const {
  uint64_t word = 0;
  try {
    read_peer(rank, reinterpret_cast<const void*>(remote_address_[size_t(rank)]), &word, sizeof word);
  } catch (const Error&) {
    return false;
  }
  return true;
}

namespace {

// One process_vm_readv/writev, repeated until every byte moved (the kernel may stop at a page boundary).
template <class Call>
void cma_copy(long pid, int rank, std::byte* local, std::byte* remote, size_t bytes, Call call, const char* what) {
  while (bytes > 0) {
    iovec l{local, bytes}, r{remote, bytes};
    const ssize_t n = call(pid_t(pid), &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == ESRCH) {
        throw PeerFailure(rank, "rank " + std::to_string(rank) + " failed (its process is gone)");
      }
      throw Error(errno_text(what));
    }
    local += n;
    remote += n;
    bytes -= size_t(n);
  }
}

}  // namespace

void SharedSegmentSet::read_peer(int rank, const void* remote, void* local, size_t bytes) const {
  cma_copy(pids_[size_t(rank)], rank, static_cast<std::byte*>(local),
           static_cast<std::byte*>(const_cast<void*>(remote)), bytes, ::process_vm_readv, "process_vm_readv");
}

void SharedSegmentSet::write_peer(int rank, void* remote, const void* local, size_t bytes) const {
  cma_copy(pids_[size_t(rank)], rank, static_cast<std::byte*>(const_cast<void*>(local)),
           static_cast<std::byte*>(remote), bytes, ::process_vm_writev, "process_vm_writev");
}

// ---- SharedAllocations ----------------------------------------------------

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kMaxPeerMappings = 256;
}  // namespace

SharedAllocations::~SharedAllocations() {
  for (auto& [base, a] : mine_) {
    ::munmap(const_cast<std::byte*>(base), a.bytes);
    if (a.fd >= 0) ::close(a.fd);
  }
  for (auto& m : peers_) ::munmap(m.base, m.bytes);
}

void* SharedAllocations::allocate(size_t bytes) {
  const size_t rounded = std::max(kPage, (bytes + kPage - 1) / kPage * kPage);
  const MappedFile m = map_new(shareable_, "tandem-allocate_shared", rounded);
  std::lock_guard<std::mutex> lock(mu_);
  mine_[m.base] = Allocation{rounded, m.fd, next_serial_++};
  return m.base;
}

void SharedAllocations::deallocate(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mine_.find(static_cast<std::byte*>(p));
  if (it == mine_.end()) throw InvalidArgument("free_shared: pointer did not come from allocate_shared");
  ::munmap(p, it->second.bytes);
  if (it->second.fd >= 0) ::close(it->second.fd);
  mine_.erase(it);
}

bool SharedAllocations::find(const void* p, size_t bytes, SharedRef& out) const {
  const auto* b = static_cast<const std::byte*>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mine_.upper_bound(b);
  if (it == mine_.begin()) return false;
  --it;
  const Allocation& a = it->second;
  const size_t offset = size_t(b - it->first);
  if (a.fd < 0 || offset > a.bytes || bytes > a.bytes - offset) return false;
  out = SharedRef{uint64_t(::getpid()), a.serial, a.fd, a.bytes, offset};
  return true;
}

std::byte* SharedAllocations::map(const SharedRef& ref) {
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->owner == ref.owner && it->serial == ref.serial) {
      peers_.splice(peers_.begin(), peers_, it);
      return it->base + ref.offset;
    }
  }
  std::string why;
  std::byte* p = map_peer_file(long(ref.owner), long(ref.fd), ref.size, why);
  if (!p) throw Error("map a peer's shared buffer: " + why);
  if (peers_.size() >= kMaxPeerMappings) {
    ::munmap(peers_.back().base, peers_.back().bytes);
    peers_.pop_back();
  }
  peers_.push_front(Mapping{ref.owner, ref.serial, p, ref.size});
  return p + ref.offset;
}

}  // namespace tandem
