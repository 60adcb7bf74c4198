"""tandem's all-to-all, rooted and variable-size collectives, point-to-point
messages and sub-communicators from Python under `tandem launch -n N`: NumPy
arrays and torch tensors in place, blocking and async, against closed forms,
and the errors with the C++ messages. Prints
"check_more_collectives: rank R: K checks passed"."""
import numpy as np

import tandem
from checking import Checks

checks = Checks("check_more_collectives")
check, raises = checks.check, checks.raises


def done(result, async_op):
    """A call's result; an async one waited for first."""
    if async_op:
        result.wait(timeout=60)
        check(result.test(), "async request finished")
    return result


comm = tandem.init()
rank, size = comm.rank, comm.size
checks.rank = rank
last = size - 1
packed = [sum(range(1, p + 1)) for p in range(size)]  # displacements of counts p + 1, packed

for async_op in (False, True):
    mode = "async" if async_op else "blocking"
    # alltoall: element i of rank r's block for p is r * 100 + p * 10 + i.
    x = np.array([rank * 100 + p * 10 + i for p in range(size) for i in range(4)], dtype=np.float32)
    out = np.full(size * 4, -1, dtype=np.float32)
    done(comm.alltoall(x, out, async_op=async_op), async_op)
    want = np.array([p * 100 + rank * 10 + i for p in range(size) for i in range(4)], dtype=np.float32)
    check(np.array_equal(out, want), f"alltoall {mode}")
    # alltoallv: rank r sends r + p + 1 elements to p, packed; they land 8 apart.
    counts = [rank + p + 1 for p in range(size)]
    x = np.concatenate([np.arange(c, dtype=np.int64) + rank * 100 + p * 10 for p, c in enumerate(counts)])
    out = np.full(size * 8, -1, dtype=np.int64)
    done(comm.alltoallv(x, out, counts, counts, recv_displs=[8 * p for p in range(size)], async_op=async_op), async_op)
    for p in range(size):
        block = out[8 * p:8 * p + 8]
        n = rank + p + 1
        check(np.array_equal(block[:n], np.arange(n) + p * 100 + rank * 10) and np.all(block[n:] == -1),
              f"alltoallv {mode} block {p}")
    # reduce: sum of (r + 1) * i to the last rank, out of place; max in place to rank 0.
    x = np.arange(1000, dtype=np.float64) * (rank + 1)
    out = np.full(1000, -1.0)
    done(comm.reduce(x, root=last, out=out if rank == last else None, async_op=async_op), async_op)
    if rank == last:
        check(np.array_equal(out, np.arange(1000) * size * (size + 1) / 2), f"reduce {mode}")
    check(np.array_equal(x, np.arange(1000, dtype=np.float64) * (rank + 1)), f"reduce {mode} keeps the input")
    y = np.arange(5, dtype=np.int32) + rank
    done(comm.reduce(y, root=0, op="max", async_op=async_op), async_op)
    check(np.array_equal(y, np.arange(5) + (last if rank == 0 else rank)), f"reduce max in place {mode}")
    # gather to rank 0 and gatherv (rank r: r + 1 elements of r) to the last rank.
    out = np.empty(size * 3, dtype=np.float32) if rank == 0 else None
    done(comm.gather(np.full(3, rank, dtype=np.float32), out, root=0, async_op=async_op), async_op)
    if rank == 0:
        check(np.array_equal(out, np.repeat(np.arange(size), 3)), f"gather {mode}")
    out = np.full(packed[-1] + size, -1, dtype=np.float32) if rank == last else None
    counts = [p + 1 for p in range(size)] if rank == last else None
    done(comm.gatherv(np.full(rank + 1, rank, dtype=np.float32), out, counts, root=last, async_op=async_op), async_op)
    if rank == last:
        check(np.array_equal(out[:packed[-1] + size], np.repeat(np.arange(size), np.arange(1, size + 1))),
              f"gatherv {mode}")
    # scatter from rank 0 (block p: p * 10 + i), scatterv from the last rank (rank p: p + 1 of 100 + p, blocks 4 apart).
    src = np.array([p * 10 + i for p in range(size) for i in range(2)], dtype=np.int64) if rank == 0 else None
    mine = np.empty(2, dtype=np.int64)
    done(comm.scatter(src, mine, root=0, async_op=async_op), async_op)
    check(np.array_equal(mine, [rank * 10, rank * 10 + 1]), f"scatter {mode}")
    src = np.repeat(100 + np.arange(size, dtype=np.float64), 4) if rank == last else None
    mine = np.empty(rank + 1)
    done(comm.scatterv(src, mine, [p + 1 for p in range(size)], [4 * p for p in range(size)], root=last,
                       async_op=async_op), async_op)
    check(np.all(mine == 100 + rank), f"scatterv {mode}")
    # allgatherv (rank p: p + 1 elements of p * 10 + i) and reduce_scatterv ((r + 1) * g, summed).
    counts = [p + 1 for p in range(size)]
    out = np.empty(packed[-1] + size, dtype=np.int32)
    done(comm.allgatherv(np.arange(rank + 1, dtype=np.int32) + rank * 10, out, counts, async_op=async_op), async_op)
    check(np.array_equal(out, np.concatenate([np.arange(p + 1) + p * 10 for p in range(size)])), f"allgatherv {mode}")
    whole = np.arange(packed[-1] + size, dtype=np.float32) * (rank + 1)
    mine = np.empty(rank + 1, dtype=np.float32)
    done(comm.reduce_scatterv(whole, mine, counts, async_op=async_op), async_op)
    check(np.array_equal(mine, (np.arange(rank + 1) + packed[rank]) * size * (size + 1) / 2), f"reduce_scatterv {mode}")

# torch tensors, in place (python3-torch, when present).
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    t = torch.tensor([rank * 10 + p for p in range(size)], dtype=torch.int64)
    got = torch.empty(size, dtype=torch.int64)
    comm.alltoall(t, got)
    check(got.tolist() == [p * 10 + rank for p in range(size)], "torch alltoall")
    t = torch.full((7,), float(rank + 1), dtype=torch.bfloat16)
    comm.reduce(t, root=0)
    if rank == 0:
        check(bool((t == size * (size + 1) / 2).all()), "torch reduce bf16")
    out = torch.empty(packed[-1] + size)
    comm.allgatherv(torch.full((rank + 1,), float(rank)), out, [p + 1 for p in range(size)])
    check(out.tolist() == [float(p) for p in range(size) for _ in range(p + 1)], "torch allgatherv")

# Point-to-point (a communicator of one rank has no peer).
if size == 1:
    raises(tandem.InvalidArgument, "this communicator has one rank", lambda: comm.send(np.zeros(1), 0))
else:
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    got = np.full(1000, -1.0, dtype=np.float32)
    rx = comm.recv(got, prv, tag=7, async_op=True)
    tx = comm.send(np.arange(1000, dtype=np.float32) + rank * 1000, nxt, tag=7, async_op=True)
    rx.wait(timeout=60)
    tx.wait(timeout=60)
    check(rx.source == prv and np.array_equal(got, np.arange(1000) + prv * 1000), "ring exchange")
    # Tags keep messages apart: rank 1 receives rank 0's tag 2 before its tag 1.
    if rank == 0:
        comm.send(np.array([11.0]), 1, tag=1)
        comm.send(np.array([22.0]), 1, tag=2)
    elif rank == 1:
        a, b = np.zeros(1), np.zeros(1)
        second = comm.recv(b, 0, tag=2, async_op=True)
        check(comm.recv(a, 0, tag=1) == 0, "recv returns its source")
        second.wait(timeout=60)
        check(a[0] == 11 and b[0] == 22, "tags")
    # Any source: rank 0 hears once from each other rank.
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            v = np.zeros(1, dtype=np.int32)
            src = comm.recv(v, tandem.ANY_SOURCE, tag=9)
            check(v[0] == src * 100, f"any source value from {src}")
            seen.add(src)
        check(seen == set(range(1, size)), f"any source senders {seen}")
    else:
        comm.send(np.array([rank * 100], dtype=np.int32), 0, tag=9)
    # A group: all-to-all by hand, torch tensors when present, a send to itself too.
    for async_op in (False, True):
        mine = [np.array([rank * 10 + p], dtype=np.int64) for p in range(size)]
        got = [np.array([-1], dtype=np.int64) for _ in range(size)]
        ops = [tandem.P2POp("recv", got[p], p, tag=3) for p in range(size)]
        ops += [tandem.P2POp("send", mine[p], p, tag=3) for p in range(size)]
        done(comm.group(ops, async_op=async_op), async_op)
        check([int(g[0]) for g in got] == [p * 10 + rank for p in range(size)], f"group async={async_op}")
    raises(tandem.InvalidArgument, "tag 2147483648 is out of range 0..2^31-1",
           lambda: comm.send(np.zeros(1), nxt, tag=2 ** 31))
    raises(tandem.InvalidArgument, f"recv: peer {size} is out of range for world size {size}",
           lambda: comm.recv(np.zeros(1), size))
    raises(tandem.InvalidArgument, "at most one receive from any source per group",
           lambda: comm.group([tandem.P2POp("recv", np.zeros(1), tandem.ANY_SOURCE)] * 2))
    raises(tandem.InvalidArgument, "P2POp kind 'put'", lambda: tandem.P2POp("put", np.zeros(1), 0))

# Sub-communicators: even and odd ranks, keys reversing the order; the last rank in none; a duplicate.
half = comm.split(rank % 2, key=-rank)
members = list(range(rank % 2, size, 2))
check(half.size == len(members) and half.rank == len(members) - 1 - rank // 2, "split rank and size")
v = np.array([rank + 1], dtype=np.int64)
half.allreduce(v)
check(v[0] == sum(m + 1 for m in members), "allreduce on a split")
some = comm.split(tandem.UNDEFINED_COLOR if rank == last else 0)
check((some is None) == (rank == last), "UNDEFINED_COLOR gives None")
if some is not None:
    check(some.size == size - 1 and some.rank == rank, "split without the last rank")
dup = comm.duplicate()
b = np.array([rank], dtype=np.int32)
dup.broadcast(b, root=last)
check(dup.rank == rank and dup.size == size and b[0] == last, "duplicate")
raises(tandem.InvalidArgument, "split: color -5 must be >= 0", lambda: comm.split(-5))

# Errors: the C++ messages, and the binding's own size checks.
raises(tandem.InvalidArgument, f"reduce: root {size} is out of range for world size {size}",
       lambda: comm.reduce(np.zeros(3), root=size))
raises(tandem.InvalidArgument, f"gather: root -1 is out of range for world size {size}",
       lambda: comm.gather(np.zeros(3), np.zeros(3 * size), root=-1))
raises(tandem.InvalidArgument, f"alltoallv send: {size + 1} counts and no displacements for {size} ranks",
       lambda: comm.alltoallv(np.zeros(3), np.zeros(3), [0] * (size + 1), [0] * size))
raises(tandem.InvalidArgument, f"allgatherv: output has 1 elements, the blocks span {2 * size}",
       lambda: comm.allgatherv(np.zeros(2), np.zeros(1), [2] * size))
raises(tandem.InvalidArgument, "scatter: input is f64 but output is f32",
       lambda: comm.scatter(np.zeros(size), np.zeros(1, dtype=np.float32)))
comm.barrier(timeout=30)
checks.passed()
