// Running a shell command from a test under a hard wall-clock limit, with its
// output, so a hang fails the test instead of stalling the suite.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem::testing {

struct Output {
  int status = -1;   // exit status; 128 + signal when killed (137: the time limit)
  std::string text;  // stdout and stderr
};

// `command` runs under sh (pipes, `&&`, `VAR=value` prefixes all inside the limit).
inline Output run(const std::string& command, int limit_seconds = 120) {
  std::string quoted;  // the command in single quotes for sh -c
  for (char c : command) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  const std::string guarded = "timeout -s KILL " + std::to_string(limit_seconds) + " sh -c '" + quoted + "' 2>&1";
  Output o;
  FILE* p = popen(guarded.c_str(), "r");
  if (!p) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.text.append(buf, n);
  const int status = pclose(p);
  o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace tandem::testing
