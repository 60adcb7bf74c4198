"""torch.distributed backend "tandem": importing this module registers it.

    import torch.distributed as dist, tandem.c10d
    dist.init_process_group("tandem")                # env:// (torchrun), tcp://, file://, a store...
    model = torch.nn.parallel.DistributedDataParallel(net)   # unmodified

The process group is a C++ c10d::ProcessGroup (tandem._c10d, built against
Debian's libtorch-dev 1.13) whose collectives run on a tandem communicator:
all-reduce (also coalesced), broadcast, allgather (list and flat),
reduce-scatter (flat) and barrier, on CPU tensors.

Bootstrap. Like ProcessGroupGloo, the group bootstraps through the c10d
store it is handed (the group's PrefixStore over whatever the init method
made: TCPStore, FileStore, ...): tandem's rendezvous keys live there under
"tandem/", and no second store, port or secret exists. The ranks watch each
other's heartbeats through that store too (TANDEM_HEARTBEAT_MS), so a
stopped or hung rank is named by every survivor.
"""
import torch.distributed as dist

from . import _c10d


def _create(store, rank, size, timeout):
    """c10d's creator: (prefix store, rank, world size, timeout) -> ProcessGroup."""
    return _c10d.create(store, rank, size, timeout.total_seconds())


if "TANDEM" not in dist.Backend._plugins:
    dist.Backend.register_backend("tandem", _create)
