"""torch.distributed all_reduce bus bandwidth and DDP step time: the "r2ccl" backend against gloo.

4 processes on this machine, each a node of its own (r2ccl: 2 NICs on loopback; gloo: its TCP
pairs over loopback), both backends in the same run, alternating, so that the ratio compares
like with like on a noisy machine. Prints one table and the ratios r2ccl / gloo.
With ``--ddp-hook N`` it instead times r2ccl's DDP step with and without
``r2ccl.torch.registered_allreduce_hook``, a fresh launch per measurement, alternating, N each.
Usage: python bench/torch_bench.py [--rounds N] [--ddp-hook N]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WORLD = 4
SIZES_MIB = [1, 4, 16, 64]


def worker(backend: str, rank: int, store: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    # "ddp_plain" and "ddp_hook": r2ccl's DDP step only, without and with the registered hook.
    ddp_only = backend.startswith("ddp_")
    if backend == "r2ccl" or ddp_only:
        import r2ccl.torch  # noqa: F401
    torch.set_num_threads(1)
    dist.init_process_group("r2ccl" if ddp_only else backend, store=dist.FileStore(store, WORLD), rank=rank,
                            world_size=WORLD)
    out = {"busbw": {}, "busbw_registered": {}, "ddp_step_ms": None}

    def busbw(t: "torch.Tensor", mib: int) -> float:
        # At least 8 timed calls: with 3 (before 2026-12-07) one slow call moved a 16 MiB ratio
        # from 0.98x to 0.64x.
        iters = max(8, 128 // mib)
        for _ in range(2):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        dt = (time.perf_counter() - t0) / iters
        return t.numel() * 4 * 2 * (WORLD - 1) / WORLD / dt / 1e9

    for mib in [] if ddp_only else SIZES_MIB:
        n = mib * (1 << 20) // 4
        out["busbw"][mib] = busbw(torch.ones(n, dtype=torch.float32), mib)
        if backend == "r2ccl":
            # The same on a tensor in registered memory (r2ccl.torch.empty): no copy in or out.
            reg = r2ccl.torch.empty(n, dtype=torch.float32)
            reg.fill_(1.0)
            out["busbw_registered"][mib] = busbw(reg, mib)
            del reg

    def ddp_step_ms(hook: bool) -> float:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                                    torch.nn.ReLU(), torch.nn.Linear(2048, 512))
        ddp = DDP(model)
        if hook:
            ddp.register_comm_hook(None, r2ccl.torch.registered_allreduce_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(32, 512)
        steps = []
        for i in range(12):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()
            steps.append(time.perf_counter() - t0)
        steps = sorted(steps[2:])
        return steps[len(steps) // 2] * 1e3

    out["ddp_step_ms"] = ddp_step_ms(backend == "ddp_hook")
    if backend == "r2ccl":
        # The same with r2ccl.torch.registered_allreduce_hook: buckets through registered tensors.
        out["ddp_step_ms_hook"] = ddp_step_ms(True)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def launch(backend: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        procs = []
        for rank in range(WORLD):
            env = dict(os.environ, R2CCL_NODE=f"node{rank}", OMP_NUM_THREADS="1")
            env.setdefault("R2CCL_NICS", "lo,lo")
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", backend, str(rank), os.path.join(d, "s")],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        for rank, p in enumerate(procs):
            if p.returncode != 0:
                sys.exit(f"{backend} rank {rank} failed:\n{outs[rank]}")
        line = next(ln for ln in outs[0].splitlines() if ln.startswith("RESULT "))
        return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", nargs=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--backends", default="gloo,r2ccl", help="comma-separated, run in this order each round")
    ap.add_argument("--ddp-hook", type=int, default=0, metavar="N",
                    help="time r2ccl's DDP step with and without the registered hook instead, N launches each")
    args = ap.parse_args()
    if args.worker:
        backend, rank, store = args.worker
        return worker(backend, int(rank), store)
    for _ in range(args.ddp_hook):
        for mode in ("ddp_plain", "ddp_hook"):
            print(f"{mode:>9}: DDP step {launch(mode)['ddp_step_ms']:.1f} ms", flush=True)
    if args.ddp_hook:
        return
    backends = args.backends.split(",")
    runs = {b: [] for b in backends}
    for _ in range(args.rounds):
        for backend in backends:
            runs[backend].append(launch(backend))
    if backends != ["gloo", "r2ccl"]:
        print(json.dumps(runs))
        return

    def best(backend, key, mib=None):
        vals = [r[key][str(mib)] if mib is not None else r[key] for r in runs[backend]]
        return max(vals) if key == "busbw" else min(vals)

    nics = os.environ.get("R2CCL_NICS", "lo,lo")
    print(f"torch.distributed, {WORLD} processes on one host (r2ccl: each a node, NICs {nics}); "
          f"best of {args.rounds} alternating rounds")
    print(f"{'all_reduce float32':>20} {'gloo GB/s':>10} {'r2ccl GB/s':>11} {'r2ccl/gloo':>11}"
          f" {'registered':>11} {'reg/gloo':>9}")
    for mib in SIZES_MIB:
        g, r = best("gloo", "busbw", mib), best("r2ccl", "busbw", mib)
        rr = best("r2ccl", "busbw_registered", mib)
        print(f"{str(mib) + ' MiB':>20} {g:>10.3f} {r:>11.3f} {r / g:>10.2f}x {rr:>11.3f} {rr / g:>8.2f}x")
    g, r = best("gloo", "ddp_step_ms"), best("r2ccl", "ddp_step_ms")
    h = best("r2ccl", "ddp_step_ms_hook")
    print(f"{'DDP step (5.2M params)':>20} {g:>8.1f} ms {r:>8.1f} ms {r / g:>10.2f}x {h:>8.1f} ms {h / g:>7.2f}x"
          " (time: lower is better; registered: r2ccl.torch.registered_allreduce_hook)")


if __name__ == "__main__":
    main()
