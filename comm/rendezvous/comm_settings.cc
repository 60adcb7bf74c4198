// comm's settings tables (rendezvous and liveness, interface selection, the
// UCX transport, the reduction kernels): one row per variable that fills CommOptions.
#include <string>

#include "tandem/errors.h"
#include "tandem/logging.h"
#include "tandem/netif.h"
#include "tandem/settings.h"

namespace tandem {
namespace {

using K = SettingKind;
using O = CommOptions;

SettingTable<O> make_comm() {
  SettingTable<O> t;
  Setting timeout = setting_row("comm", "TANDEM_TIMEOUT_MS", "timeout", K::milliseconds, "300000",
                                "Default deadline of every collective.");
  timeout.min = 1;
  t.push_back(duration_field(timeout, &O::timeout));
  Setting connect = setting_row("comm", "TANDEM_CONNECT_TIMEOUT_MS", "connect_timeout", K::milliseconds, "60000",
                                "Deadline of connecting to every peer.");
  connect.min = 1;
  t.push_back(duration_field(connect, &O::connect_timeout));
  const Setting heartbeat = setting_row("comm", "TANDEM_HEARTBEAT_MS", "heartbeat", K::milliseconds, "2000",
                                        "Liveness beat interval; a rank silent for two intervals is recorded as failed "
                                        "(0: off, else at least 100).",
                                        "set it to milliseconds between heartbeats (0 turns them off)");
  t.push_back({heartbeat,
               [heartbeat](O& o, const std::string& v) {
                 const long long ms = parse_number_setting(heartbeat, v);
                 if (ms > 0 && ms < 100) {
                   throw InvalidArgument("tandem: TANDEM_HEARTBEAT_MS='" + v +
                                         "' is too short (the store would spend its time checking); use 0 (off) or "
                                         "at least 100");
                 }
                 o.heartbeat = std::chrono::milliseconds(ms);
               },
               [](const O& o) { return std::to_string(o.heartbeat.count()); }});
  t.push_back(number_field(setting_row("comm", "TANDEM_FLIGHT_ENTRIES", "flight_entries", K::count, "1024",
                                       "Collectives the flight recorder keeps (0: off).",
                                       "set it to how many collectives the flight recorder keeps (0 turns it off)"),
                           &O::flight_entries));
  t.push_back(text_field(setting_row("comm", "TANDEM_FLIGHT_DIR", "flight_dir", K::text, "",
                                     "Where flight-recorder dumps go (empty: TMPDIR, else /tmp)."),
                         &O::flight_dir));
  t.push_back(
      text_field(setting_row("comm", "TANDEM_HOST_ID", "host_id", K::text, "",
                             "What makes ranks one host for topology and shared memory (empty: boot id, hostname "
                             "and namespaces)."),
                 &O::host_id));
  t.push_back(bool_field(setting_row("comm", "TANDEM_HOST_STORE", "host_store", K::boolean, "0",
                                     "Rank 0 hosts the store at TANDEM_STORE_ADDR under any launcher.",
                                     "set it to 1 (rank 0 hosts the store) or 0"),
                         &O::host_store));
  t.push_back(bool_field(setting_row("comm", "TANDEM_STORE_LISTEN_ALL", "store_listen_all", K::boolean, "0",
                                     "Let rank 0 host the store on every address (0.0.0.0 or ::)."),
                         &O::store_listen_all));
  t.push_back(bool_field(setting_row("comm", "TANDEM_JOIN", "join", K::boolean, "0",
                                     "Join a running job: create() waits for the members' next grow() (tandem "
                                     "launch --elastic sets it on replacements).",
                                     "set it to 1 (join a running job) or 0"),
                         &O::join));
  t.push_back(bool_field(setting_row("comm", "TANDEM_ALLOW_NO_SECRET", "allow_no_secret", K::boolean, "0",
                                     "Let a store reachable from other hosts run without the job secret."),
                         &O::allow_no_secret));
  return t;
}

// Both names fill network_interface; read_network checks they agree.
SettingField<O> interface_field(const char* variable, const char* doc) {
  return {setting_row("netif", variable, "network_interface", K::text, "", doc),
          [](O& o, const std::string& v) {
            parse_interface_override(v);  // a syntax error fails here, before any connection
            o.network_interface = v;
          },
          [](const O& o) { return o.network_interface; }};
}

SettingTable<O> make_netif() {
  return {interface_field("TANDEM_NETWORK_INTERFACE",
                          "Restricts interface selection: a name, a list eth,ib, an exclusion ^docker or an exact "
                          "=eth0 (empty: automatic)."),
          interface_field("DTRAIN_NETWORK_INTERFACE",
                          "Determined's name for TANDEM_NETWORK_INTERFACE; both set "
                          "must agree.")};
}

SettingTable<O> make_transport() {
  SettingTable<O> t;
  t.push_back(bool_field(setting_row("transport", "TANDEM_UCX_PEER_ERRORS", "ucx_peer_error_handling", K::boolean, "0",
                                     "UCX peer error handling (and keepalive at the heartbeat) on every endpoint."),
                         &O::ucx_peer_error_handling));
  t.push_back(pinned_field(setting_row("transport", "UCX_NET_DEVICES", "ucx_net_devices_pinned", K::text, "",
                                       "UCX's devices; when set, interface selection reports but leaves UCX alone."),
                           &O::ucx_net_devices_pinned));
  t.push_back(pinned_field(setting_row("transport", "UCX_KEEPALIVE_INTERVAL", "ucx_keepalive_pinned", K::text, "",
                                       "UCX's keepalive interval; when set, the heartbeat does not override it."),
                           &O::ucx_keepalive_pinned));
  t.push_back(number_field(
      setting_row("transport", "TANDEM_P2P_STREAM_MAX_BYTES", "p2p_stream_max_bytes", K::bytes, "67108864",
                  "Send/recv between ranks of one host past this size is read by cross-memory attach; up to it, "
                  "it streams through the shared-memory slots, or is read where TANDEM_P2P_TIMED found that "
                  "faster (docs/algorithms.md, 'shm: point-to-point').",
                  "set it to a byte count (messages up to 16 KiB go through the slots whatever it says)"),
      &O::p2p_stream_max_bytes));
  t.push_back(
      bool_field(setting_row("transport", "TANDEM_P2P_TIMED", "p2p_timed", K::boolean, "1",
                             "Send/recv between ranks of one host from 16 KiB up to TANDEM_P2P_STREAM_MAX_BYTES "
                             "streams or is read by cross-memory attach, whichever the receivers timed faster "
                             "on the first messages of each size class (one verdict for all pairs); 0: it streams "
                             "(docs/algorithms.md, 'shm: point-to-point, timed')."),
                 &O::p2p_timed));
  t.push_back(bool_field(setting_row("transport", "TANDEM_HUGE_PAGES", "huge_pages", K::boolean, "1",
                                     "Ranks of one host back a heap buffer's whole 2 MiB pages with transparent "
                                     "huge pages (MADV_COLLAPSE, Linux 6.1) at its first call, so that "
                                     "cross-memory attach pins and copies it in 2 MiB pages, not 4 KiB ones, "
                                     "until the communicator's collapses on this rank have taken 200 ms; "
                                     "0: buffers keep the pages they came with (docs/algorithms.md, "
                                     "'shm: huge pages for heap buffers')."),
                         &O::huge_pages));
  return t;
}

SettingTable<O> make_reduce() {
  Setting isa = setting_row("reduce", "TANDEM_REDUCE_ISA", "reduce_isa", K::choice, "",
                            "Highest instruction set of the CPU reduction kernels (empty: the best the CPU has).");
  isa.accepted = {"scalar", "avx2", "avx512"};
  return {{isa, [isa](O& o, const std::string& v) { o.reduce_isa = parse_choice_setting(isa, v); },
           [](const O& o) { return o.reduce_isa; }}};
}

SettingField<LogOptions> levels_field(const char* variable, const char* name, std::string LogOptions::*member,
                                      std::string doc) {
  Setting s = setting_row("log", variable, name, K::text, "", std::move(doc),
                          "use a level (trace, debug, info, warn, error, critical or off), NAME=LEVEL for one of "
                          "comm, engine, liveness, netif, store or transport, or a comma list of both (e.g. "
                          "info,liveness=debug)");
  return {s, [s, member](LogOptions& o, const std::string& v) { o.*member = parse_log_levels(s, v); },
          [member](const LogOptions& o) { return o.*member; }};
}

SettingTable<LogOptions> make_log() {
  return {levels_field("TANDEM_LOG_LEVEL", "tandem_levels", &LogOptions::tandem_levels,
                       "Log levels: one for every logger and NAME=LEVEL for a subsystem's (comm, engine, liveness, "
                       "netif, store, transport), e.g. warn or info,liveness=debug (empty: info)."),
          levels_field("SPDLOG_LEVEL", "spdlog_levels", &LogOptions::spdlog_levels,
                       "spdlog's own variable, in the same syntax and free to name the program's own loggers; "
                       "used when TANDEM_LOG_LEVEL is not set.")};
}

}  // namespace

const SettingTable<LogOptions>& log_settings() {
  static const SettingTable<LogOptions> table = make_log();
  return table;
}

const SettingTable<CommOptions>& comm_settings() {
  static const SettingTable<CommOptions> table = make_comm();
  return table;
}

const SettingTable<CommOptions>& netif_settings() {
  static const SettingTable<CommOptions> table = make_netif();
  return table;
}

const SettingTable<CommOptions>& transport_settings() {
  static const SettingTable<CommOptions> table = make_transport();
  return table;
}

const SettingTable<CommOptions>& reduce_settings() {
  static const SettingTable<CommOptions> table = make_reduce();
  return table;
}

}  // namespace tandem
