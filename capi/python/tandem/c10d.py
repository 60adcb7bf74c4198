"""torch.distributed backend "tandem": importing this module registers it.

    import torch.distributed as dist, tandem.c10d
    dist.init_process_group("tandem")                # env:// (torchrun), tcp://, file://, a store...
    model = torch.nn.parallel.DistributedDataParallel(net)   # unmodified

The process group is a C++ c10d::ProcessGroup (tandem._c10d, built against
Debian's libtorch-dev 1.13) whose collectives run on a tandem communicator:
all-reduce (also coalesced), broadcast, allgather (list and flat),
reduce-scatter (flat) and barrier, on CPU tensors.

Bootstrap. Like ProcessGroupNCCL, which passes its unique id through the c10d
store and then connects on its own, the group agrees through the store it is
handed on one key: the address of tandem's store (hosted by the group's rank
0 on a free port) and a fresh 32-byte job secret. Every rank then connects to
that store (HMAC-authenticated), which also carries tandem's heartbeats and
failure reports. Rank 0's address is, in order: TANDEM_C10D_HOST, MASTER_ADDR,
the host of TANDEM_STORE_ADDR (under `tandem launch`), else 127.0.0.1 (one host).
The secret is as private as the c10d store it travels through.
"""
import os
import secrets
import socket

import torch.distributed as dist

from . import _c10d

_KEY = "tandem/bootstrap"


def _rank0_host():
    for name in ("TANDEM_C10D_HOST", "MASTER_ADDR"):
        if os.environ.get(name):
            return os.environ[name]
    if os.environ.get("TANDEM_STORE_ADDR"):
        return os.environ["TANDEM_STORE_ADDR"].rsplit(":", 1)[0].strip("[]")
    return "127.0.0.1"


def _free_port(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _create(store, rank, size, timeout):
    """c10d's creator: (prefix store, rank, world size, timeout) -> ProcessGroup."""
    if rank == 0:
        host = _rank0_host()
        address = f"[{host}]:{_free_port(host)}" if ":" in host else f"{host}:{_free_port(host)}"
        store.set(_KEY, f"{address} {secrets.token_hex(32)}")
    address, secret = store.get(_KEY).decode().split(" ")
    # One tandem store per group: its keys live under a prefix of their own.
    return _c10d.create(rank, size, address, secret, timeout.total_seconds(), f"tandem-c10d-{address}")


if "TANDEM" not in dist.Backend._plugins:
    dist.Backend.register_backend("tandem", _create)
