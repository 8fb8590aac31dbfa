"""Rank functions and analysis of the pipeline lab (imported by the ranks, tests, notebook).

* :func:`check_all`: train 3 AdamW steps with every schedule on the launched ranks; return
  losses, weights and gradients (by the full model's parameter names), the bytes each rank
  sent in one step (``CommTrace``) and its saved-activation peak (``MemoryTrace``);
* :func:`reference`: the same 3 steps in one process, the same microbatches accumulated in
  order, and the ordinary full-batch run;
* :func:`faulty`: a rank raising in the middle of a schedule.

How a step is timed (the bubble) is in ``_timing_pipeline.py``; the side-by-side run against
``torch.distributed.pipelining`` is in ``benchmark_pipeline.py``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from pipeline import PipeConfig, PipelineExecutor, split_stages
from shardlab.accounting import pipeline as acc
from shardlab.models import GPT, GPTConfig, lm_loss, step_batch
from shardlab.testing import ulps

# n_layer 8: 8 virtual stages for p=4, v=2. "timing": one block costs ~10 ms per microbatch
# forward on one core, 1000x the loopback latency of its 64 KiB boundary tensor.
SIZES = {
    "test": dict(vocab_size=16, seq_len=8, n_layer=8, n_head=2, d_model=8),
    "timing": dict(vocab_size=32, seq_len=64, n_layer=8, n_head=4, d_model=128),
    "bench": dict(vocab_size=32, seq_len=64, n_layer=4, n_head=4, d_model=128),
}
SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)]
V_SCHEDULES = [("zbv", 2), ("dualpipev", 2)]  # two chunks per rank in a V


def schedules_for(p: int, m: int) -> list[tuple[str, int]]:
    """The schedules the public tests run on ``p`` ranks with ``m`` microbatches: the four
    of the notebook and the V schedules that accept ``(p, m)`` (dualpipev needs m >= 2p)."""
    return SCHEDULES + [(k, v) for k, v in V_SCHEDULES if k != "dualpipev" or m >= 2 * p]


def rank_stages(kind: str, p: int, v: int, rank: int) -> list[int]:
    """The virtual stages of ``rank``, chunk by chunk (``accounting.pipeline.virtual_stage``)."""
    return [acc.virtual_stage(rank, c, p, acc.placement(kind)) for c in range(v)]


LR, WD, STEPS = 1e-2, 0.1, 3
# Against the full-batch step only rounding differs (test_pipeline.py says why): the loss within
# FULL_BATCH_ULPS, every weight within FULL_BATCH_ATOL after STEPS AdamW steps. Seen on three
# kernel choices (AVX512, AVX2, default at one thread): up to 3e-7 at the tests' size and 1.0e-6
# at the notebook's; 4e-6 keeps a 4x margin for other CPUs and is still lr / 2500.
FULL_BATCH_ULPS, FULL_BATCH_ATOL = 4, 4e-6
# CPU kernels split their reductions over intra-op threads: the same thread count on the
# ranks and in the single-process reference, or the last bits differ
THREADS = 1


def config(size: str = "test") -> GPTConfig:
    return GPTConfig(**SIZES[size])


def microbatches(cfg: GPTConfig, step: int, n: int, m: int):
    """The ``m`` microbatches of step ``step`` as separate storages (a microbatch's tokens are
    then counted once per microbatch by MemoryTrace, not as one shared global buffer)."""
    idx, tgt = step_batch(cfg, step, n)
    return [t.clone() for t in idx.chunk(m)], [t.clone() for t in tgt.chunk(m)]


def build(cfg, kind, p, m, v, layers=None, seed=0):
    """This rank's chunks, its parameters by full-model name, and the executor."""
    model = GPT(cfg, seed=seed)
    stages = split_stages(model, p, v, layers)
    group = dist.group.WORLD
    mine = [stages[k] for k in rank_stages(kind, p, v, dist.get_rank())]  # r, r + p, ... or a V
    ids = {id(q) for ch in mine for q in ch.parameters()}
    named = {n: q for n, q in model.named_parameters() if id(q) in ids}
    return mine, named, PipelineExecutor(mine, PipeConfig(kind, p, m, v), group)


def _broadcast_loss(loss, p, kind="1f1b", v=1):
    t = torch.zeros(()) if loss is None else loss.detach().clone()
    # the last virtual stage lives on rank p - 1 (rank 0 in a V)
    dist.broadcast(t, src=acc.stage_rank(p * v - 1, p, acc.placement(kind)))
    return t


def train(cfg, kind, p, m, v, n, steps=STEPS, trace=False, layers=None):
    from shardlab.runtime import CommTrace, MemoryTrace

    mine, named, ex = build(cfg, kind, p, m, v, layers=layers)
    opt = torch.optim.AdamW(list(named.values()), lr=LR, weight_decay=WD)
    out = {"losses": [], "sent": None, "act_peak": None}
    out["bounds"] = [(ch.lo, ch.hi) for ch in mine]
    if trace:  # bytes one microbatch leaves saved on each chunk (forward only, then dropped)
        out["chunk_bytes"], out["kept_bytes"] = [], []
        xs, ys = microbatches(cfg, 0, n, m)
        for ch, k in zip(mine, rank_stages(kind, p, v, dist.get_rank())):
            shape = ex_shape(cfg, n, m)
            inp = xs[0] if k == 0 else torch.zeros(shape, device=xs[0].device).requires_grad_()
            with MemoryTrace() as mt:
                mt.watch(list(named.values()))  # weights saved by matmuls are not activations
                caps = []  # (input, output) of every weight-owning layer, as the executor's hook
                hooks = [
                    mod.register_forward_hook(lambda _m, a, o, c=caps: c.append((a[0].detach(), o)))
                    for mod in ch.modules()
                    if any(True for _ in mod.parameters(recurse=False))
                ]
                y = ch(inp)
                for hk in hooks:
                    hk.remove()
                if k == p * v - 1:
                    y = lm_loss_from_logits(y, ys[0], m)
                out["chunk_bytes"].append(mt.live_bytes("activations"))
                # a BI without the graph: what stays saved is the layers' inputs (kept_bytes)
                wanted = ([inp] if k > 0 else []) + [o for _, o in caps]
                grads = torch.autograd.grad(y, wanted, None if y.dim() == 0 else torch.ones_like(y))
                del y, grads, wanted
                caps = [xin for xin, _ in caps]
                # virtual stage 0's BI keeps everything for BW (pipeline.py says why)
                kept = out["chunk_bytes"][-1] if k == 0 else mt.live_bytes("activations")
                out["kept_bytes"].append(kept)
            del caps
    for step in range(steps):
        xs, ys = microbatches(cfg, step, n, m)
        opt.zero_grad(set_to_none=True)
        if trace and step == 0:
            with CommTrace() as tr:
                loss = ex.step(xs, ys)
            out["sent"] = tr.sent_bytes()
            out["sends"] = sum(r.op == "send" for r in tr.records)
        elif trace and step == 1:
            with MemoryTrace() as mt:
                mt.watch(list(named.values()))
                loss = ex.step(xs, ys)
            out["act_peak"] = max(mt.timeline().bytes["activations"])
        else:
            loss = ex.step(xs, ys)
        out["losses"].append(_broadcast_loss(loss, p, kind, v))
        out["order"] = [str(a) for _, _, a in ex.events]  # what really ran, in order
        if step == steps - 1:
            out["grads"] = {k: q.grad.clone() for k, q in named.items()}
        opt.step()
    out["weights"] = {k: q.detach().clone() for k, q in named.items()}
    return out


def ex_shape(cfg, n, m):
    return (n // m, cfg.seq_len, cfg.d_model)  # (b, s, h) boundary tensor of one microbatch


def lm_loss_from_logits(logits, y, m):
    from pipeline import microbatch_loss

    return microbatch_loss(logits, y, m)


def check_all(size="test", m=4, n=8, schedules=SCHEDULES, trace=True, layers=None):
    """Every schedule on the launched ranks; every rank returns its own report."""
    torch.set_num_threads(THREADS)
    cfg, p = config(size), dist.get_world_size()
    return {
        (kind, v): train(cfg, kind, p, m, v, n, trace=trace, layers=layers) for kind, v in schedules
    }


def launch_checks(p: int, m: int = 4, schedules=SCHEDULES, size="test", **kw):
    """Validate every ``(kind, p, m, v, n_layer)`` (a ``ValueError`` naming the values, before
    any rank starts), then run :func:`check_all` on ``p`` ranks."""
    from shardlab.runtime import launch

    for kind, v in schedules:
        acc.check_pipeline(kind, p, m, v, None if kw.get("layers") else config(size).n_layer)
    return launch("_workers_pipeline:check_all", p, size, m, 2 * m, schedules, quiet=True, **kw)


def reference(size="test", m=4, n=8, steps=STEPS, full_batch=False):
    """One process: the same AdamW steps, the ``m`` microbatches accumulated in order (or the
    whole batch at once with ``full_batch``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        return _reference(size, m, n, steps, full_batch)
    finally:
        torch.set_num_threads(threads)


def _reference(size, m, n, steps, full_batch):
    cfg = config(size)
    model = GPT(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    losses = []
    for step in range(steps):
        xs, ys = microbatches(cfg, step, n, m)
        opt.zero_grad(set_to_none=True)
        if full_batch:
            total = lm_loss(model, torch.cat(xs), torch.cat(ys))
            total.backward()
        else:
            total = None
            for x, y in zip(xs, ys):
                li = lm_loss(model, x, y) / m  # the mean over the global batch, in pieces
                li.backward()
                total = li.detach() if total is None else total + li.detach()
        losses.append(total.detach())
        if step == steps - 1:
            grads = {k: q.grad.clone() for k, q in model.named_parameters()}
        opt.step()
    return {"losses": losses, "grads": grads, "weights": dict(model.state_dict())}


def compare(reports: list[dict], ref: dict) -> dict:
    """Largest ulp distance of losses, last-step gradients and final weights over all ranks."""
    out = {"loss": 0, "grads": 0, "weights": 0, "params": 0, "max_abs": 0.0}
    for rep in reports:
        out["loss"] = max(out["loss"], *(ulps(a, b) for a, b in zip(rep["losses"], ref["losses"])))
        for what in ("grads", "weights"):
            for k, t in rep[what].items():
                out[what] = max(out[what], ulps(t, ref[what][k]))
                if what == "weights":
                    diff = (t - ref[what][k]).abs().max().item()
                    out["max_abs"] = max(out["max_abs"], diff)
        out["params"] += len(rep["weights"])
    out["params_total"] = len(ref["weights"])
    return out


def faulty(kind="1f1b", m=4, fail_rank=1, fail_at="F2"):
    """Raise inside action ``fail_at`` on ``fail_rank``; the other ranks block on a receive."""
    cfg, p = config("test"), dist.get_world_size()
    mine, named, ex = build(cfg, kind, p, m, 1)
    if dist.get_rank() == fail_rank:
        ex.stop_after = fail_at
    xs, ys = microbatches(cfg, 0, 8, m)
    ex.step(xs, ys)
    return "finished"
