#!/usr/bin/python3
"""torch.distributed through the "tandem" backend and through gloo, in one run.

Run under tandem launch (torchrun's variables), 2 ranks:
    PYTHONPATH=build/python build/bin/tandem launch -n 2 -- /usr/bin/python3 bench/anchors/torch_ops.py
Options through the environment: SIZES (bytes, comma list; default 8,4096,1048576,16777216),
ROUNDS (default 5), OPS (comma list of pingpong, ipingpong, batch, all_reduce, all_to_all;
default all), BATCH_S (seconds per timed batch, default 0.05).

Both process groups live in the same processes (the default group is tandem's,
gloo's a new_group over the same ranks); rounds alternate between them, so the
machine's load falls on both alike. Per op, size and backend: the median over
ROUNDS of the per-op time of a batch, in microseconds, on rank 0. A pingpong
is rank 0's send then recv (rank 1 mirrors it): one round trip. Ranks beyond 1
take part in the collectives only. Each result is checked against a closed form.
"""
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("TANDEM_PYTHONPATH", ""))
import tandem.c10d  # noqa: E402,F401  registers "tandem"

SIZES = [int(s) for s in os.environ.get("SIZES", "8,4096,1048576,16777216").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
OPS = os.environ.get("OPS", "pingpong,ipingpong,batch,all_reduce,all_to_all").split(",")
BATCH_S = float(os.environ.get("BATCH_S", "0.05"))


def pingpong(buf, group, rank):
    if rank == 0:
        dist.send(buf, 1, group=group)
        dist.recv(buf, 1, group=group)
    elif rank == 1:
        dist.recv(buf, 0, group=group)
        dist.send(buf, 0, group=group)


def ipingpong(buf, group, rank):
    if rank == 0:
        dist.isend(buf, 1, group=group).wait()
        dist.irecv(buf, 1, group=group).wait()
    elif rank == 1:
        dist.irecv(buf, 0, group=group).wait()
        dist.isend(buf, 0, group=group).wait()


def batch(bufs, group, rank):
    """Both ranks send to and receive from each other in one batch_isend_irecv."""
    if rank > 1:
        return
    peer = 1 - rank
    ops = [dist.P2POp(dist.isend, bufs[0], peer, group), dist.P2POp(dist.irecv, bufs[1], peer, group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def all_reduce(buf, group, rank):
    dist.all_reduce(buf, group=group)


def all_to_all(bufs, group, rank):
    dist.all_to_all_single(bufs[1], bufs[0], group=group)


def buffers(op, nbytes, rank, world):
    n = max(1, nbytes // 4)
    if op in ("batch", "all_to_all"):
        n = max(world, n - n % world)
        return [torch.full((n,), float(rank + 1)), torch.zeros(n)]
    return torch.full((n,), float(rank + 1))


def check(op, bufs, rank, world):
    """After one call on fresh buffers: the closed form."""
    if op in ("pingpong", "ipingpong"):
        want = 1.0 if rank <= 1 else rank + 1.0  # rank 0's data went there and back
        ok = bool((bufs == want).all())
    elif op == "batch":
        ok = rank > 1 or bool((bufs[1] == float(2 - rank)).all())
    elif op == "all_reduce":
        ok = bool((bufs == world * (world + 1) / 2).all())
    else:  # all_to_all: block r from rank r holds r + 1
        blocks = bufs[1].view(world, -1)
        ok = all(bool((blocks[r] == r + 1.0).all()) for r in range(world))
    if not ok:
        raise SystemExit(f"rank {rank}: wrong result for {op}")


def timed(fn, bufs, group, rank, k):
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(k):
        fn(bufs, group, rank)
    dt = (time.perf_counter() - t0) / k
    dist.barrier(group=group)
    return dt


def main():
    dist.init_process_group("tandem")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    groups = {"tandem": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    fns = {"pingpong": pingpong, "ipingpong": ipingpong, "batch": batch, "all_reduce": all_reduce,
           "all_to_all": all_to_all}
    if rank == 0:
        print(f"# torch {torch.__version__}, {world} ranks, median of {ROUNDS} rounds, us per op (rank 0)")
        print(f"{'op':<12}{'bytes':>10}{'gloo':>12}{'tandem':>12}{'gloo/tandem':>13}")
    for op in OPS:
        for nbytes in SIZES:
            times = {name: [] for name in groups}
            k = {}
            for name, group in groups.items():
                bufs = buffers(op, nbytes, rank, world)
                fns[op](bufs, group, rank)
                check(op, bufs, rank, world)
                one = timed(fns[op], bufs, group, rank, 3)
                kt = torch.tensor([max(1, min(2000, int(BATCH_S / max(one, 1e-7))))])
                dist.broadcast(kt, 0, group=group)
                k[name] = int(kt.item())
            for _ in range(ROUNDS):
                for name, group in groups.items():
                    bufs = buffers(op, nbytes, rank, world)
                    times[name].append(timed(fns[op], bufs, group, rank, k[name]))
            if rank == 0:
                g, t = (statistics.median(times[n]) * 1e6 for n in ("gloo", "tandem"))
                print(f"{op:<12}{nbytes:>10}{g:>12.1f}{t:>12.1f}{g / t:>13.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
