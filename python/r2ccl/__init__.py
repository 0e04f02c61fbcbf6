"""r2ccl from Python: resilient multi-NIC collectives on host buffers and torch tensors.

A :class:`Communicator` joins the ranks of a job (from a unique id rank 0 created with
:class:`Root`, or from the launcher's environment) and runs collectives on any C-contiguous
object with the buffer protocol (``numpy`` arrays, ``bytearray``, ``array.array``) or a CPU
torch tensor. Every call can run asynchronously (``async_op=True`` returns a :class:`Work`);
the GIL is released while a call runs. Errors are the exception classes below, all subclasses
of :class:`R2cclError`. ``import r2ccl.torch`` registers the ``"r2ccl"`` backend of
``torch.distributed``.

Example, two ranks (run the same code with rank 0 and 1 in two processes; rank 0 creates the
root and gives ``uid`` to rank 1)::

    import numpy as np, r2ccl
    root = r2ccl.Root.create("127.0.0.1")          # rank 0 only
    uid = root.unique_id()                          # hand this to every rank (it holds the secret)
    comm = r2ccl.Communicator(0, 2, uid, nics=["lo", "lo"], root=root)
    x = np.ones(1024, dtype=np.float32)
    comm.all_reduce(x)                              # in place: x == 2.0 everywhere
    comm.finalize()
"""

from __future__ import annotations

import ctypes
from typing import Any, List, Optional, Sequence, Tuple

from ._load import load_ucx as _load_ucx

_load_ucx()

from . import _r2ccl  # noqa: E402
from ._buffers import Buffer, as_buffer  # noqa: E402,F401 - as_buffer: for tests and bindings
from ._r2ccl import (  # noqa: E402
    AbortedError,
    BootstrapError,
    CollectiveFailedError,
    CollectiveTimeoutError,
    CollReport,
    DeviceError,
    InvalidArgumentError,
    MismatchError,
    NodeIsolatedError,
    NoCommonRailError,
    NoPathLeftError,
    PeerLostError,
    R2cclError,
    Root,
    TransportError,
    install_prometheus,
)

__all__ = [
    "AbortedError",
    "BootstrapError",
    "CollReport",
    "CollectiveFailedError",
    "CollectiveTimeoutError",
    "Communicator",
    "DeviceError",
    "InvalidArgumentError",
    "MismatchError",
    "NoCommonRailError",
    "NoPathLeftError",
    "NodeIsolatedError",
    "PeerLostError",
    "R2cclError",
    "Root",
    "TransportError",
    "Work",
    "install_prometheus",
]

__version__ = _r2ccl.version()

REDUCE_OPS = ("sum", "prod", "min", "max", "avg")


class Work:
    """A started call: :meth:`wait` returns its :class:`CollReport` or raises its error.

    It keeps the buffers of the call alive until the call is done, and runs the call's
    finishing step (copies out of staging buffers) once, on the first :meth:`wait`.
    """

    def __init__(self, inner: Any, keep: Sequence[Any] = (), post: Any = None) -> None:
        self._inner = inner
        self._keep = list(keep)
        self._post = post
        self._report: Optional[CollReport] = None
        self._error: Optional[BaseException] = None
        self._done = False
        import threading

        self._lock = threading.Lock()

    def wait(self) -> CollReport:
        """Wait for the call; its report. Raises the call's error (every time it is asked)."""
        with self._lock:
            if not self._done:
                try:
                    self._report = self._inner.wait()
                    if self._post is not None:
                        self._post()
                except BaseException as e:  # noqa: BLE001 - re-raised below, every time
                    self._error = e
                finally:
                    self._done = True
                    self._keep = []
                    self._post = None
        if self._error is not None:
            raise self._error
        assert self._report is not None
        return self._report

    def is_done(self) -> bool:
        """Whether the call has finished and its results are in place (then :meth:`wait` does
        not block)."""
        if self._done:
            return True
        if not self._inner.is_done():
            return False
        if self._post is not None:
            try:
                self.wait()  # done: runs the finishing step without blocking
            except BaseException:  # noqa: BLE001 - wait() raises it again
                pass
        return True


def _check_op(op: str) -> str:
    if op not in REDUCE_OPS:
        raise ValueError(f"reduce op {op!r}: r2ccl has {', '.join(REDUCE_OPS)}")
    return op


class Communicator:
    """One rank's communicator (see the module documentation).

    ``node`` names this rank's server (ranks with the same name share its NICs; default: the
    host name), ``nics`` its data NICs in rail order (default: ``R2CCL_NICS``, the topology
    file, or the discovered NICs). ``fault_injection_from_env`` reads ``R2CCL_FAULT`` (tests).
    """

    def __init__(
        self,
        rank: int,
        world: int,
        unique_id: str,
        *,
        node: Optional[str] = None,
        nics: Optional[Sequence[str]] = None,
        root: Optional[Root] = None,
        fault_injection_from_env: bool = False,
        _inner: Any = None,
    ) -> None:
        if _inner is None:
            _inner = _r2ccl.Communicator(
                rank, world, unique_id, node, list(nics) if nics is not None else None, root, fault_injection_from_env
            )
        self._c = _inner

    @classmethod
    def from_env(cls) -> "Communicator":
        """A communicator from the launcher's environment (``R2CCL_UNIQUE_ID``, ``R2CCL_*``,
        OpenMPI, Slurm, torchrun)."""
        return cls(0, 0, "", _inner=_r2ccl.Communicator.from_env())

    @property
    def rank(self) -> int:
        """This rank."""
        return self._c.rank

    @property
    def world(self) -> int:
        """The number of ranks."""
        return self._c.world

    @property
    def collective_timeout(self) -> float:
        """The default deadline of a call, in seconds."""
        return self._c.collective_timeout

    def _run(self, coll: str, send: Buffer, recv: Buffer, count: int, op: str, root: int, async_op: bool,
             timeout: Optional[float], keep: Sequence[Any]) -> Any:
        if send.dtype != recv.dtype:
            raise InvalidArgumentError(f"send holds {send.dtype} elements, recv {recv.dtype}")
        # The extension holds the owners until the call is done, even if this Work is dropped.
        owners = [send, recv, *keep]
        inner = self._c.start(coll, send.dtype, count, send.addr, send.nbytes, recv.addr, recv.nbytes, owners, op,
                              root, timeout)
        w = Work(inner, keep=owners)
        return w if async_op else w.wait()

    def _pair(self, send: Any, recv: Any) -> Tuple[Buffer, Buffer]:
        s = as_buffer(send, writable=recv is None)
        r = s if recv is None else as_buffer(recv, writable=True)
        return s, r

    def all_reduce(self, send: Any, recv: Any = None, op: str = "sum", *, async_op: bool = False,
                   timeout: Optional[float] = None) -> Any:
        """Every rank gets the reduction of every rank's ``send`` (in place when ``recv`` is None)."""
        s, r = self._pair(send, recv)
        if r.count != s.count:
            raise InvalidArgumentError(f"all_reduce: send has {s.count} elements, recv {r.count}")
        return self._run("all_reduce", s, r, s.count, _check_op(op), 0, async_op, timeout, ())

    def reduce(self, send: Any, recv: Any = None, op: str = "sum", root: int = 0, *, async_op: bool = False,
               timeout: Optional[float] = None) -> Any:
        """Rank ``root`` gets the reduction in ``recv`` (``send`` when None); other ranks' buffers
        are left as they were."""
        s, r = self._pair(send, recv)
        if r.count != s.count:
            raise InvalidArgumentError(f"reduce: send has {s.count} elements, recv {r.count}")
        keep: List[Any] = []
        if self.rank != root:
            scratch = bytearray(s.nbytes)  # the non-roots' output is scratch: theirs stays
            r = as_buffer(scratch, writable=True, dtype=s.dtype)
            keep.append(scratch)
        return self._run("reduce", s, r, s.count, _check_op(op), root, async_op, timeout, keep)

    def broadcast(self, buf: Any, root: int = 0, *, async_op: bool = False, timeout: Optional[float] = None) -> Any:
        """Every rank's ``buf`` gets rank ``root``'s."""
        b = as_buffer(buf, writable=True)
        return self._run("broadcast", b, b, b.count, "sum", root, async_op, timeout, ())

    def all_gather(self, send: Any, recv: Any, *, async_op: bool = False, timeout: Optional[float] = None) -> Any:
        """``recv`` (world times ``send``'s size) gets every rank's ``send`` in rank order."""
        s, r = self._pair(send, recv)
        if r.count != s.count * self.world:
            raise InvalidArgumentError(f"all_gather: recv needs {s.count * self.world} elements, has {r.count}")
        return self._run("all_gather", s, r, s.count, "sum", 0, async_op, timeout, ())

    def reduce_scatter(self, send: Any, recv: Any, op: str = "sum", *, async_op: bool = False,
                       timeout: Optional[float] = None) -> Any:
        """Rank j's ``recv`` gets block j of the reduction of every rank's ``send``."""
        s, r = self._pair(send, recv)
        if s.count != r.count * self.world:
            raise InvalidArgumentError(f"reduce_scatter: send needs {r.count * self.world} elements, has {s.count}")
        return self._run("reduce_scatter", s, r, r.count, _check_op(op), 0, async_op, timeout, ())

    def all_to_all(self, send: Any, recv: Any, *, async_op: bool = False, timeout: Optional[float] = None) -> Any:
        """Rank j's block i of ``recv`` is rank i's block j of ``send`` (equal blocks)."""
        s, r = self._pair(send, recv)
        if s.count != r.count or s.count % self.world:
            raise InvalidArgumentError(f"all_to_all: {s.count} and {r.count} elements over {self.world} ranks")
        return self._run("all_to_all", s, r, s.count // self.world, "sum", 0, async_op, timeout, ())

    def group(self, ops: Sequence[Tuple[str, Any, int]], *, async_op: bool = False,
              timeout: Optional[float] = None) -> Any:
        """Run sends and receives at once: ``ops`` lists ``("send", buf, peer)`` and
        ``("recv", buf, peer)``. Every rank calls it at the same point (a rank with nothing to
        do passes ``[]``); the k-th send from A to B pairs with B's k-th receive from A."""
        raw = []
        keep = []
        dtype = None
        for kind, obj, peer in ops:
            if kind not in ("send", "recv"):
                raise ValueError(f"group operation {kind!r}: 'send' or 'recv'")
            b = as_buffer(obj, writable=kind == "recv")
            if dtype is not None and b.dtype != dtype:
                raise InvalidArgumentError(f"a group of {dtype} cannot also move {b.dtype}")
            dtype = b.dtype
            raw.append((kind == "send", int(peer), b.addr, b.nbytes))
            keep.append(b)
        w = Work(self._c.start_group(dtype or "u8", raw, keep, timeout), keep=keep)
        return w if async_op else w.wait()

    def failed_nics(self) -> List[Tuple[int, int]]:
        """The NICs every rank agreed are failed, as ``(node, rail)``."""
        return self._c.failed_nics()

    def take_events(self) -> List[Tuple[int, str]]:
        """Failover and health events since the last call, as ``(milliseconds, text)``."""
        return self._c.take_events()

    def nodes(self) -> List[int]:
        """The node of every rank, by rank."""
        return self._c.nodes()

    def alloc(self, nbytes: int) -> memoryview:
        """``nbytes`` zeroed bytes registered with every NIC of this rank (NCCL's
        ``ncclMemAlloc``), as a writable byte ``memoryview``: make arrays or tensors over it
        (``numpy.frombuffer``, ``torch.frombuffer``). A call whose buffers each start at such
        memory of this communicator, and fit in it, reads and writes it where it is, with no copy
        into the library or out of it; any other memory is copied. The memory is freed when the
        last object over it goes."""
        reg = self._c.alloc(nbytes)
        arr = (ctypes.c_char * nbytes).from_address(reg.addr)
        # The array, and so every view and tensor made over it, keeps the registration alive.
        arr._r2ccl_registration = reg
        return memoryview(arr).cast("B")

    def check_async_error(self) -> None:
        """Raise the communicator's asynchronous error (a lost peer, an abort), if any."""
        self._c.check_async_error()

    def abort(self, reason: str = "aborted from Python") -> None:
        """Every rank's running and future calls fail; never blocks."""
        self._c.abort(reason)

    def finalize(self) -> None:
        """Leave gracefully once every started call is done."""
        self._c.finalize()

    def destroy(self) -> None:
        """Leave at once; unfinished calls fail with :class:`AbortedError`."""
        self._c.destroy()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.finalize()
        else:
            self.destroy()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, world={self.world})"
