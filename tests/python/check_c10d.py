"""The "tandem" torch.distributed backend, checked on every rank against closed forms.
Run under `tandem launch -n N` or with torchrun's variables (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT); prints "c10d checks passed" per rank."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("TANDEM_PYTHONPATH", ""))
import tandem.c10d  # noqa: E402,F401  registers "tandem"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


if "MASTER_ADDR" in os.environ:
    dist.init_process_group("tandem")
    how = "env://"
else:  # tandem launch: a file store next to the job, as any init_method would do
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
