#include "job_store.h"

#include <unistd.h>

#include <algorithm>

#include "streams.h"

namespace tandem::launch {

JobStore start_job_store(const LaunchOptions& o, bool reach_other_hosts) {
  JobStore js;
  js.secret = new_job_secret();
  StoreServerOptions so;
  so.secret = js.secret;
  if (reach_other_hosts) {
    so.host = "0.0.0.0";
    if (!o.store_address.empty() && o.store_address.find(':') != std::string::npos)
      so.port = parse_host_port(o.store_address).second;
  }
  js.server = std::make_unique<StoreServer>(so);
  js.address = "127.0.0.1:" + std::to_string(js.server->port());
  if (reach_other_hosts) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    js.host = o.store_address.empty() ? name : o.store_address;
    if (js.host.find(':') != std::string::npos) js.host = parse_host_port(js.host).first;
    js.address = js.host + ":" + std::to_string(js.server->port());
    std::string where;
    for (const HostSlots& h : o.hosts) where += (where.empty() ? "" : ", ") + h.host + ":" + std::to_string(h.slots);
    if (!where.empty()) say(std::to_string(o.nprocs) + " ranks on " + where + " (host-major); store at " + js.address);
  }
  return js;
}

bool store_records_failed(StoreServer& store, int rank) {
  const auto failed = store.failed_ranks();
  return std::find(failed.begin(), failed.end(), rank) != failed.end();
}

void record_failure(StoreServer& store, int rank, const std::string& how) {
  try {
    if (!store_records_failed(store, rank)) store.mark_failed(rank, how);
  } catch (const std::exception& e) {
    say(std::string("could not record the failure in the store: ") + e.what());
  }
}

}  // namespace tandem::launch
