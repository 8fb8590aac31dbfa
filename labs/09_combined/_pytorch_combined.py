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
from tensor_reference import ModelConfig, SerialGPT


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
