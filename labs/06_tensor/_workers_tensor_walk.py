"""What the lab notebook's exercises check on real ranks, one part of the lab at a time.

The communication in ``tensor.py`` only does something with two or more ranks (with one,
every collective is skipped), so each exercise is checked on 2 ranks against one process:
the sequence collectives, the four operators alone, a column-parallel -> row-parallel pair
of linears, the vocabulary-parallel embedding and loss, attention and the MLP, one block,
and finally the whole model. :func:`walk_report` runs all of them, the notebook's measured
sections (bytes, saved activations, DTensor) and a small benchmark in ONE launch; the
notebook reads it section by section. A section whose code still holds a
``NotImplementedError`` stub returns ``{"error": ...}`` instead of stopping the launch, so
the parts already written are checked while the student works on the next one.

Every tensor is built on every rank from a seed (the same numbers everywhere); a rank keeps
its slice: its sequence positions under sequence parallelism, its rows or columns of a
weight gradient. Max |difference| is reported; the notebook compares it with its tolerances
(the public tests' for the whole model, ``test_tensor.py``).
"""

from __future__ import annotations

import _workers_tensor as W
import benchmark_tensor as B
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _workers_tensor import BATCH, MODEL, SEED
from shardlab.runtime import CommTrace
from tensor import TPGroups
from tensor_reference import SerialGPT, make_batch

BENCH = dict(h=128, a=4, ffn=384, seq=64, vocab=64)  # the notebook's benchmark size
BENCH_STEPS = 5


def _data(shape, seed: int) -> torch.Tensor:
    """The same numbers on every rank (a seeded CPU generator; ``device`` follows it)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, device=gen.device)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b|, or inf when the shapes differ (a wrong layout, not a rounding)."""
    return float("inf") if a.shape != b.shape else (a - b).abs().max().item()


def _mine(x: torch.Tensor, groups: TPGroups, dim: int) -> torch.Tensor:
    """This rank's 1/t slice of ``x`` along ``dim``."""
    return x.chunk(groups.tp, dim=dim)[groups.tp_rank]


def _ops(tr: CommTrace, phase: str) -> list[str]:
    return [r.op for r in tr.select(phase=phase)]


def seq_collectives(b: int = 2, s: int = 8, h: int = 3) -> dict:
    """Exercise 1: ``all_gather_seq`` and ``reduce_scatter_seq`` against cat and sum; the
    bytes each sends against the ring model."""
    import tensor as T
    from shardlab.accounting import comm

    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    shards = [_data((b, s // t, h), 10 + k) for k in range(t)]  # rank k's (b, s/t, h) shard
    partials = [_data((b, s, h), 20 + k) for k in range(t)]  # rank k's (b, s, h) partial sum
    x, y = shards[groups.tp_rank].clone(), partials[groups.tp_rank].clone()
    with CommTrace() as tr:
        with tr.phase("gather"):
            full = T.all_gather_seq(x, groups)
        with tr.phase("scatter"):
            mine = T.reduce_scatter_seq(y, groups)
    nbytes = 4 * b * s * h  # the full (b, s, h) fp32 tensor
    return {
        "gather_shape": tuple(full.shape), "gather": _diff(full, torch.cat(shards, 1)),
        "scatter_shape": tuple(mine.shape),
        "scatter": _diff(mine, _mine(sum(partials), groups, 1)),
        "inputs_untouched": torch.equal(x, shards[groups.tp_rank])
        and torch.equal(y, partials[groups.tp_rank]),
        "ops": {p: _ops(tr, p) for p in ("gather", "scatter")},
        "sent": {p: tr.sent_bytes(phase=p) for p in ("gather", "scatter")},
        "ring": {"gather": comm.ring_sent_bytes("all_gather", nbytes, t),
                 "scatter": comm.ring_sent_bytes("reduce_scatter", nbytes, t)},
    }


def linear_rows(model=MODEL) -> list[dict]:
    """Exercise 3: ``ColumnParallelLinear`` -> ``RowParallelLinear`` (the MLP's fc and proj,
    without the GeLU) against the two ``nn.Linear`` in one process: output, input gradient
    and every weight and bias gradient (this rank's rows or columns), and the collectives
    each direction runs."""
    import tensor as T

    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    serial = SerialGPT(model).blocks[0]
    fc, proj = serial.fc, serial.proj  # (ffn, h) and (h, ffn)
    x_full = _data((BATCH, model.seq, model.h), 31)  # (b, s, h)
    w_full = _data((BATCH, model.seq, model.h), 32)  # weights of the scalar we differentiate
    xs = x_full.clone().requires_grad_()
    ys = proj(fc(xs))
    (ys * w_full).sum().backward()
    rows = []
    for mode, sp, rg in (("tp", False, True), ("tp_sp re-gather", True, True),
                         ("tp_sp keep", True, False)):
        col = T.ColumnParallelLinear(fc.weight, fc.bias, groups, sp, rg)
        row = T.RowParallelLinear(proj.weight, proj.bias, groups, sp)
        x = (_mine(x_full, groups, 1) if sp else x_full).clone().requires_grad_()
        w = _mine(w_full, groups, 1) if sp else w_full
        with CommTrace() as tr:
            with tr.phase("forward"):
                y = row(col(x))  # (b, s, h), or (b, s/t, h) under SP
            with tr.phase("backward"):
                (y * w).sum().backward()
        # under SP the replicated bias of proj saw only this rank's positions: sum over ranks
        pb = T.all_reduce(row.bias.grad, groups) if sp else row.bias.grad
        grads = [
            _diff(col.weight.grad, _mine(fc.weight.grad, groups, 0)),
            _diff(col.bias.grad, _mine(fc.bias.grad, groups, 0)),
            _diff(row.weight.grad, _mine(proj.weight.grad, groups, 1)),
            _diff(pb, proj.bias.grad),
        ]
        want_y = _mine(ys, groups, 1) if sp else ys
        want_gx = _mine(xs.grad, groups, 1) if sp else xs.grad
        rows.append({
            "mode": mode, "out_shape": tuple(y.shape), "output": _diff(y, want_y.detach()),
            "input_grad": _diff(x.grad, want_gx), "weight_grads": max(grads),
            "forward_ops": _ops(tr, "forward"), "backward_ops": _ops(tr, "backward"),
        })
    return rows


def embedding_rows(model=MODEL) -> list[dict]:
    """Exercise 4: ``VocabParallelEmbedding`` against ``F.embedding`` of the whole table:
    output (this rank's positions under SP) and this rank's rows of the weight gradient."""
    import tensor as T

    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    table = SerialGPT(model).tok.weight.detach()  # (V, h)
    idx, _ = make_batch(model, BATCH)  # (b, s) token ids over the whole vocabulary
    w_full = _data((BATCH, model.seq, model.h), 41)
    ref_w = table.clone().requires_grad_()
    ref = F.embedding(idx, ref_w)  # (b, s, h)
    (ref * w_full).sum().backward()
    rows = []
    for sp in (False, True):
        emb = T.VocabParallelEmbedding(table, groups, sp)
        with CommTrace() as tr:
            out = emb(idx)
            (out * (_mine(w_full, groups, 1) if sp else w_full)).sum().backward()
        rows.append({
            "sp": sp, "rows": f"{emb.lo}..{emb.lo + emb.weight.shape[0] - 1}",
            "out_shape": tuple(out.shape),
            "output": _diff(out, (_mine(ref, groups, 1) if sp else ref).detach()),
            "weight_grad": _diff(emb.weight.grad, _mine(ref_w.grad, groups, 0)),
            "ops": [r.op for r in tr.records],
        })
    return rows


def attention_mlp_rows(model=MODEL) -> list[dict]:
    """Exercise 6: ``ParallelAttention`` (with and without selective recompute) and
    ``ParallelMLP`` against the same computation on all heads and columns in one process
    (the attention dropout mask included): output and input gradient."""
    from tensor_block import ParallelAttention, ParallelMLP, TPConfig
    from tensor_reference import attention_core, dropout_mask, merge_heads, split_heads

    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    serial = SerialGPT(model).blocks[0]
    x_full = _data((BATCH, model.seq, model.h), 51)
    w_full = _data((BATCH, model.seq, model.h), 52)

    def attention(x):  # all a heads, the full (b, a, s, s) mask
        q, k, v = (split_heads(p(x), model.a) for p in (serial.q_proj, serial.k_proj,
                                                         serial.v_proj))
        mask = dropout_mask((BATCH, model.a, model.seq, model.seq), model.attn_dropout, SEED,
                            serial.layer, "attn", x.device)
        return serial.o_proj(merge_heads(attention_core(q, k, v, mask, model.attn_dropout)))

    def mlp(x):
        return serial.proj(F.gelu(serial.fc(x)))

    refs = {}
    for part, fn in (("attention", attention), ("mlp", mlp)):
        xs = x_full.clone().requires_grad_()
        y = fn(xs)
        (y * w_full).sum().backward()
        refs[part] = (y.detach(), xs.grad)
    rows = []
    for part, sp, rc in (("attention", False, "none"), ("attention", False, "selective"),
                         ("attention", True, "none"), ("attention", True, "selective"),
                         ("mlp", False, "none"), ("mlp", True, "none")):
        cfg = TPConfig(model, t, sp, rc)
        mod = (
            ParallelAttention(serial, groups, cfg)
            if part == "attention"
            else ParallelMLP(serial, groups, cfg)
        )
        x = (_mine(x_full, groups, 1) if sp else x_full).clone().requires_grad_()
        y = mod(x, SEED) if part == "attention" else mod(x)
        (y * (_mine(w_full, groups, 1) if sp else w_full)).sum().backward()
        want_y, want_gx = (_mine(z, groups, 1) if sp else z for z in refs[part])
        rows.append({"part": part, "sp": sp, "recompute": rc, "output": _diff(y.detach(), want_y),
                     "input_grad": _diff(x.grad, want_gx)})
    return rows


def block_rows(model=MODEL) -> list[dict]:
    """Exercise 7: ``ParallelBlock`` (output dropout, full recompute) against
    ``SerialBlock``: output, input gradient, and the LayerNorm weight gradient before and
    after summing it over the ranks (under SP each rank's is partial)."""
    import tensor as T
    from tensor_block import ParallelBlock, TPConfig

    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    serial = SerialGPT(model).blocks[1]  # layer 1: its own dropout masks
    x_full = _data((BATCH, model.seq, model.h), 61)
    w_full = _data((BATCH, model.seq, model.h), 62)
    xs = x_full.clone().requires_grad_()
    ys = serial(xs, SEED)
    (ys * w_full).sum().backward()
    rows = []
    for sp, rc in ((False, "none"), (False, "full"), (True, "none"), (True, "full")):
        blk = ParallelBlock(serial, groups, TPConfig(model, t, sp, rc))
        x = (_mine(x_full, groups, 1) if sp else x_full).clone().requires_grad_()
        y = blk(x, SEED)
        (y * (_mine(w_full, groups, 1) if sp else w_full)).sum().backward()
        ln = blk.ln1.weight.grad
        rows.append({
            "sp": sp, "recompute": rc,
            "output": _diff(y.detach(), (_mine(ys, groups, 1) if sp else ys).detach()),
            "input_grad": _diff(x.grad, _mine(xs.grad, groups, 1) if sp else xs.grad),
            "ln_local": _diff(ln, serial.ln1.weight.grad),
            "ln_summed": _diff(T.all_reduce(ln, groups) if sp else ln, serial.ln1.weight.grad),
        })
    return rows


def _section(fn, *args, **kwargs):
    """One part of the report; a function still holding its stub shows up in its own part."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        return {"error": f"NotImplementedError: {e}"}


def walk_report() -> dict | None:
    """Every exercise check and every 2-rank measurement of the notebook from one launch
    (rank 0 returns the report)."""
    rep = {
        "t": dist.get_world_size(),
        "seq": _section(seq_collectives),
        "operators": W.operator_rows(),  # catches a missing operator per operator
        "linears": _section(linear_rows),
        "embedding": _section(embedding_rows),
        "loss": _section(W.loss_comm),
        "attention_mlp": _section(attention_mlp_rows),
        "block": _section(block_rows),
        "equality": _section(W.equality_rows, MODEL, W.RUNS),
        "comm": _section(W.comm_rows),
        "activations": _section(W.activation_rows),
        "dtensor": _section(W.dtensor_rows),
        "benchmark": [_section(B.benchmark, BENCH_STEPS, sp, 4, **BENCH) for sp in (False, True)],
    }
    return rep if dist.get_rank() == 0 else None
