"""Functions every rank runs for the context-parallel tests, notebook and benchmark.

The reference is full attention on one process (:func:`reference`: PyTorch's
``scaled_dot_product_attention`` with ``enable_gqa``, fp32, autograd), computed by the
caller, not by the ranks. A rank returns its shards; the caller puts them back in sequence
order with ``ring_attention.unshard`` and compares.
"""

from __future__ import annotations

import time

import attention_blocks as blocks
import ring_attention as ra
import torch
import torch.distributed as dist
import torch.nn.functional as F
from attention_blocks import _box
from ring_attention import CPConfig
from shardlab.accounting import context
from shardlab.runtime import CommTrace, MemoryTrace

VARIANTS = {"ring": ra.ring_attention, "all_gather": ra.allgather_attention}
Q_BYTES = 4  # fp32


def make_inputs(cfg: CPConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Full-sequence ``q (b, h, s, d)``, ``k, v (b, h_kv, s, d)`` and an output gradient."""
    g = torch.Generator().manual_seed(seed)
    b, h, hk, s, d = cfg.batch, cfg.heads, cfg.kv_heads, cfg.s, cfg.head_dim
    return {
        "q": torch.randn(b, h, s, d, generator=g),
        "k": torch.randn(b, hk, s, d, generator=g),
        "v": torch.randn(b, hk, s, d, generator=g),
        "dout": torch.randn(b, h, s, d, generator=g),
    }


def reference(cfg: CPConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Full attention on one process: output and dQ, dK, dV."""
    x = make_inputs(cfg, seed)
    q, k, v = (x[n].clone().requires_grad_(True) for n in "qkv")
    out = F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal, enable_gqa=True)
    out.backward(x["dout"])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


class _Timed:
    """Stand-in for ``ring_attention.block_attention``/``block_grads`` that adds up the CPU
    seconds of this thread spent in it (``time.thread_time``: the rank's compute, neither its
    waiting nor the time other processes hold the shared cores) and the score elements it
    computed."""

    def __init__(self, fn, rows_cols):
        self.fn, self.rows_cols, self.seconds, self.pairs = fn, rows_cols, 0.0, 0

    def __call__(self, *args):
        t0 = time.thread_time()  # intra-op threads are 1 per rank: all compute is on this one
        res = self.fn(*args)
        self.seconds += time.thread_time() - t0
        if res is not None:
            self.pairs += self.rows_cols(res, args)
        return res


def _fwd_pairs(res, args):  # rows x keys of the box computed
    r0, out, _ = res
    return out.shape[1] * out.shape[2] * _box_keys(args)


def _box_keys(args):
    q_pos, k_pos, causal = args[3], args[4], args[5]
    box = _box(q_pos, k_pos, causal)
    return 0 if box is None else box[1]


def run_case(cfg: CPConfig, variant: str = "ring", seed: int = 0, timed: bool = False) -> dict:
    """One forward + backward of ``variant`` on this rank's shard; shards, bytes, compute."""
    c, r = dist.get_world_size(), dist.get_rank()
    if c != cfg.c:
        raise ValueError(f"cfg.c={cfg.c} but the launch has {c} ranks")
    x = make_inputs(cfg, seed)
    mine = {n: ra.shard(t, r, c, cfg.zigzag) for n, t in x.items()}
    q, k, v = (mine[n].requires_grad_(True) for n in "qkv")
    fwd = bwd = None
    if timed:  # count this rank's own compute, not its waiting (whichever name it is called by)
        fwd = _Timed(blocks.block_attention, _fwd_pairs)
        bwd = _Timed(blocks.block_grads, lambda res, a: 0)
        for mod in (ra, blocks):
            mod.block_attention, mod.block_grads = fwd, bwd
    try:
        dist.barrier()
        with CommTrace() as tr:
            t0 = time.perf_counter()
            with tr.phase("forward"):
                out = VARIANTS[variant](q, k, v, None, cfg.causal, cfg.zigzag)
            t1 = time.perf_counter()
            with tr.phase("backward"):
                out.backward(mine["dout"])
            t2 = time.perf_counter()
    finally:
        if timed:
            for mod in (ra, blocks):
                mod.block_attention, mod.block_grads = fwd.fn, bwd.fn
    row = {
        "out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad,
        "sent": {ph: tr.sent_bytes(phase=ph) for ph in ("forward", "backward")},
        "ops": sorted({rec.op for rec in tr.records}),
        "messages": {ph: len(tr.select(phase=ph)) for ph in ("forward", "backward")},
        "wall": {"forward": t1 - t0, "backward": t2 - t1},
    }
    if timed:
        row["compute"] = {"forward": fwd.seconds, "backward": bwd.seconds}
        row["pairs"] = fwd.pairs
    return row


def check_all(cases: list[tuple[CPConfig, str]], seed: int = 0) -> list[dict]:
    """:func:`run_case` for every ``(cfg, variant)`` (all with ``cfg.c`` = world size)."""
    return [run_case(cfg, variant, seed) for cfg, variant in cases]


def predicted_bytes(cfg: CPConfig, variant: str, phase: str) -> float:
    return context.cp_volume(
        cfg.batch, cfg.s, cfg.kv_heads, cfg.head_dim, cfg.c, Q_BYTES, 1, variant, phase
    )


def compare(rows: list[dict], cfg: CPConfig, seed: int = 0) -> dict[str, float]:
    """Max |distributed - full attention| over the output and dQ, dK, dV."""
    ref = reference(cfg, seed)
    return {
        name: (ra.unshard([row[name] for row in rows], cfg.zigzag) - ref[name]).abs().max().item()
        for name in ("out", "dq", "dk", "dv")
    }


def timing(cfg: CPConfig, variant: str = "ring", repeats: int = 3, seed: int = 0) -> dict:
    """Per-rank compute seconds (median of ``repeats``) and score elements of one fwd+bwd."""
    runs = [run_case(cfg, variant, seed, timed=True) for _ in range(repeats + 1)][1:]  # warm-up
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {
        "rank": dist.get_rank(),
        "forward_s": med([x["compute"]["forward"] for x in runs]),
        "backward_s": med([x["compute"]["backward"] for x in runs]),
        "wall_s": med([x["wall"]["forward"] + x["wall"]["backward"] for x in runs]),
        "pairs": runs[0]["pairs"],
    }


def memory(cfg: CPConfig, variant: str, seed: int = 0, group=None, repeats: int = 3) -> dict:
    """Peak bytes allocated inside one forward in ``group``, above what was live before it
    (rank inputs and everything else excluded), measured with ``MemoryTrace``.

    The least of ``repeats`` forwards: gloo runs a collective on one of its worker threads,
    and that thread drops its reference to the output buffer (``_gather_kv``'s ``buf``) only
    after waking the caller; on a loaded machine it can be descheduled in between while the
    caller allocates on, so one forward in a few counts a buffer the program had already
    released (measured: +8,192 B at c = 4, s = 64 on every rank of one loaded run). The
    program's own peak is the least of the repeats."""
    c, r = dist.get_world_size(group), dist.get_rank(group)
    x = make_inputs(cfg, seed)
    q, k, v = (ra.shard(x[n], r, c, cfg.zigzag).requires_grad_(True) for n in "qkv")
    del x
    peaks = []
    for _ in range(repeats):
        dist.barrier(group)
        with MemoryTrace() as mt:
            mt.tag([q, k, v], "other")
            base = sum(t.untyped_storage().nbytes() for t in (q, k, v))
            out = VARIANTS[variant](q, k, v, group, cfg.causal, cfg.zigzag)
        peaks.append(mt.timeline().peak - base)
        del out
    return {"rank": r, "s": cfg.s, "variant": variant, "measured": min(peaks)}


def equivalence_cases(c: int, s: int = 32) -> list[tuple[CPConfig, str]]:
    """Causal and not, contiguous and zig-zag, ring and all-gather (GQA: 4 query heads, 2 K/V)."""
    return [
        (CPConfig(s=s, c=c, causal=causal, zigzag=zigzag), variant)
        for causal in (True, False)
        for zigzag in (False, True)
        for variant in ("ring", "all_gather")
    ]


MEMORY_SEQS = (64, 128, 256)


def report(seqs: tuple[int, ...] = MEMORY_SEQS, extra: tuple = ()) -> dict:
    """One launch for the tests and the notebook: every equivalence case, plus the forward
    memory of both variants (non-causal) at each sequence length in ``seqs``."""
    c = dist.get_world_size()
    cases = [*equivalence_cases(c), *extra]
    mem = [
        memory(CPConfig(s=s, c=c, causal=False), variant)
        for variant in ("ring", "all_gather")
        for s in seqs
    ]
    return {"cases": cases, "runs": check_all(cases), "memory": mem}


def memory_prediction(cfg: CPConfig, variant: str) -> dict[str, float]:
    return context.attention_memory(
        cfg.batch, cfg.s, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.c, variant, Q_BYTES
    )


def subgroup_case(cfg: CPConfig, variant: str = "ring", seed: int = 0) -> dict:
    """Ring attention inside one of two interleaved groups of a 4-rank world ([0, 2], [1, 3])."""
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    r = dist.get_rank()
    group = groups[r % 2]
    x = make_inputs(cfg, seed + r % 2)  # the two groups attend over different sequences
    me = dist.get_rank(group)
    mine = {n: ra.shard(t, me, cfg.c, cfg.zigzag) for n, t in x.items()}
    q, k, v = (mine[n].requires_grad_(True) for n in "qkv")
    out = VARIANTS[variant](q, k, v, group, cfg.causal, cfg.zigzag)
    out.backward(mine["dout"])
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "seed": seed + r % 2}


GQA_CASES = (  # (cfg, variant): MQA with b=2, MHA, odd head_dim; c=4
    (CPConfig(s=48, c=4, heads=4, kv_heads=1, batch=2, causal=True, zigzag=True), "ring"),
    (CPConfig(s=32, c=4, heads=4, kv_heads=4, head_dim=8, causal=True), "ring"),
    (CPConfig(s=48, c=4, heads=6, kv_heads=2, head_dim=12, causal=False, zigzag=True), "ring"),
    (CPConfig(s=48, c=4, heads=4, kv_heads=1, batch=2, causal=True, zigzag=True), "all_gather"),
)


def hidden_report() -> dict:
    """Hidden tests, one 4-rank launch: GQA/MQA/MHA cases, work per rank with and without
    zig-zag, the all-gather variant's memory, and ring attention inside sub-groups."""
    runs = check_all(list(GQA_CASES))
    work = {
        zz: run_case(CPConfig(s=64, c=4, causal=True, zigzag=zz), "ring", timed=True)["pairs"]
        for zz in (False, True)
    }
    mem = [memory(CPConfig(s=s, c=4, causal=False), "all_gather") for s in (64, 128)]
    sub = subgroup_case(CPConfig(s=32, c=2, causal=True, zigzag=True))
    return {"runs": runs, "work": work, "memory": mem, "sub": sub}


def balance(s: int = 512, repeats: int = 3) -> dict:
    """Per-rank causal ring compute (seconds, score elements) without and with zig-zag."""
    c = dist.get_world_size()
    return {
        zz: timing(CPConfig(s=s, c=c, heads=4, kv_heads=2, head_dim=32, zigzag=zz), "ring", repeats)
        for zz in (False, True)
    }
