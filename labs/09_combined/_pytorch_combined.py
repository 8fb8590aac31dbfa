"""PyTorch's own composition (FSDP2 ``fully_shard`` + DTensor ``parallelize_module``) on the
same 2x2 mesh: the hidden tests' comparison and ``benchmark_combined.py``."""

from __future__ import annotations

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
import torch.distributed as dist
from _cases_combined import (
    FSDP_TP_MESH,
    LR,
    STEPS,
    TP_MODEL,
    _dp_slice,
    fsdp_tp_full_params,
    fsdp_tp_reference,
    tp_batch,
)
from combined import build_axis_groups, fsdp_tp_backward, fsdp_tp_model
from shardlab.accounting.mesh import Mesh
from tensor_reference import ModelConfig, SerialGPT, make_batch


# ----------------------------------------------------------------- PyTorch: FSDP2 + DTensor
def pytorch_fsdp_tp_model(cfg: ModelConfig = TP_MODEL):
    """The same layout with PyTorch's own tools on ``init_device_mesh("cpu", (2, 2))``:
    ``parallelize_module`` on the "tp" sub-mesh (vocabulary-split embedding, column/row
    parallel attention and MLP, column-parallel head gathered to full logits), then
    ``fully_shard`` of every block and of the root on the "dp" sub-mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    m = Mesh(**FSDP_TP_MESH)
    mesh = init_device_mesh("cpu", (m.dp, m.tp), mesh_dim_names=("dp", "tp"))
    model = SerialGPT(cfg)
    plan = {
        **{p: ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj", "fc")},
        **{p: RowwiseParallel() for p in ("o_proj", "proj")},
    }
    for blk in model.blocks:
        parallelize_module(blk, mesh["tp"], plan)
    parallelize_module(model, mesh["tp"], {
        "tok": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Replicate()),
    })
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def pytorch_backward(model, idx, tgt) -> torch.Tensor:
    logits = model(idx)  # (b, s, V), replicated over tp
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    loss.backward()
    return loss.detach()


def pytorch_check(steps: int = STEPS) -> dict | None:
    """FSDP2 + DTensor, ``steps`` SGD steps on the same batches: weights vs one process."""
    mesh = Mesh(**FSDP_TP_MESH)
    model = pytorch_fsdp_tp_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    dp_rank = mesh.rank_to_coords(dist.get_rank()).dp
    for step in range(steps):
        idx, tgt = (_dp_slice(z, dp_rank, mesh.dp) for z in tp_batch(step))
        pytorch_backward(model, idx, tgt)
        opt.step()
        opt.zero_grad()
    full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    ag = build_axis_groups(mesh)  # ours on the same batches
    mine = fsdp_tp_model(SerialGPT(TP_MODEL), ag)
    opt = torch.optim.SGD(mine.parameters(), lr=LR)
    for step in range(steps):
        fsdp_tp_backward(mine, *(_dp_slice(z, dp_rank, mesh.dp) for z in tp_batch(step)))
        opt.step()
        opt.zero_grad()
    ours = fsdp_tp_full_params(mine, ag)
    if dist.get_rank() != 0:
        return None
    ref, _ = fsdp_tp_reference(steps)
    diff = {n: (full[n] - ref[n]).abs().max().item() for n in ref}
    vs_ours = {n: (full[n] - ours[n]).abs().max().item() for n in ref}
    return {"names_match": set(full) == set(ref) == set(ours),
            "max_abs_param": max(diff.values()), "worst_param": max(diff, key=diff.get),
            "max_abs_vs_ours": max(vs_ours.values())}


def benchmark(steps: int = 10, batch: int = 8, **model_kw) -> dict | None:
    """Median step time (forward, backward, gradient synchronisation, AdamW) and the peak of
    live tensor bytes of one step (MemoryTrace): ours vs FSDP2 + DTensor on the same 2x2 mesh,
    model and data. ``batch`` is global (``batch / dp`` per dp rank)."""
    from shardlab.runtime import MemoryTrace
    from shardlab.testing import interleaved_times

    cfg = ModelConfig(**{**TP_MODEL.__dict__, **model_kw})
    mesh = Mesh(**FSDP_TP_MESH)
    ag = build_axis_groups(mesh)
    idx, tgt = (_dp_slice(z, ag.coords.dp, mesh.dp) for z in make_batch(cfg, batch, seed=11))
    res: dict = {"model": model_kw, "batch": batch, "mesh": FSDP_TP_MESH}
    runs = {}
    for name in ("ours", "pytorch"):
        if name == "ours":
            model = fsdp_tp_model(SerialGPT(cfg), ag)
            fn = fsdp_tp_backward
        else:
            model = pytorch_fsdp_tp_model(cfg)
            fn = pytorch_backward
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(model=model, opt=opt, fn=fn):
            fn(model, idx, tgt)
            opt.step()
            opt.zero_grad()

        step()
        step()  # warm-up: AdamW state exists
        with MemoryTrace() as mt:
            mt.watch(model, opt)
            step()
        res[name] = {"peak_bytes": mt.peak}
        runs[name] = step
    times = interleaved_times(runs, steps)  # interleaved: other processes' load hits both alike
    for name, ts in times.items():
        res[name]["step_s"] = sorted(ts)[len(ts) // 2]
    res["ratio_time"] = res["ours"]["step_s"] / res["pytorch"]["step_s"]
    res["ratio_peak"] = res["ours"]["peak_bytes"] / res["pytorch"]["peak_bytes"]
    return res if dist.get_rank() == 0 else None
