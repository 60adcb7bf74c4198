// CommContext's store conventions: barriers and how a lost store is named.
#include "comm_context.h"

namespace tandem {

std::string CommContext::arrive(const std::string& barrier, Deadline deadline) {
  const std::string k = key("barrier/" + barrier);
  if (store->add(k, 1, deadline) == opts.size) store->set(k + "/done", "1", deadline);
  return k + "/done";
}

void CommContext::store_barrier(const std::string& name, Deadline deadline) {
  store->wait({arrive(name, deadline)}, deadline);
}

void CommContext::throw_store_lost(const std::exception& e) const {
  if (store_host_rank >= 0) {
    throw PeerFailure(store_host_rank, "rank " + std::to_string(store_host_rank) +
                                           " failed: the bootstrap store it hosted is gone (" + e.what() + ")");
  }
  if (opts.store) throw PeerFailure(-1, std::string("lost the store handed to the communicator: ") + e.what());
  throw PeerFailure(-1, std::string("lost the bootstrap store (launcher gone?): ") + e.what());
}

}  // namespace tandem
