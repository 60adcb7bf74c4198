// `tandem launch`: flag parsing over the launch library (tandem/launch/launch.h).
#include "launch_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace tandem::cli {

void add_launch(CLI::App& app, LaunchFlags& flags) {
  launch::LaunchOptions& o = flags.options;
  auto* l = app.add_subcommand("launch", "Run N ranks of a command with a bootstrap store, here or across hosts");
  l->add_option("-n,--nprocs", o.nprocs,
                "Number of ranks (1.." + std::to_string(launch::kMaxLocalRanks) +
                    "; with -H at most the slots, default all of them)");
  l->add_option("-H,--hosts", flags.hosts,
                "Across hosts: host:slots,... (horovodrun's -H); ranks fill each host's slots in order");
  l->add_option("--rsh", o.rsh,
                "With -H: how to run a command line on a host: these words, the host (or it in place of {host}), "
                "then the line as one argument")
      ->capture_default_str();
  l->add_option("--store-addr", o.store_address,
                "With -H: HOST[:PORT] at which the other hosts reach this launcher's store (default: this hostname)");
  l->add_option("--timeout", o.timeout_seconds, "Kill the job after this many seconds (0 = no limit)")
      ->capture_default_str();
  l->add_option("--grace", o.grace_seconds, "After a rank fails, seconds the others get to exit before SIGTERM")
      ->capture_default_str();
  l->add_option("--servers", o.servers,
                "Also start this many parameter-server ranks (`tandem ps serve`) after the N workers; every rank "
                "gets TANDEM_SERVERS")
      ->capture_default_str();
  flags.bind =
      l->add_option("--bind", o.bind,
                    "auto: each rank on this host runs on its own share of the CPUs (as mpirun binds to cores), or "
                    "on one CPU, dealt round-robin, when ranks outnumber CPUs; none: leave placement to the scheduler "
                    "(default: TANDEM_BIND, else auto)")
          ->capture_default_str();
  // Only for --help: main() splits the command off before CLI11 sees it.
  l->add_option("command", o.command, "The command every rank runs, with its arguments (after --)");
  l->footer(
      "Examples: tandem launch -n 2 -- tandem bench allreduce -b 8 -e 128M\n"
      "          tandem launch -H node1:4,node2:4 --store-addr 10.0.0.1 -- tandem bench allreduce -b 1M -e 1G");
}

// Splits `launch [flags] [--] cmd args...` so the command's own flags (e.g.
// the `-n` of `tandem bench`) never reach the launcher's parser. The command
// starts after "--" or at the first word that is neither a flag nor a flag's value.
std::vector<std::string> split_launch_command(std::vector<std::string>& args) {
  static const char* const kFlagsWithValue[] = {"-n", "--nprocs", "--timeout", "--grace",      "--servers",
                                                "-H", "--hosts",  "--rsh",     "--store-addr", "--bind"};
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--" || a.empty() || a[0] != '-') {
      std::vector<std::string> command(args.begin() + static_cast<std::ptrdiff_t>(a == "--" ? i + 1 : i), args.end());
      args.resize(i);
      return command;
    }
    bool takes_value =
        std::any_of(std::begin(kFlagsWithValue), std::end(kFlagsWithValue), [&](const char* f) { return a == f; });
    if (takes_value) ++i;  // "-n 3": skip the 3; "-n3" and "--grace=1" carry their value
  }
  return {};
}

int run_launch(LaunchFlags flags, std::vector<std::string> command) {
  launch::LaunchOptions& o = flags.options;
  o.command = std::move(command);
  try {
    if (flags.bind == nullptr || flags.bind->count() == 0) o.bind = launch::default_bind();
    if (!flags.hosts.empty()) o.hosts = launch::parse_hosts(flags.hosts);
  } catch (const std::exception& e) {  // a bad -H, or a bad TANDEM_BIND (InvalidArgument)
    std::fprintf(stderr, "tandem launch: %s\n", e.what());
    return 2;
  }
  // Parameter-server ranks run `tandem ps serve` from this very executable.
  if (o.servers > 0) o.server_command = {std::filesystem::read_symlink("/proc/self/exe").string(), "ps", "serve"};
  return launch::run_launch(o);
}

}  // namespace tandem::cli
