#include "shared_segments.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace

std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return read_first_line("/proc/sys/kernel/random/boot_id") + "|" + host + "|" + link_target("/proc/self/ns/net") +
         "|" + link_target("/proc/self/ns/pid") + "|" + link_target("/proc/self/ns/ipc");
}

SharedSegmentSet::SharedSegmentSet(int rank, int size, size_t bytes) {
  view_.bytes = bytes;
  view_.segment.assign(size_t(size), nullptr);
  fd_ = ::memfd_create("tandem-shm", MFD_CLOEXEC);
  if (fd_ < 0) throw Error(errno_text("memfd_create"));
  if (::ftruncate(fd_, off_t(bytes)) != 0) {
    const std::string why = errno_text("ftruncate");
    ::close(fd_);
    throw Error(why);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const std::string why = errno_text("mmap");
    ::close(fd_);
    throw Error(why);
  }
  view_.segment[size_t(rank)] = static_cast<std::byte*>(p);
}

SharedSegmentSet::~SharedSegmentSet() {
  for (auto* p : view_.segment) {
    if (p) ::munmap(p, view_.bytes);
  }
  if (fd_ >= 0) ::close(fd_);
}

std::string SharedSegmentSet::locator() const { return std::to_string(::getpid()) + ":" + std::to_string(fd_); }

std::string SharedSegmentSet::map_peer(int rank, const std::string& locator) {
  const auto colon = locator.find(':');
  if (colon == std::string::npos) return "malformed locator '" + locator + "'";
  const std::string path = "/proc/" + locator.substr(0, colon) + "/fd/" + locator.substr(colon + 1);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return errno_text(("open " + path).c_str());
  void* p = ::mmap(nullptr, view_.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const std::string why = p == MAP_FAILED ? errno_text("mmap") : "";
  ::close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return why;
  view_.segment[size_t(rank)] = static_cast<std::byte*>(p);
  return "";
}

}  // namespace tandem
