// The ranks' output: each rank's stdout and stderr arrive through a pipe and
// are relayed line by line, prefixed with "[rank] ".
#pragma once

#include <string>

namespace tandem::launch {

// Writes everything unless the reader is gone; the launcher must not die of
// EPIPE (SIGPIPE is ignored) nor block forever on a non-blocking descriptor.
void write_all(int fd, const std::string& data);

// "tandem launch: <message>" on stderr.
void say(const std::string& message);

struct Stream {
  int fd = -1;          // read end; -1 once closed
  int out_fd = -1;      // where prefixed lines go (launcher's stdout or stderr)
  std::string prefix;   // "[rank] "
  std::string partial;  // bytes after the last newline seen

  // Reads once; relays every complete line with one write() so lines from
  // different ranks never interleave. Returns false at EOF (stream closed).
  bool pump();

  // A last line without '\n' still gets printed, as its own line.
  void close_and_flush();
};

struct Pipe {
  int r = -1, w = -1;
  bool open();
  void close_all();
};

}  // namespace tandem::launch
