"""DDP on the "r2ccl" backend, trained through a NIC failure: the losses match a fault-free run bit for bit.

Run ``python examples/ddp_train.py``: it trains a small MLP on synthetic data with
DistributedDataParallel, 4 processes on this machine (each its own node with 2 NICs on
loopback), twice: fault-free, then with NIC 0 of rank 1 going down in the middle of training
(software fault injection, ``R2CCL_FAULT``). It prints every step's loss of both runs and each
rank's failovers, and exits non-zero unless the two runs' losses are bit-identical.

Under ``torchrun --nproc-per-node 4 examples/ddp_train.py`` it trains once, bootstrapping
through torchrun's store; ``R2CCL_FAULT`` (with ``R2CCL_TEST_FAULT_INJECTION=1``) injects
faults there too.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

STEPS = 40
WORLD = 4
FAULT = "rank=1,nic=0,after_bytes=4M,kind=down"


def train(rank: int, world: int, store_file: str = "") -> None:
    """One rank: DDP training; rank 0 prints each step's loss (as the exact float's hex)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import r2ccl.torch as r2torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    if store_file:
        dist.init_process_group("r2ccl", store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    else:
        dist.init_process_group("r2ccl")  # torchrun's env:// store
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    ddp = DDP(model, bucket_cap_mb=0.25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    teacher = torch.randn(32, 10, generator=torch.Generator().manual_seed(7))  # the labels to learn
    t0 = time.monotonic()
    for step in range(STEPS):
        x = torch.randn(64, 32, generator=gen)
        y = (x @ teacher).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # DDP all-reduces the gradients, bucket by bucket, on r2ccl
        opt.step()
        # The global loss, so that every rank's contribution shows in what rank 0 prints.
        g = loss.detach().clone()
        dist.all_reduce(g)
        if rank == 0:
            print(f"LOSS {step} {g.item() / world:.9f} {g.item().hex()}", flush=True)
    took = time.monotonic() - t0
    comm = r2torch.get_backend().comm
    events = comm.take_events()
    failovers = [text for _, text in events if text.startswith("failover")]
    print(f"RANK {rank}: {STEPS} steps in {took:.2f} s; failed NICs agreed: {comm.failed_nics()}; "
          f"{len(failovers)} failovers, {len(events)} health events", flush=True)
    for _, text in events:
        print(f"  rank {rank} event: {text}", flush=True)
    dist.destroy_process_group()


def launch(fault: str) -> list:
    """Run WORLD ranks, with `fault` injected when not empty; rank 0's loss lines."""
    with tempfile.TemporaryDirectory() as d:
        procs = []
        for rank in range(WORLD):
            env = dict(os.environ, R2CCL_NODE=f"node{rank}", R2CCL_NICS="lo,lo")
            if fault:
                env.update(R2CCL_FAULT=fault, R2CCL_TEST_FAULT_INJECTION="1")
            cmd = [sys.executable, __file__, "--rank", str(rank), "--store", os.path.join(d, "store")]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = []
        for rank, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                sys.exit(f"rank {rank} did not finish in 300 s")
            outs.append(out)
            if p.returncode != 0:
                print(out)
                sys.exit(f"rank {rank} exited with {p.returncode}")
        ranks = [line for out in outs for line in out.splitlines() if line.startswith("RANK")]
        for out in outs:
            for line in out.splitlines():
                if line.startswith("RANK") or line.startswith("  rank"):
                    print(line)
        if fault and not all("failed NICs agreed: [(1, 0)]" in line for line in ranks):
            sys.exit("the injected fault did not take effect on every rank: nothing was compared")
        return [line for line in outs[0].splitlines() if line.startswith("LOSS")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank is not None:
        return train(args.rank, WORLD, args.store)
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        return train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
    print(f"== run 1: fault-free ({WORLD} ranks x 2 NICs on loopback)")
    clean = launch("")
    print(f"== run 2: {FAULT}")
    faulted = launch(FAULT)
    print(f"{'step':>4} {'loss (fault-free)':>18} {'loss (NIC failure)':>19}")
    for a, b in zip(clean, faulted):
        _, step, va, _ = a.split()
        _, _, vb, _ = b.split()
        print(f"{step:>4} {va:>18} {vb:>19}{'' if a == b else '   <- differs'}")
    same = len(clean) == STEPS and clean == faulted
    print(f"losses bit-identical over {STEPS} steps: {'yes' if same else 'NO'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
