"""torch.distributed backend "tandem": importing this module registers it.

    import torch.distributed as dist, tandem.c10d
    dist.init_process_group("tandem")                # env:// (torchrun), tcp://, file://, a store...
    model = torch.nn.parallel.DistributedDataParallel(net)   # unmodified

The process group is a C++ c10d::ProcessGroup (tandem._c10d, built against
Debian's libtorch-dev 1.13) whose collectives run on a tandem communicator:
every ProcessGroup call Gloo implements for CPU tensors: all-reduce (also
coalesced, and sparse COO tensors), broadcast, reduce, allgather (list, flat,
coalesced), gather, scatter, reduce-scatter (list and flat), all-to-all (list
and flat, with split sizes), send, recv, recv from any source, barrier and
Gloo's monitored barrier; subgroups (new_group) get communicators of their own.

torch 1.13's dist.monitored_barrier admits the gloo backend only; importing
this module lets it through for "tandem" groups as well (other backends keep
torch's behaviour).

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

_torch_monitored_barrier = dist.monitored_barrier


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier, for tandem groups too (see above)."""
    c10d = dist.distributed_c10d
    if c10d._rank_not_in_group(group) or dist.get_backend(group) != "tandem":
        return _torch_monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)
    pg = c10d._get_default_group() if group is None else group
    return pg.monitored_barrier(c10d.default_pg_timeout if timeout is None else timeout, wait_all_ranks=wait_all_ranks)


if dist.monitored_barrier is _torch_monitored_barrier:
    dist.monitored_barrier = monitored_barrier
    dist.distributed_c10d.monitored_barrier = monitored_barrier
