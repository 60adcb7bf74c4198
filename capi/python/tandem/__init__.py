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
"""
from . import _tandem
from ._tandem import Aborted, Error, InvalidArgument, PeerFailure, Request, Timeout

__version__ = _tandem.__version__
__all__ = ["init", "Communicator", "GradientSync", "Request", "Error", "InvalidArgument", "Timeout",
           "PeerFailure", "Aborted", "__version__"]

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


class _Pending:
    """An async collective; keeps its buffers alive until it has finished."""

    def __init__(self, request, *buffers):
        self._request, self._buffers = request, buffers

    def test(self):
        return self._request.test()

    def wait(self, timeout=None):
        self._request.wait(timeout)


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
