"""Rank-side checks of Lab 08, launched by the tests and the notebook via ``shardlab.runtime.launch``.

Every rank rebuilds the same global batch (all ranks' tokens, rank 0's first) and the same
weights from a seed, runs the student's expert-parallel layer on its own slice, and compares
the output, the load-balancing loss and every gradient with :func:`reference_moe`, an
independent single-process MoE with the same routing and the same drop rule. Bytes are
measured from the split sizes the all-to-alls were actually called with (:class:`SplitTrace`).
Results come back as small plain-Python dicts; the caller asserts on them.
"""

from __future__ import annotations

import moe as M
import torch
import torch.distributed as dist
import torch.nn.functional as F
from shardlab.accounting import expert as acc
from shardlab.accounting.mesh import Mesh, moe_fold
from shardlab.runtime import CommTrace, launch
from shardlab.runtime.once_per_run import once_per_run
from torch.utils._python_dispatch import TorchDispatchMode

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def reference_moe(x: torch.Tensor, params: dict, cfg: M.MoEConfig):
    """Single-process MoE on all ``N`` tokens ``x (N, h)``: ``(y, aux, kept_per_token_expert)``.

    Expert ``e`` keeps the first ``C`` tokens (in index order) that chose it; the rest of its
    copies are dropped. Written without the student's helpers.
    """
    n, _ = x.shape
    logits = x @ params["router"]  # (N, E)
    probs = logits.softmax(-1)
    top, chosen = logits.topk(cfg.top_k, dim=-1)
    gates = top.softmax(-1)
    cap = acc.capacity(n, cfg.num_experts, cfg.top_k, cfg.capacity_factor)
    y = torch.zeros_like(x)
    kept_tokens = []
    for e in range(cfg.num_experts):
        tok, slot = (chosen == e).nonzero(as_tuple=True)  # token order
        tok, slot = tok[:cap], slot[:cap]
        out = F.gelu(x[tok] @ params["w1"][e]) @ params["w2"][e]
        y = y.index_add(0, tok, gates[tok, slot].unsqueeze(1) * out)
        kept_tokens.append(tok)
    f = torch.bincount(chosen.reshape(-1), minlength=cfg.num_experts).to(x.dtype)
    f = f / (cfg.top_k * n)
    aux = cfg.aux_loss_coef * cfg.num_experts * (f * probs.mean(0)).sum()
    return y, aux, kept_tokens, chosen


class SplitTrace(TorchDispatchMode):
    """Records the bytes each ``all_to_all_single`` on this rank sends to *other* ranks.

    ``CommTrace`` models an all-to-all as uniform (``V (D-1)/D``); with uneven splits the truth
    is in the call's ``input_split_sizes``, which this mode reads off the ``c10d`` operator.
    """

    def __init__(self, group_rank: int):
        super().__init__()
        self.me = group_rank
        self.phase = ""
        self.records: list[dict] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d" and func._schema.name == "c10d::alltoall_base_":
            names = [a.name for a in func._schema.arguments]
            bound = dict(zip(names, args)) | kwargs
            inp, splits = bound["input"], list(bound["input_split_sizes"])
            row = inp[0].numel() * inp.element_size() if inp.shape[0] else 0
            if not splits:  # empty split list = even split
                splits = [inp.shape[0] // len(bound["output_split_sizes"] or [1])]
            sent = sum(s for d, s in enumerate(splits) if d != self.me) * row
            self.records.append(
                {
                    "phase": self.phase,
                    "splits": splits,
                    "sent": sent,
                    "in_bytes": inp.numel() * inp.element_size(),
                }
            )
        return func(*args, **kwargs)


def global_batch(cfg: M.MoEConfig, tokens_per_rank: int, seed: int, dtype) -> torch.Tensor:
    """All tokens of the EP group ``(ep * T, h)``, rank 0's first, with a skewed router input."""
    g = torch.Generator().manual_seed(10_007 * seed + 17)
    x = torch.randn(cfg.ep * tokens_per_rank, cfg.hidden, generator=g, dtype=torch.float64)
    return x.to(dtype)


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max()) if a.numel() else 0.0


def check_moe(
    cfg: M.MoEConfig,
    tokens_per_rank: int,
    seed: int = 0,
    dtype: str = "float64",
    group_ranks: list[int] | None = None,
) -> dict:
    """Forward + backward of the EP layer against :func:`reference_moe`; bytes measured."""
    dt = DTYPES[dtype]
    group = dist.new_group(group_ranks) if group_ranks is not None else None
    if group_ranks is not None and dist.get_rank() not in group_ranks:
        return {}
    rank = dist.get_rank(group)
    t = tokens_per_rank
    params = M.init_params(cfg, seed, dt)
    x_full = global_batch(cfg, t, seed, dt)
    w_out = torch.randn(
        x_full.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64
    ).to(dt)  # makes every output element matter

    # single-process reference (every rank computes it; the sizes are tiny)
    ref_p = {n: p.clone().requires_grad_() for n, p in params.items()}
    ref_x = x_full.clone().requires_grad_()
    y_ref, aux_ref, kept_tok, chosen_ref = reference_moe(ref_x, ref_p, cfg)
    ((y_ref * w_out).sum() + aux_ref).backward()

    # expert-parallel layer on this rank's slice
    mine = M.local_experts(params, cfg, rank)
    x = x_full[rank * t : (rank + 1) * t].clone().requires_grad_()
    st = SplitTrace(rank)
    with CommTrace() as tr, st:
        st.phase = "forward"
        y, aux, stats = M.moe_forward(x, mine, cfg, group)
        loss = (y * w_out[rank * t : (rank + 1) * t]).sum() + aux
        st.phase = "backward"
        loss.backward()
    aux_sum = aux.detach().clone()
    dist.all_reduce(aux_sum, group=group)  # the ranks' shares add up to the group's loss
    g_router = mine["router"].grad.clone()
    dist.all_reduce(g_router, group=group)  # router is replicated: its gradient is the sum
    lo, hi = rank * cfg.experts_per_rank, (rank + 1) * cfg.experts_per_rank
    ref_kept = [[int(((tok // t) == s).sum()) for tok in kept_tok] for s in range(cfg.ep)]
    return {
        "rank": rank,
        "err_y": _err(y, y_ref[rank * t : (rank + 1) * t]),
        "err_aux": _err(aux_sum, aux_ref),
        "err_dx": _err(x.grad, ref_x.grad[rank * t : (rank + 1) * t]),
        "err_drouter": _err(g_router, ref_p["router"].grad),
        "err_dw1": _err(mine["w1"].grad, ref_p["w1"].grad[lo:hi]),
        "err_dw2": _err(mine["w2"].grad, ref_p["w2"].grad[lo:hi]),
        "scale": float(y_ref.abs().max()),
        "counts": stats["counts"].tolist(),
        "kept": stats["kept"].tolist(),
        "ref_kept": ref_kept,
        "ref_counts": [
            torch.bincount(
                chosen_ref[s * t : (s + 1) * t].reshape(-1), minlength=cfg.num_experts
            ).tolist()
            for s in range(cfg.ep)
        ],
        "capacity": stats["capacity"],
        "dropped": stats["dropped"],
        "sent": {
            p: sum(r["sent"] for r in st.records if r["phase"] == p)
            for p in ("forward", "backward")
        },
        "a2a_calls": {p: sum(r["phase"] == p for r in st.records) for p in ("forward", "backward")},
        "a2a_in_bytes": sum(r["in_bytes"] for r in st.records),
        "trace_a2a_nbytes": sum(r.nbytes for r in tr.records if r.op == "all_to_all"),
        "ops": sorted({r.op for r in tr.records}),
        "elem": dt.itemsize,
        # what the grader compares with the reference solution's, outside the sandbox
        "values": [y.detach(), aux_sum, x.grad, g_router, mine["w1"].grad, mine["w2"].grad],
    }


def sweep_capacity(cfg: M.MoEConfig, tokens_per_rank: int, cfs: list[float], seed: int = 0) -> list:
    """Forward only at every capacity factor: counts, kept, dropped, rows received per rank."""
    from dataclasses import replace

    rank = dist.get_rank()
    params = M.init_params(cfg, seed)
    x_full = global_batch(cfg, tokens_per_rank, seed, torch.float32)
    x = x_full[rank * tokens_per_rank : (rank + 1) * tokens_per_rank]
    out = []
    for cf in cfs:
        c = replace(cfg, capacity_factor=cf)
        st = SplitTrace(rank)
        with torch.no_grad(), st:
            st.phase = "forward"
            _, _, stats = M.moe_forward(x, M.local_experts(params, c, rank), c)
        kept = stats["kept"]
        out.append(
            {
                "cf": cf,
                "capacity": stats["capacity"],
                "counts": stats["counts"].sum(0).tolist(),  # per expert, whole group
                "kept": kept.sum(0).tolist(),
                "rows_in": int(
                    kept[:, rank * c.experts_per_rank : (rank + 1) * c.experts_per_rank].sum()
                ),
                "dropped": stats["dropped"],
                "sent": sum(r["sent"] for r in st.records),
                "kept_matrix": kept.tolist(),
            }
        )
    return out


def check_all_to_all_rows(seed: int = 0, h: int = 3) -> dict:
    """``AllToAllRows`` alone: random uneven (some zero) splits, forward rows and gradients."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    splits = torch.randint(0, 4, (world, world), generator=g)  # splits[s][d] rows s -> d
    splits[0, world - 1] = 0  # at least one empty message
    ins = splits[rank].tolist()
    outs = splits[:, rank].tolist()
    # row i of rank s carries the value 1000*s + i in every column
    x = (1000.0 * rank + torch.arange(sum(ins), dtype=torch.float64)).unsqueeze(1).repeat(1, h)
    x.requires_grad_()
    y = M.AllToAllRows.apply(x, ins, outs, None)
    want = []
    for s in range(world):
        start = int(splits[s, :rank].sum())
        want += [1000.0 * s + start + i for i in range(int(splits[s, rank]))]
    ok_fwd = y.shape == (sum(outs), h) and torch.equal(
        y[:, 0], torch.tensor(want, dtype=torch.float64)
    )
    # gradient: weight each received row by (rank + 1); the sender must get exactly that back
    (y * (rank + 1)).sum().backward()
    grad_want = (
        torch.cat(
            [torch.full((n, h), float(d + 1), dtype=torch.float64) for d, n in enumerate(ins)]
        )
        if sum(ins)
        else torch.zeros(0, h)
    )
    ok_bwd = x.grad is not None and torch.equal(x.grad, grad_want.to(x.grad.dtype))
    return {"rank": rank, "forward": bool(ok_fwd), "backward": bool(ok_bwd)}


def fold_experiment(
    dp: int, tp: int, ep: int, etp: int, cfg: M.MoEConfig, tokens: int, seed: int = 0
) -> dict:
    """Build the attention groups and the folded expert groups on the same ranks.

    Every rank creates every group (``new_group`` is collective), records the ranks of each
    group it joined (``dist.get_process_group_ranks``), checks each works (an all-reduce of
    its members' ranks), and runs the MoE layer in its EP group against the reference.
    """
    world, me = dist.get_world_size(), dist.get_rank()
    mesh = Mesh(G=world, dp=dp, tp=tp, pp=1)
    fold = moe_fold(mesh, ep=ep, etp=etp, num_experts=cfg.num_experts)
    joined, sums, handles = {}, {}, {}
    for kind, layout, axes in (("attention", mesh, ("tp", "dp")), ("expert", fold, ("ep", "edp"))):
        for axis in axes:
            for ranks in layout.groups(axis):
                pg = dist.new_group(ranks)  # collective: every rank, same order
                if me in ranks:
                    handles[f"{kind} {axis}"] = pg
                    joined[f"{kind} {axis}"] = dist.get_process_group_ranks(pg)
    for name, pg in handles.items():
        t = torch.tensor([float(me)])
        dist.all_reduce(t, group=pg)  # the group really connects these ranks
        sums[name] = int(t.item())
    ep_pg = handles["expert ep"]
    ep_ranks = joined["expert ep"]
    rank_in_ep = dist.get_rank(ep_pg)
    params = M.init_params(cfg, seed)
    # each EP group works on its own batch (seeded by its lowest rank), like a DP replica
    x_full = global_batch(cfg, tokens, seed + 100 * min(ep_ranks), torch.float32)
    y, _, _ = M.moe_forward(
        x_full[rank_in_ep * tokens : (rank_in_ep + 1) * tokens],
        M.local_experts(params, cfg, rank_in_ep),
        cfg,
        ep_pg,
    )
    y_ref = reference_moe(x_full, params, cfg)[0][rank_in_ep * tokens : (rank_in_ep + 1) * tokens]
    return {
        "rank": me,
        "joined": joined,
        "predicted": {
            "attention tp": mesh.group_of(me, "tp"),
            "attention dp": mesh.group_of(me, "dp"),
            "expert ep": fold.group_of(me, "ep"),
            "expert edp": fold.group_of(me, "edp"),
        },
        "allreduce_sums": sums,
        "experts_owned": list(
            range(rank_in_ep * cfg.experts_per_rank, (rank_in_ep + 1) * cfg.experts_per_rank)
        ),
        "moe_err": _err(y, y_ref),
    }


def check_many(cases: list[tuple], sweep: tuple | None = None) -> dict:
    """Several :func:`check_moe` cases ``(cfg, tokens, seed, dtype)`` and an optional
    :func:`sweep_capacity` ``(cfg, tokens, cfs)`` in one launch (starting ranks is slow)."""
    out = {"cases": [check_moe(*c) for c in cases]}
    if sweep is not None:
        out["sweep"] = sweep_capacity(*sweep)
    return out


def launch_once(tmp_path_factory, key: str, fn, nprocs: int, *args, **kwargs):
    """``launch(fn, nprocs, *args)`` once per pytest run, shared by every xdist worker
    (:func:`shardlab.runtime.once_per_run.once_per_run`)."""
    return once_per_run(
        tmp_path_factory, f"lab08-{key}", lambda: launch(fn, nprocs, *args, quiet=True, **kwargs)
    )


def run(
    cfg: M.MoEConfig,
    tokens_per_rank: int,
    seed: int = 0,
    dtype: str = "float64",
    timeout: float = 120.0,
) -> list[dict]:
    """Launch :func:`check_moe` on ``cfg.ep`` ranks; bad input raises before any rank starts."""
    if not isinstance(cfg, M.MoEConfig):
        raise ValueError(f"cfg={cfg!r} must be a MoEConfig")
    if (
        isinstance(tokens_per_rank, bool)
        or not isinstance(tokens_per_rank, int)
        or tokens_per_rank < 1
    ):
        raise ValueError(f"tokens_per_rank={tokens_per_rank!r} must be a positive integer")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
    return launch(check_moe, cfg.ep, cfg, tokens_per_rank, seed, dtype, timeout=timeout, quiet=True)
