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
  }
  return "?";
}

}  // namespace tandem
