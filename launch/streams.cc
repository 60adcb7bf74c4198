// The ranks' output relay (see streams.h).
#include "streams.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace tandem::launch {
namespace {

constexpr size_t kReadChunk = 64 << 10;      // bytes read from a stream per wake-up
constexpr size_t kMaxPartialLine = 1 << 20;  // a longer line without '\n' is split

}  // namespace

void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) <= 0) return;
    } else {
      return;
    }
  }
}

void say(const std::string& message) { write_all(STDERR_FILENO, "tandem launch: " + message + "\n"); }

bool Stream::pump() {
  char buf[kReadChunk];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    close_and_flush();
    return false;
  }
  partial.append(buf, static_cast<size_t>(n));
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    out += prefix;
    out.append(partial, start, nl + 1 - start);
  }
  partial.erase(0, start);
  if (partial.size() > kMaxPartialLine) {  // bound memory for output that never ends a line
    out += prefix + partial + "\n";
    partial.clear();
  }
  if (!out.empty()) write_all(out_fd, out);
  return true;
}

void Stream::close_and_flush() {
  if (!partial.empty()) write_all(out_fd, prefix + partial + "\n");
  partial.clear();
  if (fd >= 0) ::close(fd);
  fd = -1;
}

bool Pipe::open() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  r = fds[0];
  w = fds[1];
  return true;
}

void Pipe::close_all() {
  if (r >= 0) ::close(r);
  if (w >= 0) ::close(w);
  r = w = -1;
}

}  // namespace tandem::launch
