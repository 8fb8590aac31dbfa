"""Worker functions for the launcher and trace tests (importable by spawned ranks)."""

from __future__ import annotations

import os
import signal
import sys
import time


def env_report(tag="x", scale=1):
    import torch
    import torch.distributed as dist
    from shardlab.runtime import device

    t = torch.ones(3) * (dist.get_rank() + 1) * scale
    dist.all_reduce(t)
    print(f"hello from {dist.get_rank()} tag={tag}")
    return {
        "rank": dist.get_rank(),
        "world": dist.get_world_size(),
        "env": {
            k: os.environ[k]
            for k in (
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "MASTER_ADDR",
                "MASTER_PORT",
            )
        },
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "threads": torch.get_num_threads(),
        "sum": t.tolist(),
        "device": str(device()),
        "backend": dist.get_backend(),
        "tag": tag,
        "marker": os.environ.get("SHARDLAB_TEST_MARKER"),
    }


def raise_on(rank_to_fail=1):
    import torch
    import torch.distributed as dist

    if dist.get_rank() == rank_to_fail:
        raise ValueError(f"boom on rank {dist.get_rank()}")
    t = torch.ones(2)
    dist.all_reduce(t)  # peers block here until the failing rank is gone
    time.sleep(30)
    return dist.get_rank()


def hang_on(rank_to_hang=1):
    import torch.distributed as dist

    if dist.get_rank() == rank_to_hang:
        _sleep_forever()
    dist.barrier()
    return dist.get_rank()


def _sleep_forever():
    while True:
        time.sleep(0.05)


def sigkill_on(rank_to_die=1):
    import torch
    import torch.distributed as dist

    if dist.get_rank() == rank_to_die:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.ones(2)
    dist.all_reduce(t)
    time.sleep(30)
    return dist.get_rank()


def exit_on(rank_to_exit=1, code=3):
    import torch.distributed as dist

    if dist.get_rank() == rank_to_exit:
        sys.stdout.flush()
        os._exit(code)
    dist.barrier()
    time.sleep(30)
    return dist.get_rank()


def spawn_grandchild_and_hang():
    """Start a sleeping grandchild (own session) and hang: the launcher must kill both."""
    import subprocess

    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    _sleep_forever()


def slow(seconds=1.0, steps=4):
    from shardlab.runtime import report_progress

    for i in range(steps):
        time.sleep(seconds / steps)
        report_progress(i + 1, steps)
    return "done"


def raise_all():
    import torch.distributed as dist

    raise KeyError(f"key{dist.get_rank()}")


def print_then_raise():
    import torch.distributed as dist

    print(f"before the error {dist.get_rank()}")
    raise RuntimeError("after printing")


# ----------------------------------------------------------------------------- trace workers


def trace_collectives(numel=12):
    import torch
    import torch.distributed as dist
    from shardlab.runtime import CommTrace

    d, r = dist.get_world_size(), dist.get_rank()
    with CommTrace() as tr:
        with tr.phase("ar"):
            t = torch.ones(numel)
            dist.all_reduce(t)
        with tr.phase("rs"):
            out = torch.empty(numel // d)
            dist.reduce_scatter_tensor(out, torch.ones(numel))
        with tr.phase("ag"):
            full = torch.empty(numel)
            dist.all_gather_into_tensor(full, torch.ones(numel // d))
            dist.all_gather([torch.empty(numel // d) for _ in range(d)], torch.ones(numel // d))
        with tr.phase("p2p"):
            x = torch.ones(5, dtype=torch.float64)
            if r == 0:
                dist.send(x, 1)
            elif r == 1:
                dist.recv(x, 0)
        with tr.phase("async"):
            w = dist.all_reduce(torch.ones(numel), async_op=True)
            w.wait()
            reqs = []
            if r == 0:
                reqs.append(dist.isend(torch.ones(3), 1))
            elif r == 1:
                reqs.append(dist.irecv(torch.empty(3), 0))
            for q in reqs:
                q.wait()
        with tr.phase("other"):
            dist.broadcast(torch.ones(numel), 0)
            dist.all_to_all_single(torch.empty(numel), torch.ones(numel))
            dist.barrier()
    return tr.records, tr.table()


def trace_ddp():
    import torch
    import torch.distributed as dist
    from shardlab.runtime import CommTrace
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    n = sum(p.numel() for p in model.parameters())
    with CommTrace() as tr:
        with tr.phase("setup"):
            ddp = DDP(model)
        with tr.phase("forward"):
            loss = ddp(torch.ones(2, 8) * (dist.get_rank() + 1)).sum()
        with tr.phase("backward"):
            loss.backward()
    return tr.records, n


def trace_fsdp2():
    import torch
    import torch.distributed as dist
    from shardlab.runtime import CommTrace
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    n = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with CommTrace() as tr:
        with tr.phase("forward"):
            loss = model(torch.ones(2, 8)).sum()
        with tr.phase("backward"):
            loss.backward()
    return tr.records, n


def memory_ddp(steps=1):
    import torch
    from shardlab.models import GPT, GPTConfig, make_batch
    from shardlab.runtime import CommTrace, MemoryTrace, phase
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=16)
    model = GPT(cfg)
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx, tgt = make_batch(cfg, 2, seed=1)
    out = {}
    with MemoryTrace() as mt, CommTrace() as ct:
        mt.watch(model, opt)
        ddp = DDP(model)
        for _ in range(steps):
            with phase("forward"):
                loss = ddp(idx, tgt)[1]
            with phase("backward"):
                loss.backward()
            out["param_grad"] = mt.live_bytes("parameters") + mt.live_bytes("gradients")
            with phase("optimizer"):
                opt.step()
            opt.zero_grad(set_to_none=True)
    out.update(pbytes=pbytes, timeline=mt.timeline(), comm=ct.records)
    return out


def overhead(steps=6, d_model=64, seq_len=32, batch=8):
    """Median step time of a tiny GPT under DDP without tracing, with CommTrace, with both."""
    import statistics
    import time

    import torch
    from shardlab.models import GPT, GPTConfig, make_batch
    from shardlab.runtime import CommTrace, MemoryTrace
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = GPTConfig(vocab_size=64, seq_len=seq_len, n_layer=2, n_head=4, d_model=d_model)
    model = DDP(GPT(cfg))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    idx, tgt = make_batch(cfg, batch, seed=0)

    def step():
        loss = model(idx, tgt)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def timed(ctx_factory):
        ts = []
        for _ in range(steps):
            t0 = time.perf_counter()
            with ctx_factory() as c:
                if isinstance(c, MemoryTrace):
                    c.watch(model, opt)
                step()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    import contextlib

    step()  # warm-up
    base = timed(contextlib.nullcontext)
    comm = timed(CommTrace)
    mem = timed(MemoryTrace)
    return {"base_s": base, "comm_ratio": comm / base, "memory_ratio": mem / base}
