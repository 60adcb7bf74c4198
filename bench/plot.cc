#include "tandem/bench/plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

extern char** environ;

namespace tandem::bench {

std::string gnuplot_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

namespace {

// gnuplot on `script`, its stderr on stdout as before; its exit status, or -1 when it cannot start.
int run_gnuplot_on(const std::string& script) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string program = "gnuplot", path = script;
  char* argv[] = {program.data(), path.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return -1;
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

bool run_gnuplot(const std::string& png, const std::string& data_file, const std::string& body) {
  const std::string script = png + ".gp";
  {
    std::ofstream f(script);
    f << "set terminal pngcairo size 900,540\nset output " << gnuplot_quoted(png)
      << "\nDATA_FILE = " << gnuplot_quoted(data_file) << "\nset grid\nset yrange [0:*]\n"
      << body;
  }
  std::fflush(stdout);  // gnuplot writes to the same stdout
  const int rc = run_gnuplot_on(script);
  std::remove(data_file.c_str());
  std::remove(script.c_str());
  if (rc != 0) {
    fprintf(stderr, "tandem bench: gnuplot failed to write %s (is gnuplot-nox installed?)\n", png.c_str());
    return false;
  }
  fprintf(stderr, "tandem bench: wrote %s\n", png.c_str());
  return true;
}

}  // namespace tandem::bench
