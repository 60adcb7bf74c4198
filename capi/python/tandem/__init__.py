"""tandem: collective communication for data-parallel training.

Collectives work in place on NumPy arrays and on contiguous CPU torch tensors
(no copies: the C++ core reads and writes their memory). Errors are
tandem.Error subclasses carrying the C++ messages: InvalidArgument, Timeout,
PeerFailure, Aborted. Timeouts are in seconds; None means the communicator's.

    import numpy as np, tandem
    comm = tandem.init()                  # under `tandem launch`, mpirun or srun
    x = np.full(1000, comm.rank + 1.0, dtype=np.float32)
    comm.allreduce(x)                     # in place, sum
    req = comm.allreduce(x, op="avg", async_op=True); req.wait(timeout=30)

Also: alltoall(v), reduce, gather(v), scatter(v), allgatherv, reduce_scatterv
(counts and displacements in elements, one per rank; displacements None =
packed in rank order), send/recv with tags and ANY_SOURCE, group([P2POp, ...]),
split(color, key) and duplicate().
"""
from . import _tandem
from ._tandem import ANY_SOURCE, UNDEFINED_COLOR, Aborted, Error, InvalidArgument, PeerFailure, Request, Timeout

__version__ = _tandem.__version__
__all__ = ["init", "Communicator", "GradientSync", "P2POp", "Request", "Error", "InvalidArgument", "Timeout",
           "PeerFailure", "Aborted", "ANY_SOURCE", "UNDEFINED_COLOR", "__version__"]

_OPS = {name: getattr(_tandem.ReduceOp, name) for name in ("sum", "avg", "min", "max", "prod")}
_NUMPY_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32", "int64": "i64", "uint8": "u8"}
_TORCH_DTYPES = {"torch.float32": "f32", "torch.float64": "f64", "torch.float16": "f16", "torch.bfloat16": "bf16",
                 "torch.int32": "i32", "torch.int64": "i64", "torch.uint8": "u8"}


def _buffer(x, what):
    """(address, element count, DataType) of a NumPy array or a torch tensor, used in place."""
    if hasattr(x, "data_ptr") and hasattr(x, "is_contiguous"):  # torch.Tensor
        if x.device.type != "cpu":
            raise InvalidArgument(f"{what}: tensor on {x.device}: tandem's Python binding takes CPU tensors")
        if not x.is_contiguous():
            raise InvalidArgument(f"{what}: tensor is not contiguous: call .contiguous() first")
        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise InvalidArgument(f"{what}: torch dtype {x.dtype} is not supported; use one of {sorted(_TORCH_DTYPES)}")
        return x.data_ptr(), x.numel(), getattr(_tandem.DataType, dtype)
    iface = getattr(x, "__array_interface__", None)
    if iface is None:
        raise InvalidArgument(f"{what}: {type(x).__name__} is neither a NumPy array nor a torch tensor")
    if not x.flags["C_CONTIGUOUS"]:
        raise InvalidArgument(f"{what}: array is not C-contiguous: use numpy.ascontiguousarray")
    dtype = _NUMPY_DTYPES.get(str(x.dtype))
    if dtype is None:
        raise InvalidArgument(f"{what}: NumPy dtype {x.dtype} is not supported; use one of {sorted(_NUMPY_DTYPES)}")
    return iface["data"][0], x.size, getattr(_tandem.DataType, dtype)


def _writable(x, what):
    if hasattr(x, "flags") and not x.flags["WRITEABLE"]:
        raise InvalidArgument(f"{what}: array is read-only")


def _op(op):
    if op not in _OPS:
        raise InvalidArgument(f"op '{op}' is not one of {sorted(_OPS)}")
    return _OPS[op]


def _blocks(counts, displs, size, what):
    """((counts, displacements), elements spanned) of one block per rank; displs None = packed."""
    if counts is None:
        raise InvalidArgument(f"{what}: counts are required (one per rank)")
    counts = [int(c) for c in counts]
    displs = None if displs is None else [int(d) for d in displs]
    if len(counts) != size or (displs is not None and len(displs) != size):
        raise InvalidArgument(f"{what}: {len(counts)} counts and {'no' if displs is None else len(displs)} "
                              f"displacements for {size} ranks: give one count (and displacement) per rank")
    if min(counts + (displs or []), default=0) < 0:
        raise InvalidArgument(f"{what}: counts and displacements must be >= 0")
    if displs is None:
        return (counts, []), sum(counts)
    return (counts, displs), max((c + d for c, d in zip(counts, displs) if c), default=0)


def _holds(buf, need, what):
    if buf[1] < need:
        raise InvalidArgument(f"{what} has {buf[1]} elements, the blocks span {need}")


class _Pending:
    """An async collective; keeps its buffers alive until it has finished."""

    def __init__(self, request, *buffers):
        self._request, self._buffers = request, buffers

    def test(self):
        return self._request.test()

    def wait(self, timeout=None):
        self._request.wait(timeout)

    @property
    def source(self):
        """The rank a finished receive came from (the sender for ANY_SOURCE); else -1."""
        return self._request.source


class P2POp:
    """One message of Communicator.group: P2POp("send" or "recv", tensor, peer, tag=0);
    a receive's peer may be ANY_SOURCE."""

    def __init__(self, kind, tensor, peer, tag=0):
        if kind not in ("send", "recv"):
            raise InvalidArgument(f"P2POp kind '{kind}' is not 'send' or 'recv'")
        self.kind, self.tensor, self.peer, self.tag = kind, tensor, peer, tag


class Communicator:
    """A group of ranks. Collectives run in issue order, the same on every rank."""

    def __init__(self, core):
        self._core = core

    rank = property(lambda self: self._core.rank)
    size = property(lambda self: self._core.size)
    transport = property(lambda self: self._core.transport)

    def _check_same(self, a, b, what):
        if a[2] != b[2]:
            raise InvalidArgument(f"{what}: input is {a[2].name} but output is {b[2].name}")

    def allreduce(self, tensor, op="sum", out=None, timeout=None, async_op=False):
        """Reduces over ranks into `out` (default: in place)."""
        inp = _buffer(tensor, "allreduce")
        res = inp if out is None else _buffer(out, "allreduce out")
        _writable(tensor if out is None else out, "allreduce")
        self._check_same(inp, res, "allreduce")
        if res[1] != inp[1]:
            raise InvalidArgument(f"allreduce: out has {res[1]} elements, input {inp[1]}")
        args = (inp[0], res[0], inp[1], inp[2], _op(op), timeout)
        if async_op:
            return _Pending(self._core._allreduce_async(*args), tensor, out)
        self._core._allreduce(*args)
        return tensor if out is None else out

    def reduce_scatter(self, tensor, out, op="sum", timeout=None, async_op=False):
        """tensor: size * n elements (block r for rank r); out: n elements, this rank's reduced block."""
        inp, res = _buffer(tensor, "reduce_scatter"), _buffer(out, "reduce_scatter out")
        self._check_same(inp, res, "reduce_scatter")
        if inp[1] != res[1] * self.size:
            raise InvalidArgument(f"reduce_scatter: input has {inp[1]} elements, not size ({self.size}) x out ({res[1]})")
        args = (inp[0], res[0], res[1], inp[2], _op(op), timeout)
        if async_op:
            return _Pending(self._core._reduce_scatter_async(*args), tensor, out)
        self._core._reduce_scatter(*args)
        return out

    def allgather(self, tensor, out, timeout=None, async_op=False):
        """tensor: n elements; out: size * n elements in rank order."""
        inp, res = _buffer(tensor, "allgather"), _buffer(out, "allgather out")
        self._check_same(inp, res, "allgather")
        if res[1] != inp[1] * self.size:
            raise InvalidArgument(f"allgather: out has {res[1]} elements, not size ({self.size}) x input ({inp[1]})")
        args = (inp[0], res[0], inp[1], inp[2], timeout)
        if async_op:
            return _Pending(self._core._allgather_async(*args), tensor, out)
        self._core._allgather(*args)
        return out

    def broadcast(self, tensor, root=0, timeout=None, async_op=False):
        """root's tensor reaches every rank's, in place."""
        buf = _buffer(tensor, "broadcast")
        args = (buf[0], buf[0], buf[1], buf[2], root, timeout)
        if async_op:
            return _Pending(self._core._broadcast_async(*args), tensor)
        self._core._broadcast(*args)
        return tensor

    def barrier(self, timeout=None, async_op=False):
        if async_op:
            return _Pending(self._core.barrier_async(timeout))
        self._core.barrier(timeout)

    # ---- all-to-all, rooted and variable-size collectives, point-to-point, split ----

    def _run(self, name, async_op, buffers, *args, result=None):
        """The core's _<name>_async (the request keeps the buffers alive), or _<name>: then `result`, if given,
        else what it returned."""
        if async_op:
            return _Pending(getattr(self._core, f"_{name}_async")(*args), *buffers)
        value = getattr(self._core, f"_{name}")(*args)
        return value if result is None else result

    def _pair(self, tensor, out, what, need_in=True, need_out=True):
        """Buffers (address, count, dtype) of input and output; a missing one is (0, 0, the other's dtype)."""
        inp = _buffer(tensor, what) if tensor is not None or need_in else None
        res = _buffer(out, f"{what} out") if out is not None or need_out else None
        if out is not None:
            _writable(out, what)
        if inp and res:
            self._check_same(inp, res, what)
        return inp or (0, 0, res[2]), res or (0, 0, inp[2])

    def alltoall(self, tensor, out, timeout=None, async_op=False):
        """tensor and out: size blocks of n elements; block p of tensor goes to rank p, block p of out comes from it."""
        inp, res = self._pair(tensor, out, "alltoall")
        if inp[1] != res[1] or inp[1] % self.size:
            raise InvalidArgument(f"alltoall: input ({inp[1]}) and out ({res[1]}) must hold size ({self.size}) "
                                  "equal blocks")
        return self._run("alltoall", async_op, (tensor, out), inp[0], res[0], inp[1] // self.size, inp[2], timeout,
                         result=out)

    def alltoallv(self, tensor, out, send_counts, recv_counts, send_displs=None, recv_displs=None, timeout=None,
                  async_op=False):
        """send_counts[p] elements at send_displs[p] go to rank p; recv_counts[p] from p land at recv_displs[p]."""
        inp, res = self._pair(tensor, out, "alltoallv")
        send, send_span = _blocks(send_counts, send_displs, self.size, "alltoallv send")
        recv, recv_span = _blocks(recv_counts, recv_displs, self.size, "alltoallv recv")
        _holds(inp, send_span, "alltoallv: input")
        _holds(res, recv_span, "alltoallv: out")
        return self._run("alltoallv", async_op, (tensor, out), inp[0], send, res[0], recv, inp[2], timeout, result=out)

    def reduce(self, tensor, root=0, op="sum", out=None, timeout=None, async_op=False):
        """Every rank's tensor reduced into root's `out` (default: root's tensor, in place); others keep theirs."""
        inp, res = self._pair(tensor, out, "reduce", need_out=False)
        if out is None:
            _writable(tensor, "reduce")
            res = inp
        elif res[1] != inp[1]:
            raise InvalidArgument(f"reduce: out has {res[1]} elements, input {inp[1]}")
        return self._run("reduce", async_op, (tensor, out), inp[0], res[0], inp[1], inp[2], _op(op), root, timeout,
                         result=tensor if out is None else out)

    def gather(self, tensor, out=None, root=0, timeout=None, async_op=False):
        """Every rank's n elements into root's out (size * n, rank order; None elsewhere)."""
        inp, res = self._pair(tensor, out, "gather", need_out=self.rank == root)
        if self.rank == root and res[1] != inp[1] * self.size:
            raise InvalidArgument(f"gather: out has {res[1]} elements, not size ({self.size}) x input ({inp[1]})")
        return self._run("gather", async_op, (tensor, out), inp[0], res[0], inp[1], inp[2], root, timeout, result=out)

    def gatherv(self, tensor, out=None, counts=None, displs=None, root=0, timeout=None, async_op=False):
        """Rank r's tensor lands in root's out at displs[r]; out, counts, displs matter on the root only."""
        inp, res = self._pair(tensor, out, "gatherv", need_out=self.rank == root)
        blocks = ([], [])
        if self.rank == root:
            blocks, span = _blocks(counts, displs, self.size, "gatherv")
            _holds(res, span, "gatherv: out")
        return self._run("gatherv", async_op, (tensor, out), inp[0], inp[1], res[0], blocks, inp[2], root, timeout,
                         result=out)

    def scatter(self, tensor, out, root=0, timeout=None, async_op=False):
        """Root's block r of tensor (size * n elements; None elsewhere) reaches rank r's out (n elements)."""
        inp, res = self._pair(tensor, out, "scatter", need_in=self.rank == root)
        if self.rank == root and inp[1] != res[1] * self.size:
            raise InvalidArgument(f"scatter: input has {inp[1]} elements, not size ({self.size}) x out ({res[1]})")
        return self._run("scatter", async_op, (tensor, out), inp[0], res[0], res[1], res[2], root, timeout, result=out)

    def scatterv(self, tensor, out, counts=None, displs=None, root=0, timeout=None, async_op=False):
        """Root's counts[r] elements at displs[r] reach rank r's out; tensor, counts, displs matter on the root only."""
        inp, res = self._pair(tensor, out, "scatterv", need_in=self.rank == root)
        blocks = ([], [])
        if self.rank == root:
            blocks, span = _blocks(counts, displs, self.size, "scatterv")
            _holds(inp, span, "scatterv: input")
        return self._run("scatterv", async_op, (tensor, out), inp[0], blocks, res[0], res[1], res[2], root, timeout,
                         result=out)

    def allgatherv(self, tensor, out, counts, displs=None, timeout=None, async_op=False):
        """Rank r's tensor (counts[r] elements) lands in every rank's out at displs[r]."""
        inp, res = self._pair(tensor, out, "allgatherv")
        blocks, span = _blocks(counts, displs, self.size, "allgatherv")
        _holds(res, span, "allgatherv: out")
        return self._run("allgatherv", async_op, (tensor, out), inp[0], inp[1], res[0], blocks, inp[2], timeout,
                         result=out)

    def reduce_scatterv(self, tensor, out, counts, displs=None, op="sum", timeout=None, async_op=False):
        """tensor holds every rank's block (counts[r] at displs[r]); out receives this rank's, reduced."""
        inp, res = self._pair(tensor, out, "reduce_scatterv")
        blocks, span = _blocks(counts, displs, self.size, "reduce_scatterv")
        _holds(inp, span, "reduce_scatterv: input")
        _holds(res, blocks[0][self.rank], "reduce_scatterv: out")
        return self._run("reduce_scatterv", async_op, (tensor, out), inp[0], res[0], blocks, inp[2], _op(op),
                         timeout, result=out)

    def send(self, tensor, peer, tag=0, timeout=None, async_op=False):
        """tensor to rank peer under tag (0 .. 2**31-1); only the two ranks take part."""
        buf = _buffer(tensor, "send")
        return self._run("send", async_op, (tensor,), buf[0], buf[1], buf[2], peer, tag, timeout)

    def recv(self, tensor, peer=ANY_SOURCE, tag=0, timeout=None, async_op=False):
        """Into tensor (its size must match the message's) from peer or ANY_SOURCE; returns the source
        (async: the request's .source once finished)."""
        buf = _buffer(tensor, "recv")
        _writable(tensor, "recv")
        return self._run("recv", async_op, (tensor,), buf[0], buf[1], buf[2], peer, tag, timeout)

    def group(self, ops, timeout=None, async_op=False):
        """Every P2POp of ops posted at once (torch's batch_isend_irecv, NCCL's group calls)."""
        specs = []
        for i, op in enumerate(ops):
            address, count, dtype = _buffer(op.tensor, f"group op {i} ({op.kind})")
            if op.kind == "recv":
                _writable(op.tensor, f"group op {i} (recv)")
            specs.append((op.kind == "send", address, count, dtype, op.peer, op.tag))
        return self._run("group", async_op, [op.tensor for op in ops], specs, timeout)

    def split(self, color, key=None, timeout=None):
        """Collective: ranks of one colour form a new Communicator ordered by (key, rank; key None = rank);
        UNDEFINED_COLOR joins none and gets None."""
        core = self._core.split(color, self.rank if key is None else key, timeout)
        return None if core is None else Communicator(core)

    def duplicate(self, timeout=None):
        """Collective: the same ranks, a communicator of their own."""
        return Communicator(self._core.duplicate(timeout))

    def allocate_shared(self, shape, dtype="float32"):
        """A zero-filled NumPy array other ranks on this host can map: collectives read it in place.
        Valid while the communicator lives (the array keeps it alive)."""
        import numpy as np
        dt = np.dtype(dtype)
        count = int(np.prod(shape))
        address = self._core._allocate_shared(max(1, count) * dt.itemsize)
        return _view(address, shape, dt, owner=self)

    def abort(self, reason="abort() called"):
        self._core.abort(reason)

    aborted = property(lambda self: self._core.aborted)


def _view(address, shape, dtype, owner):
    """A NumPy array over memory tandem owns; `owner` stays referenced by the array."""
    import numpy as np

    class _Memory:
        def __init__(self):
            self.owner = owner
            self.__array_interface__ = {"data": (address, False), "shape": tuple(np.atleast_1d(shape)) if shape != () else (),
                                        "typestr": np.dtype(dtype).str, "version": 3}

    return np.asarray(_Memory())


class GradientSync:
    """Gradients reduced in fused buckets while backward runs.

    Register every gradient in model order, finalize() (collective), then per
    step: write each gradient into data(id) (or a registered external array),
    mark_ready(id) as backward produces it, wait() before the optimizer step.
    """

    def __init__(self, comm, fusion_threshold=25 << 20, first_bucket=1 << 20, average=True,
                 aggregation_frequency=1, average_aggregated_gradients=True, allow_unused=False, metric_slots=0):
        self._comm = comm
        self._core = _tandem._GradientSync(comm._core, fusion_threshold, first_bucket, average, aggregation_frequency,
                                           average_aggregated_gradients, allow_unused, metric_slots)
        self._specs, self._external = [], []

    def register(self, name, count, dtype="float32"):
        import numpy as np
        dt = np.dtype(dtype)
        code = _NUMPY_DTYPES.get(str(dt))
        if code is None:
            raise InvalidArgument(f"register '{name}': dtype {dt} is not supported")
        self._specs.append((count, dt))
        return self._core.register(name, count, getattr(_tandem.DataType, code))

    def register_external(self, name, array):
        """The gradient stays in `array` (NumPy or torch, contiguous); copied into its bucket and back."""
        address, count, dtype = _buffer(array, f"register_external '{name}'")
        self._specs.append((count, None))
        self._external.append(array)
        return self._core.register_external(name, address, count, dtype)

    def finalize(self, timeout=None):
        self._core.finalize(timeout)

    def data(self, gradient_id):
        """The gradient's storage inside its bucket, as a NumPy array (no copy)."""
        count, dt = self._specs[gradient_id]
        if dt is None:
            raise InvalidArgument(f"gradient {gradient_id} is external: its storage is the array registered")
        return _view(self._core._data(gradient_id), (count,), dt, owner=self)

    def mark_ready(self, gradient_id):
        self._core.mark_ready(gradient_id)

    def report_metrics(self, metrics):
        self._core.report_metrics([(float(s), float(c)) for s, c in metrics])

    def metrics(self):
        return self._core.metrics()

    def wait(self, timeout=None):
        self._core.wait(timeout)

    def zero(self):
        self._core.zero()

    def last_step(self):
        return self._core.last_step()


def init(**kwargs):
    """A communicator: from the environment (tandem launch, mpirun, srun), or
    Communicator.create(rank=, size=, store="host:port", host_store=, timeout=, shared_memory=, prefix=)."""
    core = _tandem.Communicator.create(**kwargs) if kwargs else _tandem.Communicator.from_env()
    return Communicator(core)
