"""tandem: collective communication for data-parallel training.

Collectives work in place on NumPy arrays and on contiguous CPU torch tensors
(no copies: the C++ core reads and writes their memory). Errors are
tandem.Error subclasses carrying the C++ messages: InvalidArgument, Timeout,
PeerFailure, Aborted (and Revoked, an Aborted; Excluded, a Revoked). Timeouts are in seconds; None means the communicator's.

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
import ast
import inspect

from . import _tandem
from ._tandem import (ANY_SOURCE, UNDEFINED_COLOR, Aborted, Error, Excluded, InvalidArgument, PeerFailure, Request,
                      Revoked, Timeout)

__version__ = _tandem.__version__
__all__ = ["init", "Communicator", "GradientSync", "P2POp", "Request", "Error", "InvalidArgument", "Timeout",
           "PeerFailure", "Aborted", "Revoked", "Excluded", "ANY_SOURCE", "UNDEFINED_COLOR", "__version__"]

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
    """(counts, displacements) of one block per rank; displs None = packed (empty)."""
    if counts is None:
        raise InvalidArgument(f"{what}: counts are required (one per rank)")
    counts = [int(c) for c in counts]
    displs = None if displs is None else [int(d) for d in displs]
    if len(counts) != size or (displs is not None and len(displs) != size):
        raise InvalidArgument(f"{what}: {len(counts)} counts and {'no' if displs is None else len(displs)} "
                              f"displacements for {size} ranks: give one count (and displacement) per rank")
    if min(counts + (displs or []), default=0) < 0:
        raise InvalidArgument(f"{what}: counts and displacements must be >= 0")
    return counts, displs or []


def _message(i, op):
    """A P2POp as the core's (is_send, address, count, dtype, peer, tag)."""
    address, count, dtype = _buffer(op.tensor, f"group op {i} ({op.kind})")
    if op.kind == "recv":
        _writable(op.tensor, f"group op {i} (recv)")
    return op.kind == "send", address, count, dtype, op.peer, op.tag


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

    def _issue(self, row, args):
        """One operation of the table: its arguments as a core Call, started (async_op) or run."""
        name, params = row["name"], row["params"]
        tensor, out, async_op = args.get("tensor"), args.get("out"), args["async_op"]
        call = _tandem.Call()
        call.op, call.timeout = row["op"], args["timeout"]
        if "ops" in args:
            call.group = [_message(i, op) for i, op in enumerate(args["ops"])]
            keep = [op.tensor for op in args["ops"]]
        else:
            keep = (tensor, out)
        inp = res = None
        if row["input"] and tensor is not None:
            inp = _buffer(tensor, name)
        if row["output"]:
            target = out if "out" in params else tensor
            if target is None and row["output_defaults_to_input"]:
                target = tensor
            if target is not None:
                res = inp if target is tensor and inp else _buffer(target, f"{name} out" if target is out else name)
                _writable(target, name)
        if inp and res and inp[2] != res[2]:
            raise InvalidArgument(f"{name}: input is {inp[2].name} but output is {res[2].name}")
        if inp:
            call.input, call.input_elements, call.dtype = inp
        if res:
            call.output, call.output_elements, call.dtype = res
        if "op" in args:
            call.reduce = _op(args["op"])
        for field in ("root", "peer", "tag"):
            if field in args:
                setattr(call, field, args[field])
        if "send_counts" in args:
            call.send = _blocks(args["send_counts"], args["send_displs"], self.size, f"{name} send")
            call.recv = _blocks(args["recv_counts"], args["recv_displs"], self.size, f"{name} recv")
        elif args.get("counts") is not None:
            blocks = _blocks(args["counts"], args.get("displs"), self.size, name)
            if row["recv_blocks"]:
                call.recv = blocks
            else:
                call.send = blocks
        if async_op:
            return _Pending(self._core.start(call), *keep)
        source = self._core.run(call)
        if name == "recv":
            return source
        if not row["output"]:
            return None
        if "out" not in params or out is not None:
            return out if "out" in params else tensor
        return tensor if row["output_defaults_to_input"] else None

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

    def revoke(self, reason="revoke() called"):
        """abort() on every rank: their pending and later calls raise Revoked (within 200 ms)."""
        self._core.revoke(reason)

    revoked = property(lambda self: self._core.revoked)

    def shrink(self, exclude=(), timeout=None):
        """After a failure: revokes this communicator; the ranks still here agree on the members.
        Returns (their communicator, this one's ranks in its order); raises Excluded on a rank left out."""
        core, members = self._core.shrink(list(exclude), timeout)
        return Communicator(core), members

    def grow(self, max_new=None, timeout=None):
        """Every member: admits the processes waiting to join (started with TANDEM_JOIN=1), up to max_new.
        Returns (their communicator, how many joined), or (None, 0) when nobody waits; this one stays valid."""
        core, joined = self._core.grow(max_new, timeout)
        return (Communicator(core) if core is not None else None), joined

    def joiners_waiting(self, timeout=None):
        """How many processes wait to join: one store read on this rank alone (not collective).
        Share the answer (e.g. with the gradients) so that every member calls grow() at the same step."""
        return self._core.joiners_waiting(timeout)

    joined = property(lambda self: self._core.joined, doc="True in a communicator made by joining (TANDEM_JOIN=1)")


def _signature(params):
    """The Python signature of a table row's parameters ("tensor op='sum' out=None"), then timeout and async_op."""
    P = inspect.Parameter
    out = [P("self", P.POSITIONAL_OR_KEYWORD)]
    for spec in params.split():
        name, _, default = spec.partition("=")
        out.append(P(name, P.POSITIONAL_OR_KEYWORD, default=ast.literal_eval(default) if default else P.empty))
    out += [P("timeout", P.POSITIONAL_OR_KEYWORD, default=None), P("async_op", P.POSITIONAL_OR_KEYWORD, default=False)]
    return inspect.Signature(out)


def _operation(row):
    """Communicator.<name>: the table row's operation, with its parameters."""
    signature = _signature(row["params"])

    def method(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return self._issue(row, bound.arguments)

    method.__name__ = method.__qualname__ = row["name"]
    method.__signature__ = signature
    method.__doc__ = row["summary"] + " (async_op=True: a request to wait on)."
    return method


for _row in _tandem.operations():
    setattr(Communicator, _row["name"], _operation(_row))


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
