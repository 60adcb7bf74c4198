"""The "tandem" torch.distributed backend, checked on every rank against closed forms.
Run under `tandem launch -n N` or with torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT): env://, or file:// at TANDEM_C10D_FILE when it is
set; prints "c10d checks passed" per rank."""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("TANDEM_PYTHONPATH", ""))
import tandem.c10d  # noqa: E402,F401  registers "tandem"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


if "TANDEM_C10D_FILE" not in os.environ:  # torchrun's variables, which tandem launch sets too
    dist.init_process_group("tandem")
    how = "env://"
else:  # a file store next to the job, as any init_method would do
    path = os.environ["TANDEM_C10D_FILE"]
    dist.init_process_group("tandem", init_method=f"file://{path}", rank=int(os.environ["TANDEM_RANK"]),
                            world_size=int(os.environ["TANDEM_WORLD_SIZE"]))
    how = "file://"
rank, n = dist.get_rank(), dist.get_world_size()
check(dist.get_backend() == "tandem", dist.get_backend())

# The bootstrap went through the store c10d handed the group (its PrefixStore),
# not a second store: tandem's start-up verdict is there, no bootstrap address.
c10d = dist.distributed_c10d
group_store = dist.PrefixStore(c10d._pg_names[c10d._get_default_group()], c10d._get_default_store())
if n > 1:
    check(group_store.get("tandem/version/verdict") == b"ok", "tandem's keys are not in the group's c10d store")


def absent(store, key):
    try:
        store.wait([key], datetime.timedelta(milliseconds=50))
    except RuntimeError:
        return True
    return False


check(absent(group_store, "tandem/bootstrap") and absent(c10d._get_default_store(), "tandem/bootstrap"),
      "a tandem store address was passed through the c10d store")
tri = n * (n - 1) // 2  # sum of the ranks

# All-reduce: every supported dtype, sum of rank + i over ranks = n*i + tri.
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8):
    x = torch.arange(50).to(dtype) + rank
    dist.all_reduce(x)
    expect = (torch.arange(50) * n + tri).to(dtype)
    check(torch.equal(x, expect), f"all_reduce {dtype}: {x[:5]} vs {expect[:5]}")
for op, expect in ((dist.ReduceOp.MAX, n - 1), (dist.ReduceOp.MIN, 0), (dist.ReduceOp.PRODUCT, 0 if n > 1 else 0)):
    x = torch.full((7,), float(rank))
    dist.all_reduce(x, op=op)
    check(torch.all(x == expect), f"all_reduce {op}: {x}")

# Async, out of order waits, and a non-contiguous tensor (a transposed view).
works, tensors = [], []
for k in range(4):
    t = torch.full((300,), float(rank + k))
    tensors.append(t)
    works.append(dist.all_reduce(t, async_op=True))
for k in reversed(range(4)):
    works[k].wait()
    check(torch.all(tensors[k] == tri + n * k), f"async all_reduce {k}")
m = (torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank).t()
dist.all_reduce(m)
check(torch.equal(m, (torch.arange(12, dtype=torch.float32).reshape(3, 4) * n + tri).t()), "non-contiguous all_reduce")

# Broadcast (bool too), allgather (list and flat), reduce-scatter, barrier.
for root in range(n):
    b = torch.tensor([rank * 10.0, 1.0, 2.0]) if rank == root else torch.zeros(3)
    dist.broadcast(b, src=root)
    check(b.tolist() == [root * 10.0, 1.0, 2.0], f"broadcast from {root}: {b}")
flags = torch.tensor([True, False, rank == 0])
dist.broadcast(flags, src=0)
check(flags.tolist() == [True, False, True], f"broadcast bool: {flags}")
out = [torch.zeros(5, dtype=torch.int64) for _ in range(n)]
dist.all_gather(out, torch.full((5,), rank, dtype=torch.int64))
check(all(torch.all(o == r) for r, o in enumerate(out)), f"all_gather: {out}")
flat = torch.zeros(3 * n)
dist._all_gather_base(flat, torch.full((3,), float(rank)))
check(torch.equal(flat, torch.arange(n).repeat_interleave(3).float()), f"_all_gather_base: {flat}")
rs_out = torch.zeros(4)
dist._reduce_scatter_base(rs_out, torch.arange(4 * n, dtype=torch.float32) + rank)
check(torch.equal(rs_out, torch.arange(4 * rank, 4 * rank + 4, dtype=torch.float32) * n + tri), f"reduce_scatter: {rs_out}")
dist.barrier()

# A second tandem group on the same c10d store: its keys stay apart from the first's.
second = dist.new_group(list(range(n)), backend="tandem")
y = torch.full((9,), float(rank + 1))
dist.all_reduce(y, group=second)
check(torch.all(y == n * (n + 1) // 2), f"all_reduce on a second group: {y}")
z = torch.full((9,), float(rank))
dist.all_reduce(z)
check(torch.all(z == tri), f"all_reduce on the first group after the second's: {z}")
dist.destroy_process_group(second)

# Point-to-point: a ring of isend/irecv (no rank waits for another to post
# first), tags, a receive from any source, blocking send and recv.
nxt, prv = (rank + 1) % n, (rank - 1) % n
got = torch.zeros(6)
if n > 1:  # one rank has no peer to send to
    works = [dist.irecv(got, src=prv, tag=3), dist.isend(torch.full((6,), float(rank)), dst=nxt, tag=3)]
    for w in works:
        w.wait()
    check(torch.all(got == prv), f"isend/irecv ring: {got}")
    if rank == 0:
        seen = set()
        for _ in range(n - 1):
            v = torch.zeros(2, dtype=torch.int64)
            src = dist.recv(v, tag=5)  # any source
            check(v.tolist() == [src, src * 2], f"recv from any source: {v} from {src}")
            seen.add(src)
        check(seen == set(range(1, n)), f"recv from any source heard {seen}")
    else:
        dist.send(torch.tensor([rank, rank * 2]), dst=0, tag=5)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), nxt), dist.P2POp(dist.irecv, got[:3], prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(torch.all(got[:3] == prv), f"batch_isend_irecv: {got}")

# Sends and receives start when first needed (a wait runs them): one nobody
# waits on still arrives, its future and is_completed() finish, a wait with a
# timeout bounds it, and a bad peer is refused at the call.
if n > 1 and rank < 2:
    peer = 1 - rank
    if rank == 0:
        w = dist.isend(torch.full((4,), 7.0), peer, tag=21)  # never waited on, no call after it for a while
        time.sleep(1.0)
        check(w.is_completed(), "an isend nobody waits on did not complete within 1 s")
    else:
        r = torch.zeros(4)
        dist.recv(r, 0, tag=21)
        check(torch.all(r == 7), f"recv of an unwaited isend: {r}")
    r = torch.zeros(2)
    fut = dist.irecv(r, peer, tag=22).get_future()
    dist.isend(torch.full((2,), float(rank)), peer, tag=22)
    fut.wait()
    check(torch.all(r == peer), f"irecv's future: {r}")
    late = torch.zeros(3)
    if rank == 1:
        w = dist.irecv(late, 0, tag=23)
        try:
            w.wait(datetime.timedelta(milliseconds=50))
            check(False, "a wait for a receive nobody sends must time out")
        except RuntimeError as e:
            check("timed out" in str(e).lower(), f"bounded wait: {e}")
        dist.send(torch.ones(1), 0, tag=24)
        w.wait()
        check(torch.all(late == 2), f"the receive after its wait timed out: {late}")
    else:
        dist.recv(torch.zeros(1), 1, tag=24)
        dist.send(torch.full((3,), 2.0), 1, tag=23)
    try:
        dist.isend(torch.ones(1), n + 3)
        check(False, "an isend to a rank out of range must fail")
    except RuntimeError as e:
        check("out of range" in str(e), f"isend to rank {n + 3}: {e}")

# Rooted collectives and all-to-all, every root.
for root in range(n):
    x = torch.arange(5, dtype=torch.float32) + rank
    dist.reduce(x, dst=root)
    if rank == root:
        check(torch.equal(x, torch.arange(5, dtype=torch.float32) * n + tri), f"reduce to {root}: {x}")
    gl = [torch.zeros(4, dtype=torch.int32) for _ in range(n)] if rank == root else None
    dist.gather(torch.full((4,), rank, dtype=torch.int32), gather_list=gl, dst=root)
    if rank == root:
        check(all(torch.all(g == r) for r, g in enumerate(gl)), f"gather to {root}: {gl}")
    so = torch.zeros(3)
    sl = [torch.full((3,), float(r * 10 + root)) for r in range(n)] if rank == root else None
    dist.scatter(so, scatter_list=sl, src=root)
    check(torch.all(so == rank * 10 + root), f"scatter from {root}: {so}")
a_in = torch.arange(2 * n, dtype=torch.float32) + 100 * rank  # rows 2p, 2p+1 go to rank p
a_out = torch.zeros(2 * n)
dist.all_to_all_single(a_out, a_in)
expect = torch.tensor([100.0 * p + 2 * rank + k for p in range(n) for k in range(2)])
check(torch.equal(a_out, expect), f"all_to_all_single: {a_out} vs {expect}")
# Uneven splits: rank r sends p + 1 rows to rank p.
ins = [torch.full((p + 1,), float(rank)) for p in range(n)]
outs = [torch.zeros(rank + 1) for _ in range(n)]
dist.all_to_all(outs, ins)
check(all(torch.all(o == p) for p, o in enumerate(outs)), f"all_to_all: {outs}")
v_out = torch.zeros(n * (rank + 1))
dist.all_to_all_single(v_out, torch.cat(ins), output_split_sizes=[rank + 1] * n, input_split_sizes=[p + 1 for p in range(n)])
check(torch.equal(v_out, torch.arange(n).repeat_interleave(rank + 1).float()), f"all_to_all_single splits: {v_out}")
co = [[torch.zeros(2), torch.zeros(3)] for _ in range(n)]
dist.all_gather_coalesced(co, [torch.full((2,), float(rank)), torch.full((3,), float(rank))])
check(all(torch.all(c[0] == r) and torch.all(c[1] == r) for r, c in enumerate(co)), f"all_gather_coalesced: {co}")
rs = torch.zeros(2)
dist.reduce_scatter(rs, [torch.full((2,), float(rank + p)) for p in range(n)])
check(torch.all(rs == tri + n * rank), f"reduce_scatter: {rs}")

# A subgroup of the first two ranks (every rank calls new_group; others are not members).
if n > 1:
    pair = dist.new_group([0, 1])
    if rank < 2:
        w = torch.full((4,), float(rank + 1))
        dist.all_reduce(w, group=pair)
        check(torch.all(w == 3), f"subgroup all_reduce: {w}")
        dist.send(torch.ones(1), dst=1 - rank, group=pair) if rank == 0 else dist.recv(w[:1], src=0, group=pair)

# Sparse (COO) all-reduce, as Gloo's: rank r contributes row r and row 5.
sp = torch.sparse_coo_tensor(torch.tensor([[rank, 5]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (8, 2))
dist.all_reduce(sp)
dense = torch.zeros(8, 2)
dense[:n] = torch.tensor([1.0, 2.0])
dense[5] += n * torch.tensor([3.0, 4.0])
check(torch.equal(sp.to_dense(), dense), f"sparse all_reduce: {sp.to_dense()}")

# Gloo's monitored barrier (tandem.c10d lets dist.monitored_barrier through for tandem groups).
dist.monitored_barrier(timeout=datetime.timedelta(seconds=30), wait_all_ranks=True)

# What tandem cannot do is named.
c = torch.full((3,), complex(rank, 1.0))  # torch hands complex tensors over as their real views
dist.all_reduce(c)
check(torch.all(c == complex(tri, n)), f"complex all_reduce: {c}")
try:
    dist.all_reduce(torch.zeros(2, dtype=torch.int16))
    check(False, "int16 all_reduce must fail")
except RuntimeError as e:
    check("are not supported" in str(e) and "Short" in str(e), str(e))
try:
    dist.all_reduce(torch.zeros(2), op=dist.ReduceOp.BAND)
    check(False, "BAND must fail")
except RuntimeError as e:
    check("reduce op" in str(e), str(e))

dist.destroy_process_group()
print(f"rank {rank}: {how} c10d checks passed", flush=True)
