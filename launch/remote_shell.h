// The remote shell: the argv that starts a rank on another host.
#pragma once

#include <string>
#include <vector>

namespace tandem::launch {

// How a remote rank starts: `rsh` with the host, then one shell command line
// that enters the launcher's directory (if the host has it), reads the job
// secret from its standard input (never a command line) and runs the command
// with the forwarded settings and the job variables.
std::vector<std::string> remote_command(const std::string& rsh, const std::string& host,
                                        const std::vector<std::string>& job, const std::vector<std::string>& command,
                                        const std::vector<std::string>& settings);

}  // namespace tandem::launch
