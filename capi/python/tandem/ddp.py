"""PyTorch DistributedDataParallel over tandem: a DDP communication hook that
all-reduces every gradient bucket through tandem instead of the process
group (DDP keeps using the process group only for its start-up broadcasts).

    import torch.distributed as dist, tandem, tandem.ddp
    comm = tandem.init()
    tandem.ddp.init_process_group(comm)          # gloo, bootstrapped through tandem
    model = torch.nn.parallel.DistributedDataParallel(net)
    tandem.ddp.register(model, comm)             # buckets now travel through tandem

The hook and the "tandem" torch.distributed backend (tandem.c10d) are two
ways to the same end: the backend needs tandem built against libtorch-dev
and runs DDP unmodified; the hook needs only the Python package and leaves
DDP's start-up broadcasts on gloo. Buckets are reduced asynchronously while
backward goes on either way.
"""
import queue
import threading

import torch
import torch.distributed as dist

import tandem


class _Completer:
    """One thread that waits for tandem requests in issue order and completes their futures."""

    def __init__(self):
        self._queue = queue.Queue()
        threading.Thread(target=self._run, name="tandem-ddp", daemon=True).start()

    def _run(self):
        while True:
            request, future, tensor = self._queue.get()
            try:
                request.wait()
                future.set_result(tensor)
            except BaseException as e:  # the future carries it to DDP's wait
                future.set_exception(e)

    def submit(self, request, tensor):
        future = torch.futures.Future()
        self._queue.put((request, future, tensor))
        return future


class HookState:
    def __init__(self, comm, timeout=None):
        self.comm, self.timeout, self.completer = comm, timeout, _Completer()


def allreduce_hook(state, bucket):
    """Averages the bucket over ranks through tandem, asynchronously."""
    buffer = bucket.buffer()
    request = state.comm.allreduce(buffer, op="avg", timeout=state.timeout, async_op=True)
    return state.completer.submit(request, buffer)


def register(model, comm, timeout=None):
    """Routes every gradient bucket of a DistributedDataParallel model through tandem."""
    model.register_comm_hook(HookState(comm, timeout), allreduce_hook)


def init_process_group(comm, backend="gloo", timeout_s=300):
    """The torch.distributed process group DDP needs, rendezvoused through tandem:
    rank 0 opens a TCPStore on a free port and broadcasts it; no MASTER_ADDR/PORT needed.
    Rank 0's host is that of tandem's store (TANDEM_STORE_ADDR), else this host;
    gloo uses the network interface tandem selected (GLOO_SOCKET_IFNAME overrides)."""
    import datetime
    import os

    import numpy as np

    # gloo's own interface choice (the hostname's address) can be loopback on a
    # multi-host job: give it the interface tandem selected, unless the user chose.
    import re
    chosen = re.search(r"tcp/([\w.:-]+)", comm.transport)
    if chosen and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = chosen.group(1)
    port = np.zeros(1, dtype=np.int64)
    host = os.environ.get("TANDEM_STORE_ADDR", "127.0.0.1:0").rsplit(":", 1)[0].strip("[]")
    if comm.rank == 0:
        # Not waiting for the workers here: they learn the port from the broadcast below.
        store = dist.TCPStore(host, 0, comm.size, True, datetime.timedelta(seconds=timeout_s), False)
        port[0] = store.port
    comm.broadcast(port, root=0)
    if comm.rank != 0:
        store = dist.TCPStore(host, int(port[0]), comm.size, False, datetime.timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=comm.rank, world_size=comm.size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return store
