"""What the notebook's exercises run: ONE 4-rank launch for every part that is written.

``walkthrough(parts)`` runs, on the ranks of a 2x2 mesh, the check of each exercise named in
``parts`` and rank 0 returns ``{part: result}``. The notebook launches it once with every
part whose functions are no longer stubs, so the exercises and the measured sections share
one start of four processes (most of a launch's cost: the processes, torch, the lab modules
and the process groups; every check here takes about a second or less).

* ``groups``: :func:`combined.build_axis_groups` on both meshes, with every ``new_group``
  call recorded (each rank must make the same calls in the same order) and the group kept on
  each axis next to ``Mesh.group_of``;
* ``tp_groups``: :func:`combined.tp_groups` on the FSDP x TP mesh against the coordinates;
* ``fsdp_tp``: :func:`_workers_combined.fsdp_tp_check` (training, bytes, memory);
* ``pipeline``: :func:`combined.dp_pp_pipeline` on the DP x PP mesh: stage bounds, group and
  schedule against ``accounting.pipeline``;
* ``all_reduce``: :func:`combined.all_reduce_mean` on the DP x PP dp group with seeded
  gradients: the mean, and the traced collectives against ``comm.step_volume("ddp", ...)``;
* ``dp_pp``: :func:`_workers_combined.dp_pp_check` (training, bytes, memory).
"""

from __future__ import annotations

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
import torch.distributed as dist
from _cases_combined import DP_PP_MESH, FSDP_TP_MESH, PP_M, PP_MODEL, Q
from shardlab.accounting import comm
from shardlab.accounting import pipeline as pacc
from shardlab.accounting.mesh import AXES, Mesh
from shardlab.models import GPT
from shardlab.runtime import device
from torch import nn

MESHES = {"fsdp_tp": FSDP_TP_MESH, "dp_pp": DP_PP_MESH}
GRAD_SHAPES = ((4, 3), (4,), (2, 2, 2))  # the all_reduce_mean check's three "parameters"


def _ranks(group) -> list[int] | None:
    """Global ranks of ``group``, or None when it is not a group of this rank."""
    try:
        return sorted(dist.get_process_group_ranks(group))
    except Exception:
        return None


def _gather(row):
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    return rows


def _build_recorded(mesh: Mesh):
    """The student's build_axis_groups, with the rank lists of its new_group calls recorded."""
    import combined

    calls, real = [], dist.new_group

    def new_group(ranks=None, *args, **kwargs):
        calls.append(sorted(ranks) if ranks is not None else None)
        return real(ranks, *args, **kwargs)

    dist.new_group = new_group
    try:
        ag = combined.build_axis_groups(mesh)
    finally:
        dist.new_group = real
    return ag, calls


def groups_rows(ags) -> dict:
    out = {}
    for name, spec in MESHES.items():
        mesh = Mesh(**spec)
        ag, calls = _build_recorded(mesh)
        ags[name] = ag
        kept = {a: _ranks(ag.group(a)) if ag.group(a) is not None else None for a in AXES}
        want = {a: mesh.group_of(ag.rank, a) if mesh.sizes[a] > 1 else None for a in AXES}
        out[name] = _gather({"rank": ag.rank, "calls": calls, "kept": kept, "want": want})
    return out


def _ag(ags, name):
    if name not in ags:  # parts after "groups" reuse its groups; alone, they build their own
        import combined

        ags[name] = combined.build_axis_groups(Mesh(**MESHES[name]))
    return ags[name]


def tp_groups_rows(ags) -> list:
    import combined

    ag = _ag(ags, "fsdp_tp")
    g = combined.tp_groups(ag)
    got = {"tp": g.tp, "tp_rank": g.tp_rank, "tp_group": _ranks(g.tp_group),
           "dp": g.dp, "dp_rank": g.dp_rank, "dp_group": _ranks(g.dp_group)}
    m, c = ag.mesh, ag.coords
    want = {"tp": m.tp, "tp_rank": c.tp, "tp_group": m.group_of(ag.rank, "tp"),
            "dp": m.dp, "dp_rank": c.dp, "dp_group": m.group_of(ag.rank, "dp")}
    return _gather({"rank": ag.rank, "got": got, "want": want})


def pipeline_rows(ags, kind: str = "1f1b") -> list:
    import combined

    ag = _ag(ags, "dp_pp")
    m, k = ag.mesh, ag.coords.pp
    stage, ex = combined.dp_pp_pipeline(GPT(PP_MODEL, seed=0), ag, kind, PP_M)
    return _gather({
        "rank": ag.rank, "coords": ag.coords.as_dict(),
        "got": {"blocks": [stage.lo, stage.hi], "first": stage.first, "last": stage.last,
                "group": _ranks(ex.group), "actions": [str(a) for a in ex.actions]},
        "want": {"blocks": list(pacc.stage_bounds(PP_MODEL.n_layer, m.pp)[k]), "first": k == 0,
                 "last": k == m.pp - 1, "group": m.group_of(ag.rank, "pp"),
                 "actions": [str(a) for a in pacc.schedule(kind, m.pp, PP_M)[k]]},
    })


def _seeded_grads(rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + rank)  # seeded on the CPU: the same numbers
    dev = device()  # on every backend, then moved to the rank's device
    return [torch.randn(*s, generator=gen, device=gen.device).to(dev) for s in GRAD_SHAPES]


def all_reduce_rows(ags) -> list:
    """Seeded gradients on every rank, all_reduce_mean over the dp group, traced per axis."""
    import combined
    from mesh_trace import AxisTrace

    ag = _ag(ags, "dp_pp")
    params = [nn.Parameter(torch.zeros(*s, device=device())) for s in GRAD_SHAPES]
    for p, g in zip(params, _seeded_grads(ag.rank)):
        p.grad = g
    line = ag.mesh.group_of(ag.rank, "dp")
    want = [sum(gs) / len(line) for gs in zip(*(_seeded_grads(r) for r in line))]
    with AxisTrace(ag.mesh) as tr:
        combined.all_reduce_mean(params, ag.group("dp"))
    n = sum(p.numel() for p in params)
    return _gather({
        "rank": ag.rank, "line": line, "n": n,
        "max_abs": max((p.grad - w).abs().max().item() for p, w in zip(params, want)),
        "calls": tr.count_by_axis(), "measured": tr.sent_by_axis(),
        "predicted": {"dp": comm.step_volume("ddp", n, len(line), Q)},
    })


def _fsdp_tp(ags):
    from _workers_combined import fsdp_tp_check

    return fsdp_tp_check(ag=ags.get("fsdp_tp"))


def _dp_pp(ags):
    from _workers_combined import dp_pp_check

    return dp_pp_check(ag=ags.get("dp_pp"))


PARTS = {"groups": groups_rows, "tp_groups": tp_groups_rows, "fsdp_tp": _fsdp_tp,
         "pipeline": pipeline_rows, "all_reduce": all_reduce_rows, "dp_pp": _dp_pp}


def walkthrough(parts: tuple[str, ...]) -> dict | None:
    """Run the checks named in ``parts`` in order; rank 0 returns ``{part: result}``."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise ValueError(f"parts={parts!r} must name checks from {list(PARTS)}")
    ags: dict = {}
    out = {p: PARTS[p](ags) for p in parts}
    return out if dist.get_rank() == 0 else None
