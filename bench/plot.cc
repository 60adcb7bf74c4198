#include "tandem/bench/plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

extern char** environ;

namespace tandem::bench {

std::string gnuplot_quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string run_gnuplot_script(const std::string& script) {
  std::string path = (std::filesystem::temp_directory_path() / "tandem-plot-XXXXXX").string();
  const int fd = ::mkstemp(path.data());
  if (fd < 0) return "cannot write gnuplot's script in " + std::filesystem::temp_directory_path().string();
  const bool written = ::write(fd, script.data(), script.size()) == static_cast<ssize_t>(script.size());
  ::close(fd);
  int rc = -1;
  if (written) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    std::string program = "gnuplot";
    char* argv[] = {program.data(), path.data(), nullptr};
    pid_t pid = 0;
    std::fflush(stdout);  // gnuplot writes to the same stdout
    if (posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ) == 0) {
      int status = 0;
      if (::waitpid(pid, &status, 0) == pid && WIFEXITED(status)) rc = WEXITSTATUS(status);
    }
    posix_spawn_file_actions_destroy(&actions);
  }
  std::remove(path.c_str());
  if (!written) return "cannot write gnuplot's script " + path;
  return rc == 0 ? "" : "gnuplot failed (is gnuplot-nox installed?)";
}

bool run_gnuplot(const std::string& png, const std::string& data_file, const std::string& body) {
  std::ostringstream script;
  script << "set terminal pngcairo size 900,540\nset output " << gnuplot_quoted(png)
         << "\nDATA_FILE = " << gnuplot_quoted(data_file) << "\nset grid\nset yrange [0:*]\n"
         << body;
  const std::string error = run_gnuplot_script(script.str());
  std::remove(data_file.c_str());
  if (!error.empty()) {
    fprintf(stderr, "tandem bench: %s: %s not written\n", error.c_str(), png.c_str());
    return false;
  }
  fprintf(stderr, "tandem bench: wrote %s\n", png.c_str());
  return true;
}

}  // namespace tandem::bench
