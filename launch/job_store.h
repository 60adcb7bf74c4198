// The job's bootstrap store, as the launcher starts it: admitting only
// holders of the job secret; on 127.0.0.1 when every rank runs on this host,
// else on every address.
#pragma once

#include <memory>
#include <string>

#include "tandem/launch/launch.h"
#include "tandem/store.h"

namespace tandem::launch {

struct JobStore {
  std::unique_ptr<StoreServer> server;
  std::string secret;              // the job secret the store admits
  std::string address;             // host:port, as the ranks reach it
  std::string host = "127.0.0.1";  // where the ranks reach this host
};

// Throws std::exception saying why it cannot start.
JobStore start_job_store(const LaunchOptions& o, bool reach_other_hosts);

bool store_records_failed(StoreServer& store, int rank);
// Records `rank` as failed (unless it is already), so the ranks waiting on it
// fail at once naming it; says so when the store refuses.
void record_failure(StoreServer& store, int rank, const std::string& how);

}  // namespace tandem::launch
