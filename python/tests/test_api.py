"""The Python API on buffer-protocol objects (numpy, bytearray): exact results, typed errors,
health readouts and the Prometheus endpoint. Ranks are threads of this process (each a node of
its own with two NICs on loopback); the GIL is released while calls run, so they overlap."""

import os
import threading
import time
import urllib.request

import numpy as np
import pytest

import r2ccl


def run(world, body, env_nics=("lo", "lo"), **kw):
    """Run body(comm) on `world` ranks as threads; their results by rank."""
    root = r2ccl.Root.create("127.0.0.1")
    uid = root.unique_id()
    results, errors = [None] * world, []

    def rank(r):
        try:
            comm = r2ccl.Communicator(r, world, uid, node=f"node{r}", nics=list(env_nics),
                                      root=root if r == 0 else None, **kw)
            results[r] = body(comm)
            comm.finalize()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((r, e))

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a rank hung"
    assert not errors, errors
    return results


def test_collectives_on_numpy_are_exact():
    world, n = 3, 10000

    def body(c):
        r = c.rank
        x = np.arange(n, dtype=np.float32) + r
        c.all_reduce(x)
        y = np.zeros(n, dtype=np.int64)
        c.all_reduce(np.full(n, r + 1, dtype=np.int64), y, op="max")
        g = np.zeros(world * 5, dtype=np.uint8)
        c.all_gather(bytes([r] * 5), g)  # a read-only send buffer
        rs = np.zeros(4, dtype=np.float64)
        c.reduce_scatter(np.ones(4 * world), rs)
        b = np.full(7, r, dtype=np.int32)
        c.broadcast(b, root=2)
        red = np.full(6, r + 1, dtype=np.float64)
        c.reduce(red, op="prod", root=1)
        a2a = np.zeros(world * 2, dtype=np.int32)
        c.all_to_all(np.arange(world * 2, dtype=np.int32) + 100 * r, a2a)
        w = c.all_reduce(np.ones(n, dtype=np.float16), async_op=True)
        rep = w.wait()
        ring = np.zeros(3, dtype=np.uint64)
        c.group([("send", np.full(3, r, dtype=np.uint64), (r + 1) % world), ("recv", ring, (r - 1) % world)])
        return x, y, g, rs, b, red, a2a, rep, ring

    out = run(world, body)
    for r, (x, y, g, rs, b, red, a2a, rep, ring) in enumerate(out):
        assert np.array_equal(x, 3 * np.arange(n, dtype=np.float32) + 3)
        assert (y == world).all()
        assert g.tolist() == [k for k in range(world) for _ in range(5)]
        assert (rs == world).all()
        assert (b == 2).all()
        assert (red == (6.0 if r == 1 else r + 1)).all()  # root gets 1*2*3; the others keep theirs
        assert a2a.tolist() == [100 * i + 2 * r + k for i in range(world) for k in range(2)]
        assert rep.seq == 8 and isinstance(rep.strategy, str)
        assert (ring == (r - 1) % world).all()


def test_collectives_on_registered_memory_are_exact(monkeypatch):
    # 64 KiB slots: the 1 MiB AllReduce below runs in segments, in place on the registered memory.
    monkeypatch.setenv("R2CCL_TRANSPORT__HOST_SEGMENT_BYTES", "65536")
    world, n = 3, 1 << 18

    def body(c):
        r = c.rank
        x = np.frombuffer(c.alloc(n * 4), dtype=np.float32)
        assert not x.any(), "registered memory starts zeroed"
        x[:] = np.arange(n, dtype=np.float32) + r
        c.all_reduce(x)  # in place, registered
        inp = np.frombuffer(c.alloc(5), dtype=np.uint8)
        inp[:] = r
        out = np.frombuffer(c.alloc(world * 5), dtype=np.uint8)
        c.all_gather(inp, out)  # out of place, both registered
        half = np.zeros(world * 5, dtype=np.uint8)
        c.all_gather(inp, half)  # registered input, plain output: copied
        part = np.frombuffer(c.alloc(64), dtype=np.int32)[2:10]
        part[:] = r + 1
        c.all_reduce(part, op="max")  # a view into registered memory, not at its start: copied
        big = c.alloc(4096)
        small = np.frombuffer(big, dtype=np.int64)[:4]
        small[:] = r
        c.broadcast(small, root=1)  # starts at the buffer, shorter than it: in place
        return x.copy(), out.copy(), half.copy(), part.copy(), small.copy()

    want = sum(np.arange(n, dtype=np.float32) + r for r in range(world))
    for x, out, half, part, small in run(world, body):
        assert np.array_equal(x, want)
        assert out.tolist() == [q for q in range(world) for _ in range(5)]
        assert half.tolist() == out.tolist()
        assert part.tolist() == [world] * 8
        assert small.tolist() == [1] * 4


def test_registered_memory_outlives_its_communicator_until_released():
    kept = []

    def body(c):
        m = c.alloc(16)
        np.frombuffer(m, dtype=np.uint8)[:] = 7
        kept.append(m)
        with pytest.raises(r2ccl.InvalidArgumentError):
            c.alloc(0)
        return None

    run(2, body)
    # The communicators are finalized: their registered memory is still readable.
    assert all(bytes(m) == b"\x07" * 16 for m in kept)


def test_bad_arguments_are_typed_errors_and_lose_nothing():
    def body(c):
        with pytest.raises(r2ccl.InvalidArgumentError):
            c.all_gather(np.zeros(4, dtype=np.float32), np.zeros(5, dtype=np.float32))
        with pytest.raises(TypeError):
            c.all_reduce(np.zeros(4, dtype=np.int16))
        with pytest.raises(ValueError):
            c.all_reduce(np.zeros((4, 4), dtype=np.float32)[:, 0])  # not contiguous
        with pytest.raises(ValueError):
            c.all_reduce(np.zeros(4, dtype=np.float32), op="bxor")
        x = np.ones(4, dtype=np.float32)
        c.all_reduce(x)  # still usable, nothing was sent
        return x

    for x in run(2, body):
        assert (x == 2).all()


def test_buffers_too_small_for_the_call_are_refused_by_the_extension():
    def body(c):
        # Straight to the extension, past the Python layer's checks: it checks the extents itself.
        small = r2ccl.as_buffer(np.zeros(4, dtype=np.float32), writable=True)
        big = r2ccl.as_buffer(np.zeros(8, dtype=np.float32), writable=True)
        with pytest.raises(r2ccl.InvalidArgumentError):
            c._c.start("all_gather", "f32", 4, small.addr, small.nbytes, small.addr, small.nbytes, [small])
        with pytest.raises(r2ccl.InvalidArgumentError):
            c._c.start("all_reduce", "f32", 8, big.addr, big.nbytes, small.addr, small.nbytes, [big, small])
        with pytest.raises(r2ccl.InvalidArgumentError):
            c.reduce(np.zeros(8, dtype=np.float32), np.zeros(4, dtype=np.float32))
        with pytest.raises(TypeError):
            c.all_reduce(np.zeros(4, dtype=">f4"))  # not this machine's byte order
        x = np.ones(4, dtype=np.float32)
        c.all_reduce(x)
        return x

    for x in run(2, body):
        assert (x == 2).all()


def test_dropped_async_calls_finish_and_polled_groups_land():
    import gc

    def body(c):
        r = c.rank
        # Started and dropped at once, with temporaries as buffers: the extension keeps them
        # until the calls are done; later calls are exact.
        for _ in range(5):
            c.all_reduce(np.ones(1 << 16, dtype=np.float32), async_op=True)
            c.all_gather(bytes(64), np.zeros(128, dtype=np.uint8), async_op=True)
        gc.collect()
        got = np.zeros(3, dtype=np.int64)
        w = c.group([("send", np.full(3, r + 7, dtype=np.int64), 1 - r), ("recv", got, 1 - r)], async_op=True)
        t0 = time.monotonic()
        while not w.is_done():
            assert time.monotonic() - t0 < 30, "the group never finished"
            time.sleep(0.001)
        polled = got.copy()  # read after is_done() only: the receive must be in place
        x = np.ones(4, dtype=np.float32)
        c.all_reduce(x)
        return polled, x

    out = run(2, body)
    for r, (polled, x) in enumerate(out):
        assert (polled == (1 - r) + 7).all(), polled
        assert (x == 2).all()


def test_mismatch_is_a_named_exception_on_every_rank():
    def body(c):
        c.all_reduce(np.ones(4, dtype=np.float32))
        with pytest.raises(r2ccl.MismatchError) as e:
            if c.rank == 0:
                c.all_reduce(np.ones(8, dtype=np.float32))
            else:
                c.broadcast(np.ones(8, dtype=np.float32))
        return e.value.seq

    assert run(2, body) == [2, 2]


def test_fault_shows_in_events_and_failed_nics(monkeypatch):
    monkeypatch.setenv("R2CCL_FAULT", "rank=1,nic=0,after_msgs=20,kind=down")

    def body(c):
        x = np.ones(1 << 18, dtype=np.float32)
        for _ in range(20):
            x[:] = 1
            c.all_reduce(x)
        return (x == 2).all(), c.failed_nics(), c.take_events()

    out = run(2, body, fault_injection_from_env=True)
    for exact, failed, events in out:
        assert exact
        assert failed == [(1, 0)], failed
        assert any("node1/nic0" in text for _, text in events), events


def test_prometheus_endpoint_serves_metrics():
    addr = r2ccl.install_prometheus("127.0.0.1:0")
    run(2, lambda c: c.all_reduce(np.ones(16, dtype=np.float32)))
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert "r2ccl_" in text
    # Labelled by the collective that ran (it once read "collective" for every call).
    assert 'collective="allreduce"' in text, [ln for ln in text.splitlines() if "collective_duration" in ln][:5]


def test_r2ccl_debug_logs_from_python(tmp_path):
    """R2CCL_DEBUG works in a Python program as in a Rust one: the failover is logged."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "logs.py"
    script.write_text(textwrap.dedent("""
        import threading, numpy as np, r2ccl
        root = r2ccl.Root.create("127.0.0.1")
        uid = root.unique_id()
        def rank(r):
            c = r2ccl.Communicator(r, 2, uid, node=f"n{r}", nics=["lo", "lo"], root=root if r == 0 else None,
                                   fault_injection_from_env=True)
            x = np.ones(1 << 18, dtype=np.float32)
            for _ in range(20):
                c.all_reduce(x)
            c.finalize()
        ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        [t.start() for t in ts]; [t.join() for t in ts]
    """))
    env = dict(os.environ, R2CCL_DEBUG="INFO", R2CCL_DEBUG_SUBSYS="NET",
               R2CCL_FAULT="rank=1,nic=0,after_msgs=20,kind=down")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "node1/nic0" in out.stderr and "INFO" in out.stderr, out.stderr[-2000:]


def test_the_cuda_entry_point_without_a_driver_is_a_device_error():
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("NOTE: a CUDA driver is present: the no-driver error does not apply here")
    except OSError:
        pass

    def body(comm):
        with pytest.raises(r2ccl.DeviceError, match="driver"):
            comm._c.start_cuda("all_reduce", "f32", 4, 0x1000, 16, 0x1000, 16, 0, [])
        comm.all_reduce(np.ones(4, dtype=np.float32))  # still usable
        return True

    assert run(1, body) == [True]
