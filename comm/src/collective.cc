// The one spelling of each collective kind, for errors, dumps and the CLI.
#include "tandem/collective.h"

namespace tandem {

const char* to_string(Collective c) {
  switch (c) {
    case Collective::allreduce: return "allreduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::allgather: return "allgather";
    case Collective::broadcast: return "broadcast";
    case Collective::barrier: return "barrier";
    case Collective::exchange: return "exchange";
    case Collective::alltoall: return "alltoall";
    case Collective::alltoallv: return "alltoallv";
    case Collective::reduce: return "reduce";
    case Collective::gather: return "gather";
    case Collective::gatherv: return "gatherv";
    case Collective::scatter: return "scatter";
    case Collective::scatterv: return "scatterv";
    case Collective::allgatherv: return "allgatherv";
    case Collective::reduce_scatterv: return "reduce_scatterv";
    case Collective::send_recv: return "send_recv";
    case Collective::split: return "split";
  }
  return "?";
}

bool has_per_rank_counts(Collective c) {
  switch (c) {
    case Collective::alltoallv:
    case Collective::gatherv:
    case Collective::scatterv:
    case Collective::allgatherv:
    case Collective::reduce_scatterv: return true;
    default: return false;
  }
}

bool is_point_to_point(Collective c) { return c == Collective::exchange || c == Collective::send_recv; }

}  // namespace tandem
