"""tandem's Python package under `tandem launch -n N`: collectives on NumPy arrays
(every dtype against NumPy's own reduction of every rank's input) and torch
tensors in place, async requests, shared arrays, the gradient sync, and the
error classes with their messages. Prints "check_bindings: rank R: K checks passed"."""
import threading

import numpy as np

import tandem
from checking import Checks

checks = Checks("check_bindings")
check, raises = checks.check, checks.raises


def inputs(rank, dtype, n=1003):
    """Deterministic per-rank values, small enough that every op is exact in every dtype."""
    rng = np.random.default_rng(1234 + rank)
    return rng.integers(1, 4, size=n).astype(dtype)


comm = tandem.init()
rank, size = comm.rank, comm.size
checks.rank = rank
check(tandem.__version__.count(".") == 2, "version")

# All-reduce of every dtype and op equals NumPy's reduction of all ranks' inputs.
reference_ops = {"sum": np.sum, "min": np.min, "max": np.max, "prod": np.prod}
for dtype in ["float32", "float64", "float16", "int32", "int64", "uint8"]:
    all_inputs = np.stack([inputs(r, dtype) for r in range(size)])
    for op, fn in reference_ops.items():
        x = inputs(rank, dtype)
        comm.allreduce(x, op=op)
        want = fn(all_inputs, axis=0).astype(dtype)
        check(np.array_equal(x, want), f"allreduce {dtype} {op}")
    out = np.empty(1003, dtype=dtype)
    x = inputs(rank, dtype)
    comm.allreduce(x, op="sum", out=out)
    check(np.array_equal(out, all_inputs.sum(axis=0).astype(dtype)) and np.array_equal(x, inputs(rank, dtype)),
          f"allreduce out-of-place {dtype}")
x = np.full(10, rank + 1.0)
comm.allreduce(x, op="avg")
check(np.all(x == (size + 1) / 2), "avg")

# Other collectives.
blocks = np.arange(size * 5, dtype=np.float32) + rank
mine = np.empty(5, dtype=np.float32)
comm.reduce_scatter(blocks, mine)
want = sum(np.arange(size * 5, dtype=np.float32) + r for r in range(size))[rank * 5:(rank + 1) * 5]
check(np.array_equal(mine, want), "reduce_scatter")
gathered = np.empty(size * 3, dtype=np.int64)
comm.allgather(np.full(3, rank, dtype=np.int64), gathered)
check(np.array_equal(gathered, np.repeat(np.arange(size), 3)), "allgather")
b = np.full(7, 42 if rank == size - 1 else -1, dtype=np.int32)
comm.broadcast(b, root=size - 1)
check(np.all(b == 42), "broadcast")
comm.barrier(timeout=30)

# Async, in place, while Python goes on.
x = np.full(1 << 18, float(rank + 1), dtype=np.float32)
req = comm.allreduce(x, async_op=True)
req.wait(timeout=60)
check(req.test() and np.all(x == size * (size + 1) / 2), "allreduce async")
req = comm.barrier(async_op=True)
req.wait()

# Shared arrays: collectives read them in place.
s = comm.allocate_shared((256, 4), dtype="float32")
check(s.shape == (256, 4) and np.all(s == 0), "allocate_shared zero-filled")
s[:] = rank + 1
comm.allreduce(s)
check(np.all(s == size * (size + 1) / 2), "allreduce on a shared array")

# torch tensors, in place (python3-torch, when present).
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    for dt in [torch.float32, torch.float64, torch.bfloat16, torch.int64]:
        t = torch.full((1000,), rank + 1, dtype=dt)
        address = t.data_ptr()
        comm.allreduce(t)
        check(t.data_ptr() == address and bool((t == size * (size + 1) // 2).all()), f"torch allreduce {dt}")
    raises(tandem.InvalidArgument, "not contiguous", lambda: comm.allreduce(torch.zeros(4, 4).t()))

# Gradient sync: NumPy views of the buckets, hooks from several threads.
sync = tandem.GradientSync(comm, fusion_threshold=8192, first_bucket=4096, metric_slots=1)
ids = [sync.register(f"layer{i}.weight", 500 + 100 * i) for i in range(6)]
ext = np.zeros(300, dtype=np.float64)
ext_id = sync.register_external("head.bias", ext)
sync.finalize(timeout=60)
for step in range(3):
    for i in ids:
        sync.data(i)[:] = rank + i + step
    ext[:] = rank * 2.0
    threads = [threading.Thread(target=sync.mark_ready, args=(i,)) for i in reversed(ids + [ext_id])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sync.report_metrics([(rank + 1.0, 1.0)])
    sync.wait(timeout=60)
    for i in ids:
        check(np.all(sync.data(i) == (size - 1) / 2 + i + step), f"gradient sync step {step} id {i}")
    check(np.all(ext == size - 1), f"gradient sync external step {step}")
    check(sync.metrics() == [(size * (size + 1) / 2, float(size))], f"metrics {sync.metrics()}")
    check(sync.last_step()["communicated"], "last_step")
    sync.zero()
for i in ids[1:]:
    sync.mark_ready(i)
sync.mark_ready(ext_id)
raises(tandem.InvalidArgument, "layer0.weight", lambda: sync.wait(timeout=60))

# The table of operations: one method each, its parameters from the row; a Call run directly.
import inspect
rows = tandem._tandem.operations()
check([r["name"] for r in rows][:5] == ["allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"], "table order")
check(all(inspect.signature(getattr(tandem.Communicator, r["name"])).parameters for r in rows), "a method per row")
check(list(inspect.signature(tandem.Communicator.allreduce).parameters) ==
      ["self", "tensor", "op", "out", "timeout", "async_op"], "allreduce's parameters")
check(inspect.signature(tandem.Communicator.recv).parameters["peer"].default == tandem.ANY_SOURCE, "recv's default peer")
raises(TypeError, "missing a required argument: 'out'", lambda: comm.allgather(np.zeros(3)))
y = np.full(5, comm.rank + 1.0)
call = tandem._tandem.Call()
call.op, call.input, call.output = tandem._tandem.Op.allreduce, y.ctypes.data, y.ctypes.data
call.input_elements = call.output_elements = y.size
call.dtype = tandem._tandem.DataType.f64
check(comm._core.run(call) == -1 and (y == comm.size * (comm.size + 1) / 2).all(), "a Call run through the core")

# Errors: the classes and the C++ messages.
raises(tandem.InvalidArgument, "neither a NumPy array nor a torch tensor", lambda: comm.allreduce([1, 2, 3]))
raises(tandem.InvalidArgument, "complex128 is not supported", lambda: comm.allreduce(np.zeros(3, dtype=complex)))
raises(tandem.InvalidArgument, "op 'mean' is not one of", lambda: comm.allreduce(np.zeros(3), op="mean"))
raises(tandem.InvalidArgument, "output has 2 elements, not 3", lambda: comm.allreduce(np.zeros(3), out=np.zeros(2)))
check(issubclass(tandem.Timeout, tandem.Error) and issubclass(tandem.Error, RuntimeError), "exception hierarchy")
# Revoke: rank 0 revokes a duplicate; every rank's next call on it raises Revoked (an Aborted).
dup = comm.duplicate()
if comm.rank == 0:
    dup.revoke("checking revoke")
raises(tandem.Revoked, "rank 0 revoked the communicator: checking revoke", lambda: dup.barrier())
check(issubclass(tandem.Revoked, tandem.Aborted) and dup.aborted and dup.revoked, "revoked")
# Shrink: nobody failed, so every rank stays, in order, on a communicator that works.
survivors, members = dup.shrink()
check(members == list(range(comm.size)) and survivors.rank == comm.rank, "shrink kept every rank")
ones = np.ones(3)
survivors.allreduce(ones)
check((ones == comm.size).all(), "the shrunk communicator's all-reduce")
check(issubclass(tandem.Excluded, tandem.Revoked), "Excluded is a Revoked")
# Grow with nobody waiting to join: nothing changes.
grown, joined = survivors.grow()
check(grown is None and joined == 0 and not survivors.joined, "grow with nobody waiting")
check(survivors.joiners_waiting() == 0, "nobody waiting to join")
comm.abort("checks done")
raises(tandem.Aborted, "checks done", lambda: comm.allreduce(np.zeros(3)))
checks.passed()
