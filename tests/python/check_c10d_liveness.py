"""A rank of the "tandem" torch.distributed backend stops (SIGSTOP) mid-run;
the others must fail naming it. Ranks are started by hand with RANK,
WORLD_SIZE and TANDEM_C10D_FILE (a file:// init method: c10d's FileStore, the
only store); VICTIM is the rank that stops. Each survivor prints
"rank R: failed S s after rank V stopped: <error>"."""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("TANDEM_PYTHONPATH", ""))
import tandem.c10d  # noqa: E402,F401  registers "tandem"

rank, n, victim = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["VICTIM"])
dist.init_process_group("tandem", init_method="file://" + os.environ["TANDEM_C10D_FILE"], rank=rank, world_size=n)
store = dist.distributed_c10d._get_default_store()
x = torch.ones(4096)
for _ in range(20):
    dist.all_reduce(x)
dist.barrier()
if rank == victim:
    store.set("test/stopped_at", repr(time.time()))
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)  # the test kills this rank
    sys.exit(1)
try:
    while True:
        dist.all_reduce(x)
except RuntimeError as e:
    took = time.time() - float(store.get("test/stopped_at").decode())
    print(f"rank {rank}: failed {took:.2f} s after rank {victim} stopped: {e}", flush=True)
    os._exit(0)
