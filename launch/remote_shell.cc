// The remote shell: how a rank on another host starts (ssh or a stand-in,
// one quoted command line carrying the launcher's settings and the job variables).
#include "remote_shell.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string_view>

#include "spawn.h"

extern char** environ;

namespace tandem::launch {
namespace {

// One word for a POSIX shell: single-quoted, embedded quotes closed and escaped.
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The launcher's own TANDEM_*, DTRAIN_* and UCX_* settings (an interface
// override, timeouts, transports), which a remote shell would not carry over;
// the job variables and the secret are set per rank instead. `settings` (the
// launch options' environment) replace the launcher's own and go along.
std::vector<std::string> forwarded_settings(const std::vector<std::string>& settings) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    if (!(kv.starts_with("TANDEM_") || kv.starts_with("DTRAIN_") || kv.starts_with("UCX_"))) continue;
    if (std::any_of(std::begin(kOwnedVariables), std::end(kOwnedVariables),
                    [&](const char* k) { return kv.starts_with(k); }))
      continue;
    if (!set_by(kv, settings)) out.emplace_back(kv);
  }
  out.insert(out.end(), settings.begin(), settings.end());
  return out;
}

}  // namespace

std::vector<std::string> remote_command(const std::string& rsh, const std::string& host,
                                        const std::vector<std::string>& job, const std::vector<std::string>& command,
                                        const std::vector<std::string>& settings) {
  std::vector<std::string> argv;
  bool placed = false;
  std::istringstream words(rsh);
  for (std::string w; words >> w;) {
    for (size_t at; (at = w.find("{host}")) != std::string::npos; placed = true) w.replace(at, 6, host);
    argv.push_back(w);
  }
  if (!placed) argv.push_back(host);
  std::string line = "cd " + shell_quote(std::filesystem::current_path().string()) +
                     " 2>/dev/null; IFS= read -r TANDEM_SECRET || exit 1; export TANDEM_SECRET; exec env";
  for (const auto& kv : forwarded_settings(settings)) line += " " + shell_quote(kv);
  for (const auto& kv : job) line += " " + shell_quote(kv);
  for (const auto& a : command) line += " " + shell_quote(a);
  argv.push_back(line);
  return argv;
}

}  // namespace tandem::launch
