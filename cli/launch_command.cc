// `tandem launch`: flag parsing over the launch library (tandem/launch/launch.h).
#include "launch_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <stdexcept>

#include "flags.h"

namespace tandem::cli {

void add_launch(CLI::App& app, LaunchFlags& flags) {
  launch::LaunchOptions& o = flags.options;
  auto* l = app.add_subcommand("launch", "Run N ranks of a command with a bootstrap store, here or across hosts");
  l->add_option("-n,--nprocs", o.nprocs,
                "Number of ranks (1.." + std::to_string(launch::kMaxLocalRanks) +
                    "; across hosts at most the slots, default all of them)");
  l->add_option("-H,--hosts", flags.hosts,
                "Across hosts: host:slots,... (horovodrun's -H); ranks fill each host's slots in order");
  l->add_option("--hostfile,--machinefile", flags.hostfile,
                "Across hosts, from a file: `host slots=N` lines (mpirun's and horovodrun's -hostfile) or `host:N` "
                "(MPICH's); a bare host has 1 slot, # starts a comment");
  l->add_flag("--oversubscribe", o.oversubscribe,
              "Across hosts: allow -n above the slots (mpirun's --oversubscribe); the extra ranks go one per host in "
              "turn, up to a host file's max_slots");
  l->add_option("-x", flags.exported,
                "Give every rank, here and on other hosts, this variable: -x NAME (its value here) or -x NAME=value "
                "(mpirun's -x); repeatable")
      ->allow_extra_args(false);
  l->add_option("--env", flags.env, "Give every rank, here and on other hosts, NAME=value; repeatable")
      ->allow_extra_args(false);
  l->add_option("--rsh", o.rsh,
                "Across hosts: how to run a command line on a host: these words, the host (or it in place of {host}), "
                "then the line as one argument")
      ->capture_default_str();
  l->add_option(
      "--store-addr", o.store_address,
      "Across hosts: HOST[:PORT] at which the other hosts reach this launcher's store (default: this hostname)");
  l->add_option("--timeout", o.timeout_seconds, "Kill the job after this many seconds (0 = no limit)")
      ->capture_default_str();
  l->add_option("--grace", o.grace_seconds, "After a rank fails, seconds the others get to exit before SIGTERM")
      ->capture_default_str();
  l->add_option("--elastic", flags.elastic,
                "MIN:MAX workers (torchrun's --nnodes MIN:MAX): a failed worker is recorded and the job goes on "
                "while MIN run, for programs that shrink past it (Communicator::shrink); -n defaults to MAX");
  l->add_option("--max-restarts", o.max_restarts,
                "With --elastic: replace a lost worker, up to this many times, by a new process on its slot that "
                "joins the running job (TANDEM_JOIN=1; the others admit it with Communicator::grow)")
      ->capture_default_str();
  l->add_option("--host-discovery-script", o.host_discovery_script,
                "With --elastic (horovodrun's flag): a command printing the hosts and slots on offer (host:slots "
                "lines), run every second; workers start on offered slots beyond those running, up to MAX, and "
                "join the job. Without -H its first answer is the starting hosts");
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
  l->prefix_command();
  l->footer(
      "After the flags (and an optional --): the command every rank runs, with its arguments.\n"
      "Examples: tandem launch -n 2 -- tandem bench allreduce -b 8 -e 128M\n"
      "          tandem launch -H node1:4,node2:4 --store-addr 10.0.0.1 -- tandem bench allreduce -b 1M -e 1G\n"
      "          tandem launch --hostfile hosts.txt -x PYTHONPATH --env OMP_NUM_THREADS=4 -- python3 train.py");
}

std::optional<std::vector<std::string>> set_aside_after_separator(std::vector<std::string>& args) {
  const auto separator = std::find(args.begin(), args.end(), "--");
  if (separator == args.end()) return std::nullopt;
  std::vector<std::string> after(separator + 1, args.end());
  args.erase(separator, args.end());
  return after;
}

void accept_mpirun_spellings(std::vector<std::string>& args) {
  // The launcher's flags whose value is the next word (which is then no flag).
  static const std::set<std::string> kTakesValue = {"-n",
                                                    "--nprocs",
                                                    "-H",
                                                    "--hosts",
                                                    "--hostfile",
                                                    "--machinefile",
                                                    "-x",
                                                    "--env",
                                                    "--rsh",
                                                    "--store-addr",
                                                    "--timeout",
                                                    "--grace",
                                                    "--servers",
                                                    "--bind",
                                                    "--elastic",
                                                    "--max-restarts",
                                                    "--host-discovery-script"};
  static const std::map<std::string, std::string> kMpirun = {
      {"-np", "-n"}, {"-hostfile", "--hostfile"}, {"-machinefile", "--machinefile"}};
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& word = args[i];
    if (word == "--" || word.size() < 2 || word[0] != '-') return;  // the command starts here
    if (auto mpirun = kMpirun.find(word); mpirun != kMpirun.end()) word = mpirun->second;
    if (kTakesValue.count(word)) ++i;
  }
}

std::vector<std::string> launch_command_words(const CLI::App& launch,
                                              const std::optional<std::vector<std::string>>& after_separator) {
  std::vector<std::string> command = launch.remaining();
  // A word CLI11 passed on that looks like a flag is one the launcher does not have.
  if (!command.empty() && command[0].size() > 1 && command[0][0] == '-')
    throw UsageError("launch: unknown flag '" + command[0] + "'; put the command after --");
  if (!after_separator) return command;
  if (command.empty()) return *after_separator;
  command.push_back("--");
  command.insert(command.end(), after_separator->begin(), after_separator->end());
  return command;
}

int run_launch(LaunchFlags flags, std::vector<std::string> command) {
  launch::LaunchOptions& o = flags.options;
  o.command = std::move(command);
  // -x NAME takes NAME's value here (an unset one stays bare, for validate() to name).
  const EnvLookup here = process_env();
  for (const std::string& x : flags.exported) {
    const std::optional<std::string> value = x.find('=') == std::string::npos ? here(x) : std::nullopt;
    o.environment.push_back(value ? x + "=" + *value : x);
  }
  o.environment.insert(o.environment.end(), flags.env.begin(), flags.env.end());
  try {
    if (flags.bind == nullptr || flags.bind->count() == 0) o.bind = launch::default_bind();
    if (!flags.hosts.empty() && !flags.hostfile.empty())
      throw std::invalid_argument("-H and --hostfile both name hosts; give one of them");
    if (!flags.hosts.empty()) o.hosts = launch::parse_hosts(flags.hosts);
    if (!flags.hostfile.empty()) o.hosts = launch::read_hostfile(flags.hostfile);
    if (o.hosts.empty() && o.nprocs == -1 && !o.host_discovery_script.empty())
      o.hosts = launch::discover_hosts(o.host_discovery_script);  // the starting hosts, as horovodrun takes them
    if (!flags.elastic.empty()) launch::parse_elastic(flags.elastic, o);
  } catch (const std::exception& e) {  // a bad -H, host file, --elastic or discovery answer, or a bad TANDEM_BIND
    std::fprintf(stderr, "tandem launch: %s\n", e.what());
    return 2;
  }
  // Parameter-server ranks run `tandem ps serve` from this very executable.
  if (o.servers > 0) o.server_command = {std::filesystem::read_symlink("/proc/self/exe").string(), "ps", "serve"};
  return launch::run_launch(o);
}

}  // namespace tandem::cli
