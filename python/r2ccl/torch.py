"""The ``"r2ccl"`` backend of ``torch.distributed``: ``import r2ccl.torch`` registers it.

``torch.distributed.init_process_group("r2ccl")`` then works under ``torchrun`` and with an
explicit store. Bootstrap goes through the c10d store torch hands the backend: rank 0 of each
group binds a rendezvous (on ``R2CCL_ROOT_IP``, else the address that routes to
``MASTER_ADDR``, else loopback) and publishes its unique id, which holds a fresh random
secret, under the group's prefix; the others read it. A group's communicator is created on its
first call, so ``new_group`` costs nothing until a group is used. Point-to-point ``send`` and
``recv`` run on a communicator per direction, created on first use by a worker thread of its
own, so that any order of ``isend``/``irecv`` between two ranks is served (messages between a
pair match in order, as with NCCL; tags are ignored).

CPU tensors of every dtype torch and r2ccl share (float32/64, float16, bfloat16, int8, uint8,
int32, int64, uint32, uint64, bool), on the CPU or on a CUDA device (enqueued on torch's current
stream); other dtypes and devices raise ``TypeError``.
Reductions: SUM, PRODUCT, MIN, MAX, AVG, PREMUL_SUM (bool: SUM is OR, PRODUCT is AND).
Node and NICs come from ``R2CCL_NODE`` and ``R2CCL_NICS`` (or the topology file / discovery),
the rest of the configuration from ``R2CCL_*`` as for Rust programs. ``R2CCL_TEST_FAULT_INJECTION=1``
makes the communicators read ``R2CCL_FAULT`` (for tests only).
"""

from __future__ import annotations

import atexit
import datetime
import os
import queue
import socket
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

import r2ccl
from r2ccl._buffers import as_buffer, torch_dtype_name

__all__ = ["R2cclBackend", "create_backend", "get_backend"]

_R = dist.ReduceOp.RedOpType
_OPS = {_R.SUM: "sum", _R.PRODUCT: "prod", _R.MIN: "min", _R.MAX: "max", _R.AVG: "avg"}
_BOOL_OPS = {_R.SUM: "max", _R.PRODUCT: "min", _R.MIN: "min", _R.MAX: "max"}


def _root_ip() -> str:
    """The address rank 0 binds its rendezvous on."""
    ip = os.environ.get("R2CCL_ROOT_IP")
    if ip:
        return ip
    master = os.environ.get("MASTER_ADDR")
    if master and master not in ("localhost", "127.0.0.1", "::1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
                return s.getsockname()[0]
        except OSError:
            pass
    return "127.0.0.1"


def _join(store: Any, key: str, rank: int, size: int, timeout: Optional[float]) -> r2ccl.Communicator:
    """Create (rank 0) or join (the others) the communicator published under ``key``; the
    others wait for it at most ``timeout`` seconds (the group's timeout; 30 min without one)."""
    faults = os.environ.get("R2CCL_TEST_FAULT_INJECTION") == "1"
    if rank == 0:
        root = r2ccl.Root.create(_root_ip())
        store.set(key, root.unique_id())
        return r2ccl.Communicator(0, size, root.unique_id(), root=root, fault_injection_from_env=faults)
    store.wait([key], datetime.timedelta(seconds=timeout or 1800))
    uid = store.get(key).decode()
    return r2ccl.Communicator(rank, size, uid, fault_injection_from_env=faults)


def _one(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"r2ccl: one tensor per call, got {len(tensors)}")
    return tensors[0]


def _dtype(t: torch.Tensor) -> str:
    name = torch_dtype_name(t)
    if name is None:
        raise TypeError(f"r2ccl: dtype {t.dtype} is not supported (r2ccl has float32, float64, float16, "
                        "bfloat16, int8, uint8, int32, int64, uint32, uint64 and bool)")
    if t.device.type not in ("cpu", "cuda"):
        raise TypeError(f"r2ccl: a {t.device.type} tensor; r2ccl takes CPU and CUDA tensors")
    return name


def _op(reduce_op: Any, t: torch.Tensor) -> tuple:
    """(r2ccl op name, pre-multiplication factor or None) for a c10d ReduceOp."""
    kind = getattr(reduce_op, "op", reduce_op)
    if kind == _R.PREMUL_SUM:
        if t.dtype == torch.bool:
            raise TypeError("r2ccl: PREMUL_SUM on bool tensors")
        return "sum", reduce_op.factor
    table = _BOOL_OPS if t.dtype == torch.bool else _OPS
    if kind not in table:
        raise ValueError(f"r2ccl: reduce op {kind} is not supported for {t.dtype}")
    return table[kind], None


class _Work(dist._Work):
    """A torch ``Work`` over ``finish`` (blocks until the call is done, raises its error)."""

    def __init__(self, backend: "R2cclBackend", finish: Callable[[], Any], result: List[torch.Tensor],
                 is_done: Callable[[], bool]) -> None:
        super().__init__()
        self._backend = backend
        self._finish = finish
        self._result_list = result
        self._is_done = is_done
        self._state_lock = threading.Lock()
        self._completed = False
        self._error: Optional[BaseException] = None

    def _complete(self) -> None:
        with self._state_lock:
            if not self._completed:
                try:
                    self._finish()
                except BaseException as e:  # noqa: BLE001 - kept and raised to every waiter
                    self._error = e
                self._completed = True
        if self._error is not None:
            raise self._error

    def wait(self, timeout: Any = None) -> bool:
        # torch passes a timedelta; zero means none (the call's own deadline still applies).
        secs = timeout.total_seconds() if hasattr(timeout, "total_seconds") else float(timeout or 0)
        if secs > 0 and not self._completed:
            deadline = time.monotonic() + secs
            while not self._is_done():
                if time.monotonic() > deadline:
                    raise r2ccl.CollectiveTimeoutError(f"r2ccl: the work was not done within {secs} s")
                time.sleep(0.0005)
        self._complete()
        return True

    def is_completed(self) -> bool:
        if not self._completed and self._is_done():
            try:
                self._complete()
            except BaseException:  # noqa: BLE001 - wait() raises it
                pass
        return self._completed

    def is_success(self) -> bool:
        return self._completed and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def result(self) -> List[torch.Tensor]:
        return self._result_list

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
        if self._completed:
            if self._error is None:
                fut.set_result(self._result_list)
            else:
                fut.set_exception(self._error)
        else:
            self._backend._complete_later(self, fut)
        return fut


class _Direction:
    """Sends from one rank to another on a two-rank communicator of their own, created on
    first use and run in order by a worker thread (so no ``isend``/``irecv`` order between two
    ranks can deadlock their creation)."""

    def __init__(self, backend: "R2cclBackend", src: int, dst: int) -> None:
        self._backend = backend
        self._src, self._dst = src, dst
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._comm: Optional[r2ccl.Communicator] = None
        self._aborted = False
        self._thread = threading.Thread(target=self._run, name=f"r2ccl-p2p-{src}-{dst}", daemon=True)
        self._thread.start()

    def submit(self, t: torch.Tensor) -> "_Work":
        done = threading.Event()
        box: List[Optional[BaseException]] = [None]
        cancelled = [False]
        self._queue.put((t, done, box, cancelled))

        # The worker ends each item by the store's, the bootstrap's and the call's deadlines;
        # this bound only guards against a worker that died or a queue that never drains.
        limit = 2 * (self._backend._timeout or 1800) + 120

        def finish() -> None:
            if not done.wait(limit):
                cancelled[0] = True  # the worker skips it if it has not started it yet
                raise r2ccl.CollectiveTimeoutError(f"point-to-point {self._src}->{self._dst}: no answer in {limit} s")
            if box[0] is not None:
                raise box[0]

        return _Work(self._backend, finish, [t], done.is_set)

    def _run(self) -> None:
        b = self._backend
        me = b._rank_in_group
        while True:
            item = self._queue.get()
            if item is None:
                comm, self._comm = self._comm, None
                if comm is not None:
                    comm.destroy()
                return
            t, done, box, cancelled = item
            try:
                if self._aborted:
                    raise r2ccl.AbortedError(f"point-to-point {self._src}->{self._dst}: the group was aborted")
                if cancelled[0]:
                    raise r2ccl.CollectiveTimeoutError("timed out in the queue")
                if self._comm is None:
                    key = f"r2ccl/p2p/{self._src}/{self._dst}"
                    self._comm = _join(b._store, key, int(me == self._dst), 2, b._timeout)
                if me == self._src:
                    self._comm.group([("send", t, 1)], timeout=b._timeout)
                else:
                    self._comm.group([("recv", t, 0)], timeout=b._timeout)
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                box[0] = e
            done.set()

    def abort(self) -> None:
        """Fail what is queued and what runs (its communicator is destroyed)."""
        self._aborted = True
        comm = self._comm
        if comm is not None:
            comm.destroy()

    def close(self, timeout: float) -> None:
        """Stop the worker once its queue is done, and wait for it at most ``timeout`` s (a
        thread still inside the extension when the interpreter exits would be killed mid-call)."""
        self._queue.put(None)
        self._thread.join(timeout=timeout)


class R2cclBackend(_C10dBackend):
    """A c10d backend over an r2ccl communicator (see the module documentation)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Optional[datetime.timedelta]) -> None:
        super().__init__(rank, size)
        self._store = store
        self._rank_in_group = rank
        self._size = size
        self._timeout = timeout.total_seconds() if timeout is not None else None
        self._lock = threading.Lock()  # held briefly: the fields below
        self._init_lock = threading.Lock()  # held while the group's communicator is created
        self._comm: Optional[r2ccl.Communicator] = None
        self._directions: dict = {}
        self._waiters: set = set()  # threads completing futures
        self._hook_buffers: dict = {}  # registered_allreduce_hook's tensors, by bucket buffer

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "r2ccl"

    # torch asks these of every backend (the base class's answers recurse into Python).
    @property
    def supports_coalescing(self) -> bool:
        return False

    @property
    def supports_splitting(self) -> bool:
        return False

    @property
    def comm(self) -> r2ccl.Communicator:
        """The group's communicator (created by the first call)."""
        comm = self._comm
        if comm is not None:
            return comm
        with self._init_lock:
            if self._comm is None:
                self._comm = _join(self._store, "r2ccl/comm", self._rank_in_group, self._size, self._timeout)
            return self._comm

    # --- completion of futures ------------------------------------------------------------

    def _complete_later(self, work: _Work, fut: torch.futures.Future) -> None:
        """Complete ``fut`` when ``work`` is done, on a thread of its own: a callback of one
        future may wait for another (PowerSGD's DDP hook does), so none waits behind another."""

        def run() -> None:
            try:
                work.wait()
                fut.set_result(work.result())
            except BaseException as e:  # noqa: BLE001 - the future carries it
                fut.set_exception(e)
            finally:
                with self._lock:
                    self._waiters.discard(threading.current_thread())

        t = threading.Thread(target=run, name="r2ccl-future", daemon=True)
        with self._lock:
            self._waiters.add(t)
        t.start()

    # --- helpers ----------------------------------------------------------------------------

    def _start(self, coll: str, send: torch.Tensor, recv: torch.Tensor, count: int, op: str = "sum",
               root: int = 0, result: Optional[List[torch.Tensor]] = None,
               post: Optional[Callable[[], None]] = None, dtype: Optional[str] = None) -> _Work:
        dtype = dtype or _dtype(send)
        if _dtype(send) != dtype or _dtype(recv) != dtype:
            raise TypeError(f"r2ccl: {coll} of {send.dtype} into {recv.dtype}: the dtypes must match")
        if send.is_cuda or recv.is_cuda:
            return self._start_cuda(coll, send, recv, count, op, root, result, post, dtype)
        s = as_buffer(send, writable=False, dtype=dtype)
        r = s if recv is send else as_buffer(recv, writable=True, dtype=dtype)
        # The extension holds s and r until the call is done, even if every Work is dropped.
        inner = self.comm._c.start(coll, dtype, count, s.addr, s.nbytes, r.addr, r.nbytes, [s, r], op, root,
                                   self._timeout)
        work = r2ccl.Work(inner, keep=[s, r], post=post)
        return _Work(self, work.wait, result if result is not None else [recv], work.is_done)

    def _start_cuda(self, coll: str, send: torch.Tensor, recv: torch.Tensor, count: int, op: str, root: int,
                    result: Optional[List[torch.Tensor]], post: Optional[Callable[[], None]], dtype: str) -> _Work:
        """A collective on CUDA tensors, enqueued on torch's current stream of their device (as
        NCCL's): the work is done when the network part is; later work on the stream sees the
        result, and ``wait`` also returns only once the stream has run past the call."""
        if not (send.is_cuda and recv.is_cuda) or send.device != recv.device:
            raise TypeError(f"r2ccl: {coll} of a {send.device} tensor into a {recv.device} tensor: "
                            "both must be on one CUDA device")
        s = as_buffer(send, writable=False, dtype=dtype, cuda_ok=True)
        r = s if recv is send else as_buffer(recv, writable=True, dtype=dtype, cuda_ok=True)
        with torch.cuda.device(send.device):
            stream = torch.cuda.current_stream(send.device)
            inner = self.comm._c.start_cuda(coll, dtype, count, s.addr, s.nbytes, r.addr, r.nbytes,
                                            stream.cuda_stream, [s, r], op, root, self._timeout)

        def done() -> None:
            # The result is in device memory once the stream has run past the call; `post`
            # (a copy back into a non-contiguous tensor) is enqueued on the same stream.
            stream.synchronize()
            if post is not None:
                post()

        work = r2ccl.Work(inner, keep=[s, r], post=done)
        return _Work(self, work.wait, result if result is not None else [recv], work.is_done)

    def _group(self, ops: list, result: List[torch.Tensor], post: Optional[Callable[[], None]] = None) -> _Work:
        work = self.comm.group(ops, async_op=True, timeout=self._timeout)
        if post is not None:
            inner = work

            def finish() -> None:
                inner.wait()
                post()

            return _Work(self, finish, result, inner.is_done)
        return _Work(self, work.wait, result, work.is_done)

    @staticmethod
    def _contiguous(t: torch.Tensor) -> tuple:
        """(a contiguous tensor holding ``t``, the copy back into ``t`` to run after, or None)."""
        if t.is_contiguous():
            return t, None
        c = t.contiguous()
        return c, lambda: t.copy_(c)

    # --- collectives ------------------------------------------------------------------------

    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        t = _one(tensors)
        _dtype(t)
        op, factor = _op(opts.reduceOp, t)
        c, back = self._contiguous(t)
        if factor is not None:
            c.mul_(factor)
        return self._start("all_reduce", c, c, c.numel(), op, result=[t], post=back)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        if not tensors:
            return self.barrier(None)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        op, factor = _op(opts.reduceOp, flat)
        if factor is not None:
            flat.mul_(factor)

        def back() -> None:
            at = 0
            for t in tensors:
                t.copy_(flat[at:at + t.numel()].view_as(t))
                at += t.numel()

        return self._start("all_reduce", flat, flat, flat.numel(), op, result=list(tensors), post=back)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        t = _one(tensors)
        c, back = self._contiguous(t)
        return self._start("broadcast", c, c, c.numel(), root=opts.rootRank, result=[t], post=back)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> _Work:
        t = _one(tensors)
        _dtype(t)
        op, factor = _op(opts.reduceOp, t)
        root = opts.rootRank
        if self._rank_in_group == root:
            c, back = self._contiguous(t)
            if factor is not None:
                c.mul_(factor)
            return self._start("reduce", c, c, c.numel(), op, root=root, result=[t], post=back)
        # A non-root's tensor is left as it was: the reduction's output there is scratch.
        src = t.contiguous() if factor is None else t.reshape(-1) * factor
        return self._start("reduce", src, torch.empty_like(src), src.numel(), op, root=root, result=[t])

    def allgather(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any) -> _Work:
        t = _one(inputs)
        outs = _one(outputs)
        if len(outs) != self._size:
            raise ValueError(f"r2ccl: all_gather needs {self._size} output tensors, got {len(outs)}")
        if all(o.numel() == t.numel() for o in outs):
            c, _ = self._contiguous(t)
            flat = torch.empty(self._size * c.numel(), dtype=c.dtype, device=c.device)
            n = c.numel()

            def back() -> None:
                for i, o in enumerate(outs):
                    o.copy_(flat[i * n:(i + 1) * n].view_as(o))

            return self._start("all_gather", c, flat, n, result=list(outs), post=back, dtype=_dtype(c))
        # Uneven: everyone sends its tensor to everyone.
        c, _ = self._contiguous(t)
        ops = [op for peer in range(self._size) for op in (("send", c, peer), ("recv", outs[peer], peer))]
        return self._p2p_into(ops, list(outs))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        if output.numel() != input.numel() * self._size:
            raise ValueError(f"r2ccl: all_gather_into_tensor needs {input.numel() * self._size} output elements, "
                             f"got {output.numel()}")
        c, _ = self._contiguous(input)
        o, back = self._contiguous(output)
        return self._start("all_gather", c, o, c.numel(), result=[output], post=back, dtype=_dtype(c))

    _allgather_base = all_gather_single

    def reduce_scatter(self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]], opts: Any) -> _Work:
        out = _one(outputs)
        ins = _one(inputs)
        if len(ins) != self._size or any(i.numel() != out.numel() for i in ins):
            raise ValueError(f"r2ccl: reduce_scatter needs {self._size} inputs of {out.numel()} elements each")
        _dtype(out)
        op, factor = _op(opts.reduceOp, out)
        flat = torch.cat([i.reshape(-1) for i in ins])
        if factor is not None:
            flat.mul_(factor)
        o, back = self._contiguous(out)
        return self._start("reduce_scatter", flat, o, o.numel(), op, result=[out], post=back)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> _Work:
        if input.numel() != output.numel() * self._size:
            raise ValueError(f"r2ccl: reduce_scatter_tensor needs {output.numel() * self._size} input elements, "
                             f"got {input.numel()}")
        _dtype(output)
        op, factor = _op(opts.reduceOp, output)
        c = input.contiguous() if factor is None else input.reshape(-1) * factor
        o, back = self._contiguous(output)
        return self._start("reduce_scatter", c, o, o.numel(), op, result=[output], post=back)

    _reduce_scatter_base = reduce_scatter_single

    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any) -> _Work:
        if len(outputs) != self._size or len(inputs) != self._size:
            raise ValueError(f"r2ccl: all_to_all needs {self._size} input and output tensors")
        for t in (*outputs, *inputs):
            _dtype(t)
        n = inputs[0].numel()
        if all(t.numel() == n for t in (*outputs, *inputs)):
            flat_in = torch.cat([i.reshape(-1) for i in inputs])
            flat_out = torch.empty_like(flat_in)

            def back() -> None:
                for i, o in enumerate(outputs):
                    o.copy_(flat_out[i * n:(i + 1) * n].view_as(o))

            return self._start("all_to_all", flat_in, flat_out, n, result=list(outputs), post=back)
        ops = [
            op for peer in range(self._size)
            for op in (("send", inputs[peer].contiguous(), peer), ("recv", outputs[peer], peer))
        ]
        return self._p2p_into(ops, list(outputs))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int],
                          input_split_sizes: List[int], opts: Any) -> _Work:
        _dtype(input)
        if not output_split_sizes and not input_split_sizes:
            if input.numel() != output.numel() or input.numel() % self._size:
                raise ValueError(f"r2ccl: all_to_all_single of {input.numel()} and {output.numel()} elements "
                                 f"over {self._size} ranks")
            c, _ = self._contiguous(input)
            o, back = self._contiguous(output)
            return self._start("all_to_all", c, o, c.numel() // self._size, result=[output], post=back)
        in_rows = input.size(0) if input.dim() else 0
        out_rows = output.size(0) if output.dim() else 0
        in_row = input.numel() // in_rows if in_rows else 0
        out_row = output.numel() // out_rows if out_rows else 0
        ins = list(input_split_sizes) or [in_rows // self._size] * self._size
        outs = list(output_split_sizes) or [out_rows // self._size] * self._size
        if len(ins) != self._size or len(outs) != self._size or sum(ins) != in_rows or sum(outs) != out_rows:
            raise ValueError(f"r2ccl: all_to_all_single splits {ins} / {outs} do not match the tensors' "
                             f"{in_rows} / {out_rows} rows over {self._size} ranks")
        flat_in = input.contiguous().reshape(-1)
        o, back = self._contiguous(output)
        flat_out = o.reshape(-1)
        ops = []
        at_in = at_out = 0
        for peer in range(self._size):
            ops.append(("send", flat_in[at_in:at_in + ins[peer] * in_row], peer))
            ops.append(("recv", flat_out[at_out:at_out + outs[peer] * out_row], peer))
            at_in += ins[peer] * in_row
            at_out += outs[peer] * out_row
        return self._group(ops, [output], back)

    alltoall_base = all_to_all_single

    def gather(self, outputs: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any) -> _Work:
        t = _one(inputs)
        _dtype(t)
        root = opts.rootRank
        ops = [("send", t.contiguous(), root)]
        outs: List[torch.Tensor] = []
        if self._rank_in_group == root:
            outs = _one(outputs)
            if len(outs) != self._size:
                raise ValueError(f"r2ccl: gather needs {self._size} output tensors at the root, got {len(outs)}")
            ops += [("recv", o, peer) for peer, o in enumerate(outs)]
        return self._p2p_into(ops, outs)

    def scatter(self, outputs: List[torch.Tensor], inputs: List[List[torch.Tensor]], opts: Any) -> _Work:
        t = _one(outputs)
        _dtype(t)
        root = opts.rootRank
        ops = []
        if self._rank_in_group == root:
            ins = _one(inputs)
            if len(ins) != self._size:
                raise ValueError(f"r2ccl: scatter needs {self._size} input tensors at the root, got {len(ins)}")
            ops += [("send", i.contiguous(), peer) for peer, i in enumerate(ins)]
        ops.append(("recv", t, root))
        return self._p2p_into(ops, [t])

    def _p2p_into(self, ops: list, outs: List[torch.Tensor]) -> _Work:
        """A group whose receives land in ``outs`` (staged when not contiguous)."""
        staged = {id(o): o.contiguous() for o in outs}
        ops = [(k, staged.get(id(b), b) if k == "recv" else b, p) for k, b, p in ops]

        def back() -> None:
            for o in outs:
                if staged[id(o)] is not o:
                    o.copy_(staged[id(o)])

        return self._group(ops, list(outs), back)

    def barrier(self, opts: Any) -> _Work:
        t = torch.zeros(1, dtype=torch.int32)
        return self._start("all_reduce", t, t, 1, "sum", result=[])

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> _Work:
        t = _one(tensors)
        _dtype(t)
        return self._direction(self._rank_in_group, dst).submit(t.contiguous())

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> _Work:
        t = _one(tensors)
        _dtype(t)
        if not t.is_contiguous():
            raise ValueError("r2ccl: recv into a non-contiguous tensor")
        return self._direction(src, self._rank_in_group).submit(t)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> _Work:
        raise RuntimeError("r2ccl: recv from any source is not supported; name the sender")

    def _direction(self, src: int, dst: int) -> _Direction:
        if not (0 <= src < self._size and 0 <= dst < self._size) or src == dst:
            raise ValueError(f"r2ccl: point-to-point from rank {src} to rank {dst} in a group of {self._size}")
        with self._lock:
            d = self._directions.get((src, dst))
            if d is None:
                d = self._directions[(src, dst)] = _Direction(self, src, dst)
            return d

    # --- lifetime ---------------------------------------------------------------------------

    def _stop_threads(self, timeout: Optional[float] = None) -> None:
        """End the point-to-point workers and wait for them and the future threads, each at
        most ``timeout`` s (by default the longest a call may take)."""
        limit = timeout if timeout is not None else 2 * (self._timeout or 1800) + 120
        with self._lock:
            directions, self._directions = self._directions, {}
            waiters = list(self._waiters)
        for d in directions.values():
            d.close(limit)
        for t in waiters:
            t.join(timeout=limit)

    def shutdown(self) -> None:
        self._stop_threads()
        with self._lock:
            comm, self._comm = self._comm, None
        if comm is not None:
            comm.finalize()

    def abort(self) -> None:
        with self._lock:
            comm, self._comm = self._comm, None
            directions = list(self._directions.values())
        if comm is not None:
            comm.destroy()
        for d in directions:
            d.abort()
        # Everything in flight now fails at once; the threads end quickly.
        self._stop_threads(timeout=10)


# The backend of each group this process belongs to, by group name.
_BACKENDS: "weakref.WeakValueDictionary[str, R2cclBackend]" = weakref.WeakValueDictionary()


def create_backend(opts: Any, backend_options: Any = None) -> R2cclBackend:
    """The creator ``torch.distributed`` calls for each group using ``"r2ccl"`` (its extended
    form: ``opts`` is a ``_DistributedBackendOptions``)."""
    b = R2cclBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    if opts.group_id:
        _BACKENDS[opts.group_id] = b
    return b


def get_backend(group: Any = None) -> R2cclBackend:
    """The r2ccl backend of ``group`` (the default group when None), for what torch does not
    expose: ``get_backend().comm.failed_nics()``, ``.comm.take_events()``."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    b = _BACKENDS.get(pg.group_name)
    if b is None:
        raise ValueError(f"group {pg.group_name!r} does not use the r2ccl backend")
    return b


def empty(*size: int, dtype: torch.dtype = torch.float32, group: Any = None) -> torch.Tensor:
    """A CPU tensor of ``size`` (zeroed) in memory registered with ``group``'s communicator
    (the default group when None): collectives of that group on the whole tensor read and write
    it where it is, with no copy into the library or out of it (``Communicator.alloc``). Views of
    part of it, and other groups, copy as for any tensor."""
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    numel = 1
    for n in shape:
        numel *= int(n)
    nbytes = max(numel, 1) * torch.empty((), dtype=dtype).element_size()
    mem = get_backend(group).comm.alloc(nbytes)
    return torch.frombuffer(mem, dtype=torch.uint8).view(dtype)[:numel].view(shape)


def registered_allreduce_hook(state: Any, bucket: Any) -> torch.futures.Future:
    """A DDP communication hook: ``ddp.register_comm_hook(group, r2ccl.torch.registered_allreduce_hook)``
    (``group`` None for the default group). It computes what torch's ``allreduce_hook`` does (each
    bucket divided by the group's size, then summed over the group), through a tensor in registered
    memory kept per bucket buffer (:func:`empty`): the bucket is copied into it once, fused with the
    division, and the library copies nothing in or out, where a plain bucket costs a copy in and a
    copy out. The registered memory is as large as the gradients of the models using the hook, and
    as much again for the first iteration's buckets, which DDP rebuilds after it (their tensors stay
    until the group goes). CUDA buckets take the plain path."""
    buf = bucket.buffer()
    size = dist.get_world_size(state)
    if buf.is_cuda:
        buf.div_(size)
        return dist.all_reduce(buf, group=state, async_op=True).get_future().then(lambda f: f.value()[0])
    b = get_backend(state)
    # One registered tensor per bucket buffer, by its address (bucket indices repeat across DDP
    # models that share a group, and both may be in flight at once).
    key = (buf.data_ptr(), buf.numel(), buf.dtype)
    reg = b._hook_buffers.get(key)
    if reg is None:
        reg = empty(buf.numel(), dtype=buf.dtype, group=state)
        b._hook_buffers[key] = reg
    torch.div(buf, size, out=reg)
    return dist.all_reduce(reg, group=state, async_op=True).get_future().then(lambda f: f.value()[0])


# DDP checks a hook's annotations as objects (this module's are strings: `from __future__`).
registered_allreduce_hook.__annotations__ = {
    "state": Any,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


@atexit.register
def _stop_at_exit() -> None:
    """Threads of backends never shut down are stopped before the interpreter tears down (one
    inside the extension at that moment would be killed mid-call)."""
    for b in list(_BACKENDS.values()):
        b._stop_threads(timeout=30)


dist.Backend.register_backend("r2ccl", create_backend, extended_api=True, devices=["cpu"])
