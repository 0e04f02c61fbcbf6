"""One rank of the torch.distributed tests (tests/test_torch.py starts one process per rank).

Usage: python _worker.py CASE RANK WORLD STORE_FILE. Exits 0 when every check passed; prints
``OK <case> <details>`` or the failure.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import r2ccl
import r2ccl.torch  # noqa: F401 - registers the backend

CASE, RANK, WORLD, STORE = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
R = dist.ReduceOp


def data(rank, n, dtype, salt=0):
    """Rank `rank`'s deterministic input: small integers, exact in every dtype."""
    v = (torch.arange(n, dtype=torch.int64) * 7 + rank * 3 + salt) % 5 + 1
    if dtype == torch.bool:
        return (v + rank) % 2 == 0
    return v.to(dtype)


def pdata(rank, n, dtype):
    """Inputs for products: 1s and 2s, so that every order of multiplication is exact."""
    if dtype == torch.bool:
        return data(rank, n, dtype)
    return (data(rank, n, torch.int64) % 2 + 1).to(dtype)


def ref_reduce(op, ts):
    dtype = ts[0].dtype
    if dtype in (torch.uint32, torch.uint64):  # torch has no arithmetic for these
        return ref_reduce(op, [t.to(torch.int64) for t in ts]).to(dtype)
    out = ts[0].clone()
    for t in ts[1:]:
        if op == "sum":
            out = out + t if out.dtype != torch.bool else out | t
        elif op == "prod":
            out = out * t if out.dtype != torch.bool else out & t
        elif op == "min":
            out = torch.minimum(out, t)
        elif op == "max":
            out = torch.maximum(out, t)
    return out


def same(a, b, what):
    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
        raise AssertionError(f"{what}: got {a.flatten()[:8].tolist()}, expected {b.flatten()[:8].tolist()}")


def case_ops():
    n = 1000
    # all_reduce: every op, sync and async, over the dtypes r2ccl shares with torch.
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
              torch.int32, torch.int64, torch.uint32, torch.uint64, torch.bool]
    checked = 0
    for dt in dtypes:
        ops = [("sum", R.SUM), ("min", R.MIN), ("max", R.MAX), ("prod", R.PRODUCT)]
        for name, op in ops:
            make = pdata if name == "prod" else data
            for async_op in (False, True):
                t = make(RANK, n, dt)
                w = dist.all_reduce(t, op=op, async_op=async_op)
                if async_op:
                    w.wait()
                    # torch's trampoline forwards wait and get_future to the backend, not
                    # is_completed: the future says it is done.
                    assert w.get_future().done()
                same(t, ref_reduce(name, [make(r, n, dt) for r in range(WORLD)]), f"all_reduce {name} {dt}")
                checked += 1
    # AVG and PREMUL_SUM on floats (exact: sums of small integers, divided by a power of two).
    for dt in (torch.float32, torch.float64):
        t = data(RANK, n, dt)
        dist.all_reduce(t, op=R.AVG)
        same(t, sum(data(r, n, dt) for r in range(WORLD)) / WORLD, f"all_reduce avg {dt}")
        t = data(RANK, n, dt)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
        same(t, sum(data(r, n, dt) * 2 for r in range(WORLD)), f"all_reduce premul_sum {dt}")
        checked += 2
    # wait() with a timeout (torch's timedelta) on a call that finishes in time.
    t = data(RANK, n, torch.float32)
    dist.all_reduce(t, async_op=True).wait(timeout=datetime.timedelta(seconds=60))
    same(t, sum(data(r, n, torch.float32) for r in range(WORLD)), "all_reduce wait(timeout)")
    # The future DDP waits on holds the reduced tensor.
    t = data(RANK, n, torch.float32)
    fut = dist.all_reduce(t, async_op=True).get_future()
    got = fut.wait()[0]
    same(got, sum(data(r, n, torch.float32) for r in range(WORLD)), "all_reduce future")
    # Non-contiguous tensors.
    t = data(RANK, 2 * n, torch.float32).view(2, n).t()
    dist.all_reduce(t)
    same(t, sum(data(r, 2 * n, torch.float32) for r in range(WORLD)).view(2, n).t(), "all_reduce non-contiguous")
    for root in range(WORLD):
        t = data(RANK, n, torch.int32, salt=root)
        dist.broadcast(t, src=root)
        same(t, data(root, n, torch.int32, salt=root), f"broadcast root {root}")
        t = data(RANK, n, torch.float32)
        dist.reduce(t, dst=root, op=R.MAX)
        want = ref_reduce("max", [data(r, n, torch.float32) for r in range(WORLD)]) if RANK == root \
            else data(RANK, n, torch.float32)
        same(t, want, f"reduce root {root}")
    outs = [torch.zeros(n, dtype=torch.int64) for _ in range(WORLD)]
    dist.all_gather(outs, data(RANK, n, torch.int64))
    for r in range(WORLD):
        same(outs[r], data(r, n, torch.int64), "all_gather")
    # Uneven all_gather (each rank's tensor has its own length).
    outs = [torch.zeros(10 + r, dtype=torch.int64) for r in range(WORLD)]
    dist.all_gather(outs, data(RANK, 10 + RANK, torch.int64))
    for r in range(WORLD):
        same(outs[r], data(r, 10 + r, torch.int64), "all_gather uneven")
    out = torch.zeros(WORLD * n, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, data(RANK, n, torch.bfloat16))
    same(out, torch.cat([data(r, n, torch.bfloat16) for r in range(WORLD)]), "all_gather_into_tensor")
    ins = [data(RANK, n, torch.float32, salt=j) for j in range(WORLD)]
    out = torch.zeros(n, dtype=torch.float32)
    dist.reduce_scatter(out, ins)
    same(out, sum(data(r, n, torch.float32, salt=RANK) for r in range(WORLD)), "reduce_scatter")
    inp = data(RANK, WORLD * n, torch.int32)
    out = torch.zeros(n, dtype=torch.int32)
    dist.reduce_scatter_tensor(out, inp, op=R.MIN)
    full = ref_reduce("min", [data(r, WORLD * n, torch.int32) for r in range(WORLD)])
    same(out, full[RANK * n:(RANK + 1) * n], "reduce_scatter_tensor")
    # all_to_all: even, then uneven lists.
    ins = [data(RANK, n, torch.float64, salt=j) for j in range(WORLD)]
    outs = [torch.zeros(n, dtype=torch.float64) for _ in range(WORLD)]
    dist.all_to_all(outs, ins)
    for r in range(WORLD):
        same(outs[r], data(r, n, torch.float64, salt=RANK), "all_to_all")
    ins = [data(RANK, 1 + RANK + j, torch.int64, salt=j) for j in range(WORLD)]
    outs = [torch.zeros(1 + r + RANK, dtype=torch.int64) for r in range(WORLD)]
    dist.all_to_all(outs, ins)
    for r in range(WORLD):
        same(outs[r], data(r, 1 + r + RANK, torch.int64, salt=RANK), "all_to_all uneven")
    # all_to_all_single: even, then uneven splits (rank i sends i+j+1 rows of 3 to rank j).
    inp = data(RANK, WORLD * n, torch.int32)
    out = torch.zeros(WORLD * n, dtype=torch.int32)
    dist.all_to_all_single(out, inp)
    want = torch.cat([data(r, WORLD * n, torch.int32)[RANK * n:(RANK + 1) * n] for r in range(WORLD)])
    same(out, want, "all_to_all_single")

    def rows(i):
        return [i + j + 1 for j in range(WORLD)]

    def block(i, j):
        src = data(i, sum(rows(i)) * 3, torch.float32).view(-1, 3)
        at = sum(rows(i)[:j])
        return src[at:at + rows(i)[j]]

    inp = data(RANK, sum(rows(RANK)) * 3, torch.float32).view(-1, 3)
    out_splits = [r + RANK + 1 for r in range(WORLD)]
    out = torch.zeros(sum(out_splits), 3, dtype=torch.float32)
    dist.all_to_all_single(out, inp, output_split_sizes=out_splits, input_split_sizes=rows(RANK))
    same(out, torch.cat([block(r, RANK) for r in range(WORLD)]), "all_to_all_single uneven")
    # send/recv around the ring, both orders, then isend/irecv and batch_isend_irecv.
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    t = torch.zeros(n, dtype=torch.float16)
    if RANK % 2 == 0:
        dist.send(data(RANK, n, torch.float16), nxt)
        dist.recv(t, prv)
    else:
        dist.recv(t, prv)
        dist.send(data(RANK, n, torch.float16), nxt)
    same(t, data(prv, n, torch.float16), "send/recv")
    t = torch.zeros(n, dtype=torch.int64)
    works = [dist.irecv(t, prv), dist.isend(data(RANK, n, torch.int64, salt=1), nxt)]
    for w in works:
        w.wait()
    same(t, data(prv, n, torch.int64, salt=1), "isend/irecv")
    t = torch.zeros(n, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, data(RANK, n, torch.int64, salt=2), nxt), dist.P2POp(dist.irecv, t, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(t, data(prv, n, torch.int64, salt=2), "batch_isend_irecv")
    # gather and scatter, every root.
    for root in range(WORLD):
        outs = [torch.zeros(n, dtype=torch.float32) for _ in range(WORLD)] if RANK == root else None
        dist.gather(data(RANK, n, torch.float32, salt=root), outs, dst=root)
        if RANK == root:
            for r in range(WORLD):
                same(outs[r], data(r, n, torch.float32, salt=root), "gather")
        t = torch.zeros(n, dtype=torch.int64)
        ins = [data(root, n, torch.int64, salt=j) for j in range(WORLD)] if RANK == root else None
        dist.scatter(t, ins, src=root)
        same(t, data(root, n, torch.int64, salt=RANK), "scatter")
    # all_reduce_coalesced (several tensors in one call).
    ts = [data(RANK, 10 + k, torch.float64, salt=k) for k in range(3)]
    dist.all_reduce_coalesced(ts)
    for k, t in enumerate(ts):
        same(t, sum(data(r, 10 + k, torch.float64, salt=k) for r in range(WORLD)), "all_reduce_coalesced")
    dist.barrier()
    # new_group: dozens of groups are cheap (no communicator until used); use two of them.
    t0 = time.monotonic()
    groups = [dist.new_group(list(range(WORLD))) for _ in range(24)]
    evens = dist.new_group([r for r in range(WORLD) if r % 2 == 0])
    made = time.monotonic() - t0
    t = data(RANK, n, torch.int32)
    dist.all_reduce(t, group=groups[5])
    same(t, sum(data(r, n, torch.int32) for r in range(WORLD)), "all_reduce on a new group")
    if RANK % 2 == 0:
        t = data(RANK, n, torch.int32)
        dist.all_reduce(t, group=evens)
        same(t, sum(data(r, n, torch.int32) for r in range(0, WORLD, 2)), "all_reduce on a subgroup")
    dist.barrier()
    print(f"OK ops: {checked} all_reduce checks, 25 groups made in {made:.3f} s", flush=True)


def expect(exc_type, fn):
    t0 = time.monotonic()
    try:
        fn()
    except exc_type as e:
        return time.monotonic() - t0, e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {exc_type.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {exc_type.__name__}, nothing raised")


def case_mismatch():
    dist.all_reduce(torch.ones(10))  # the communicator is up on every rank
    t = torch.ones(100)
    took, e = expect(r2ccl.MismatchError,
                     lambda: dist.all_reduce(t) if RANK == 0 else dist.broadcast(t, src=0))
    print(f"OK mismatch: {type(e).__name__} after {took:.2f} s: {e}", flush=True)


def case_killed():
    dist.all_reduce(torch.ones(10))
    if RANK == WORLD - 1:
        os._exit(0)  # dies without a word
    took, e = expect(r2ccl.R2cclError, lambda: dist.all_reduce(torch.ones(1 << 16)))
    if not isinstance(e, (r2ccl.PeerLostError, r2ccl.AbortedError)):
        raise AssertionError(f"a killed rank gave {type(e).__name__}: {e}")
    print(f"OK killed: {type(e).__name__} after {took:.2f} s: {e}", flush=True)
    os._exit(0)  # the group is broken: skip torch's teardown


def case_dtype():
    for t in (torch.ones(4, dtype=torch.int16), torch.ones(4, dtype=torch.uint16)):
        _, e = expect(TypeError, lambda: dist.all_reduce(t))
    _, e2 = expect(TypeError, lambda: dist.broadcast(torch.ones(4, dtype=torch.int16), src=0))
    # Output and input of different dtypes (torch does not check it here): refused, not overrun.
    out16 = torch.zeros(4 * WORLD, dtype=torch.float16)
    _, e3 = expect(TypeError, lambda: dist.all_gather_into_tensor(out16, torch.ones(4, dtype=torch.float32)))
    # Complex tensors reach the backend as float pairs (torch's view_as_real) and sum exactly.
    c = torch.full((4,), complex(RANK + 1, -RANK), dtype=torch.complex64)
    dist.all_reduce(c)
    want = complex(sum(r + 1 for r in range(WORLD)), -sum(range(WORLD)))
    same(c, torch.full((4,), want, dtype=torch.complex64), "complex all_reduce")
    dist.all_reduce(torch.ones(4))  # still usable
    print(f"OK dtype: {e}", flush=True)


def case_registered():
    """Collectives on tensors in registered memory (r2ccl.torch.empty): exact, in place."""
    n = 1 << 18
    t = r2ccl.torch.empty(n, dtype=torch.float32)
    assert not t.any(), "registered memory starts zeroed"
    t.copy_(data(RANK, n, torch.float32))
    dist.all_reduce(t)
    same(t, ref_reduce("sum", [data(r, n, torch.float32) for r in range(WORLD)]), "registered all_reduce")
    t.copy_(data(RANK, n, torch.float32))
    w = dist.all_reduce(t, op=R.MAX, async_op=True)
    w.wait()
    same(t, ref_reduce("max", [data(r, n, torch.float32) for r in range(WORLD)]), "registered async all_reduce")
    b = r2ccl.torch.empty((4, 8), dtype=torch.int64)
    b.copy_(data(RANK, 32, torch.int64).view(4, 8))
    dist.broadcast(b, src=WORLD - 1)
    same(b, data(WORLD - 1, 32, torch.int64).view(4, 8), "registered broadcast")
    out = r2ccl.torch.empty(WORLD * 100, dtype=torch.bfloat16)
    inp = r2ccl.torch.empty(100, dtype=torch.bfloat16)
    inp.copy_(data(RANK, 100, torch.bfloat16))
    dist.all_gather_into_tensor(out, inp)
    same(out, torch.cat([data(r, 100, torch.bfloat16) for r in range(WORLD)]), "registered all_gather_into_tensor")
    rs = r2ccl.torch.empty(64, dtype=torch.int32)
    full = data(RANK, WORLD * 64, torch.int32)
    dist.reduce_scatter_tensor(rs, full)  # registered output, plain input: copied
    want = ref_reduce("sum", [data(r, WORLD * 64, torch.int32) for r in range(WORLD)])[RANK * 64:(RANK + 1) * 64]
    same(rs, want, "reduce_scatter_tensor into registered memory")
    print(f"OK registered: {n} float32 elements in place", flush=True)


def case_ddp_hook():
    """DDP with r2ccl.torch.registered_allreduce_hook: the same losses and parameters, bit for bit,
    as plain DDP; two hooked models in one backward (their buckets in flight at once, with the same
    bucket indices) each keep registered tensors of their own."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model(seed):
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                   torch.nn.ReLU(), torch.nn.Linear(256, 8))

    def train(hook):
        # Small buckets: several per step, each through its own registered tensor.
        ddps = [DDP(model(seed), bucket_cap_mb=0.1) for seed in (0, 1)]
        if hook:
            for d in ddps:
                d.register_comm_hook(None, r2ccl.torch.registered_allreduce_hook)
        opt = torch.optim.SGD([p for d in ddps for p in d.parameters()], lr=0.05)
        torch.manual_seed(1 + RANK)
        x, y = torch.randn(16, 64), torch.randn(16, 8)
        losses = []
        for _ in range(6):
            opt.zero_grad()
            loss = sum((d(x) - y).square().mean() for d in ddps)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().clone() for d in ddps for p in d.module.parameters()]

    plain, hooked = train(False), train(True)
    if plain[0] != hooked[0]:
        raise AssertionError(f"losses differ: plain {plain[0]}, hooked {hooked[0]}")
    for a, b in zip(plain[1], hooked[1]):
        same(b, a, "parameters after training")
    used = len(r2ccl.torch.get_backend()._hook_buffers)
    if used < 4:
        raise AssertionError(f"the hook kept {used} registered bucket tensors; expected one per bucket of each model")
    print(f"OK ddp_hook: 2 models, 6 steps, losses and parameters identical, {used} registered buckets", flush=True)


def case_cuda():
    """CUDA tensors, ordered on torch's current stream (run only where CUDA is available)."""
    dev = torch.device("cuda", RANK % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    n = 1 << 20
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        ins = [data(r, n, dtype) for r in range(WORLD)]
        t = ins[RANK].to(dev)
        dist.all_reduce(t)
        same(t.cpu(), ref_reduce("sum", ins), f"cuda all_reduce {dtype}")
        t = ins[RANK].to(dev)
        dist.all_reduce(t, op=R.MAX)
        same(t.cpu(), ref_reduce("max", ins), f"cuda all_reduce max {dtype}")
    b = data(RANK, n, torch.float32).to(dev)
    dist.broadcast(b, src=1 % WORLD)
    same(b.cpu(), data(1 % WORLD, n, torch.float32), "cuda broadcast")
    out = torch.empty(WORLD * n, dtype=torch.float32, device=dev)
    dist.all_gather_into_tensor(out, data(RANK, n, torch.float32).to(dev))
    same(out.cpu(), torch.cat([data(r, n, torch.float32) for r in range(WORLD)]), "cuda all_gather_into_tensor")
    rs = torch.empty(n, dtype=torch.float32, device=dev)
    ins = [data(r, WORLD * n, torch.float32) for r in range(WORLD)]
    dist.reduce_scatter_tensor(rs, ins[RANK].to(dev))
    same(rs.cpu(), ref_reduce("sum", ins)[RANK * n:(RANK + 1) * n], "cuda reduce_scatter_tensor")
    w = dist.all_reduce(torch.ones(n, device=dev), async_op=True)
    w.wait()
    print(f"OK cuda on {torch.cuda.get_device_name(dev)}", flush=True)


def main():
    store = dist.FileStore(STORE, WORLD)
    dist.init_process_group("r2ccl", store=store, rank=RANK, world_size=WORLD)
    globals()[f"case_{CASE}"]()
    if CASE != "killed":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
