"""Functions every rank runs for the per-parameter FSDP tests, chapter and benchmark.

The references and the comparison helpers are those of ``_workers_fsdp`` (flat units), so
both modes are checked against the same single-process runs and the same FSDP2 run.
"""

from __future__ import annotations

import copy
from functools import partial

import torch
import torch.distributed as dist
from _workers_fsdp import (
    SEQ,
    STEPS,
    VOCAB,
    accumulate,
    compare,
    make_batches,
    make_model,
    named,
    reference_split,
    train_fsdp,
    train_fsdp2,
)
from fsdp_perparam import MixedPrecision, PerParamConfig, PerParamFSDP, WrapPolicy, add_cast_hooks
from shardlab.accounting import comm, memory
from shardlab.models import lm_loss, make_optimizer, rank_slice
from shardlab.runtime import CommTrace
from torch import nn

LEAVES = WrapPolicy((nn.Linear, nn.Embedding))  # every Linear and Embedding is a unit
BF16_NORMS_FP32 = MixedPrecision(torch.bfloat16, torch.float32, (nn.LayerNorm,))
CLIP = 0.05  # max gradient norm in the clipping runs (the gradients here are ~0.3-1: it clips)


def train_pp(kind, opt, cfg=None, steps=STEPS, clip=None, **model_cfg):
    """Per-parameter FSDP; the optimizer is built on ``model.parameters()`` (the shards)."""
    model = PerParamFSDP(make_model(kind, **model_cfg), dist.group.WORLD, cfg or PerParamConfig())
    o = make_optimizer(opt, model.parameters())
    for x, y in make_batches(steps):
        accumulate(model, rank_slice(x), rank_slice(y))
        if clip is not None:
            model.clip_grad_norm_(clip)
        o.step()
        o.zero_grad()
    return model, o


def reference_clipped(kind: str, opt: str, clip: float, steps: int = STEPS):
    """One process, whole batch, ``torch.nn.utils.clip_grad_norm_`` before every step."""
    model = make_model(kind)
    o = make_optimizer(opt, model.parameters())
    norms = []
    for x, y in make_batches(steps):
        lm_loss(model, x, y).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        o.step()
        o.zero_grad()
    return named(model), norms


def reference_mixed(kind: str, opt: str, world: int, mp: MixedPrecision, steps: int = STEPS):
    """``reference_split`` with the policy's casts: fp32 for its replicated modules, the
    compute dtype elsewhere; gradients summed in fp32 and divided by D."""
    model = make_model(kind)
    o = make_optimizer(opt, model.parameters())
    for x, y in make_batches(steps):
        total = None
        for r in range(world):
            low = copy.deepcopy(model)
            for m in low.modules():
                if not isinstance(m, mp.fp32_replicated):
                    for p in m.parameters(recurse=False):
                        p.data = p.data.to(mp.param_dtype)
            add_cast_hooks(low, mp)
            lm_loss(low, *rank_slice((x, y), r, world)).backward()
            g = [p.grad.to(mp.reduce_dtype).float() for p in low.parameters()]
            total = g if total is None else [a + b for a, b in zip(total, g)]
        for p, g in zip(model.parameters(), total):
            p.grad = g / world
        o.step()
        o.zero_grad()
    return named(model)


def registered(model: PerParamFSDP) -> dict:
    """What ``model.module`` exposes: names, shapes and dtypes of parameters and grads."""
    return {
        n: (
            tuple(p.shape),
            p.dtype,
            None if p.grad is None else (tuple(p.grad.shape), p.grad.dtype),
        )
        for n, p in model.module.named_parameters()
    }


def state_bytes(model, opt) -> dict:
    """Bytes this rank holds in ``model.parameters()``, their grads and the Adam moments."""
    ps = list(model.parameters())
    moments = [t for p in ps for k, t in opt.state.get(p, {}).items() if k != "step"]
    nb = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return {
        "weights": nb(ps),
        "grads": nb([p.grad for p in ps if p.grad is not None]),
        "moments": nb(moments),
    }


def n_padded(model) -> int:
    """N_pad of either mode, from the accounting formula applied to the unit shapes."""
    if isinstance(model, PerParamFSDP):
        shapes = [s.shape for u in model.units for s in u.slots]
        return memory.fsdp_padded_numel(shapes, model.world, "per_param")
    return sum(
        memory.fsdp_padded_numel([sl.shape for sl in f.slots], model.world, "flat")
        for u in model.units
        for f in u.flats
    )


def mode_row(mode: str, world: int) -> dict:
    """One fp32 AdamW step of a mode: bytes sent and held against accounting, collectives."""
    x, y = make_batches(1, seed=7)[0]
    train = train_pp if mode == "per-param" else train_fsdp
    model, opt = train("plain", "adamw", None, 1)
    with CommTrace() as tr:
        accumulate(model, rank_slice(x), rank_slice(y))
    held = state_bytes(model, opt)
    opt.step()
    opt.zero_grad()
    n = sum(p.numel() for p in make_model("plain").parameters())
    npad = n_padded(model)
    sent_pred = comm.step_volume("zero3", npad, world, 4)
    state_pred = memory.model_state(npad, world, "zero3", "fp32").total
    return {
        "mode": mode,
        "units": len(model.units),
        "N": n,
        "N_padded": npad,
        "padding": npad - n,
        "N_padded_wrapper": model.padded_numel,
        # the same units padded as flat vectors (what lab 04's FlatParam stores)
        "N_padded_flat_units": sum(
            memory.fsdp_padded_numel([s.shape for s in u.slots], world, "flat") for u in model.units
        )
        if mode == "per-param"
        else npad,
        "all_gathers": tr.count(op="all_gather"),
        "reduce_scatters": tr.count(op="reduce_scatter"),
        "other_collectives": len(tr.select())
        - tr.count(op="all_gather")
        - tr.count(op="reduce_scatter"),
        "sent_bytes": tr.sent_bytes(),
        "sent_predicted": sent_pred,
        "state_bytes": sum(held.values()),
        "state_predicted": state_pred,
        "state_dict_keys": len(model.module.state_dict()),
        "wrapper_state_dict_keys": len(model.state_dict()),
    }


def mixed_bytes_row(world: int) -> dict:
    """Bytes sent by one step with bf16 gathers, fp32 reduction, fp32 replicated norms."""
    x, y = make_batches(1, seed=7)[0]
    model, _ = train_pp("plain", "adamw", PerParamConfig(wrap=LEAVES, mp=BF16_NORMS_FP32), 0)
    with CommTrace() as tr:
        accumulate(model, rank_slice(x), rank_slice(y))
    npad, nrep = n_padded(model), model.replicated_numel
    q_param = model.config.mp.param_dtype.itemsize
    pred = {  # two gathers (forward, backward) in param_dtype; reductions in fp32
        "all_gather": 2 * comm.ring_sent_bytes("all_gather", q_param * npad, world),
        "reduce_scatter": comm.ring_sent_bytes("reduce_scatter", 4 * npad, world),
        "all_reduce": comm.step_volume("ddp", nrep, world, 4),
    }
    return {
        "N_padded": npad,
        "N_replicated": nrep,
        "units": len(model.units),
        **{f"{op}s": tr.count(op=op) for op in pred},
        **{f"measured_{op}": tr.sent_bytes(op=op) for op in pred},
        **{f"predicted_{op}": b for op, b in pred.items()},
    }


def check_perparam(level: str = "full") -> dict | None:
    """Every correctness, byte and policy check of one launch; rank 0 returns the report."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rep: dict = {"world": world, "runs": {}}
    kinds = ("plain", "tied", "frozen") if level == "full" else ("plain", "tied")
    for kind in kinds:
        for opt in ("adamw", "sgd"):
            model, _ = train_pp(kind, opt)
            sd = model.full_state_dict()
            if rank == 0:
                rep["runs"][(kind, opt)] = {
                    "split": compare(sd, reference_split(kind, opt, world)),
                    "full": compare(sd, reference_full_cached(kind, opt)),
                    "units": [u.name for u in model.units],
                }
    model, _ = train_pp("plain", "adamw")
    model(make_batches(1)[0][0][:1])[0].sum().backward()
    model.finish_gradient_synchronization()
    rep["registered"] = registered(model)
    rep["original"] = {n: tuple(p.shape) for n, p in make_model("plain").named_parameters()}
    rep["modes"] = [mode_row("per-param", world)]  # the flat units' row: modes_report()
    rep["mixed_bytes"] = mixed_bytes_row(world)
    if level == "full":
        rep["memory"] = memory_rows_pp(world)
    # gradient clipping through model.parameters(): global norm, all-reduced
    clipped, _ = train_pp("plain", "sgd", clip=CLIP)
    sd = clipped.full_state_dict()
    if rank == 0:
        want, norms = reference_clipped("plain", "sgd", CLIP)
        rep["clip"] = {**compare(sd, want), "reference_norms": norms}
    # wrap policy: every Linear and Embedding a unit; mixed precision with fp32 norms
    leaves = PerParamConfig(wrap=LEAVES)
    leaf_model = train_pp("plain", "adamw", leaves)[0]
    sd = leaf_model.full_state_dict()
    mixed_cfg = PerParamConfig(wrap=LEAVES, mp=BF16_NORMS_FP32)
    mixed, _ = train_pp("plain", "adamw", mixed_cfg)
    sdm = mixed.full_state_dict()
    if rank == 0:
        rep["leaves"] = {
            "units": [u.name for u in leaf_model.units],
            **compare(sd, reference_split("plain", "adamw", world)),
        }
        rep["mixed"] = {
            "split": compare(sdm, reference_mixed("plain", "adamw", world, BF16_NORMS_FP32)),
            "full_fp32": compare(sdm, reference_full_cached("plain", "adamw")),
            "replicated": sorted(n for _, al in mixed.replicated for _, _, n in al),
            "units": [u.name for u in mixed.units],
            "dtypes": {n: p.dtype for n, p in mixed.module.named_parameters()},
        }
    return rep if rank == 0 else None


_REF: dict = {}


def reference_full_cached(kind: str, opt: str) -> dict:
    from _workers_fsdp import reference_full

    if (kind, opt) not in _REF:
        _REF[(kind, opt)] = reference_full(kind, opt)
    return _REF[(kind, opt)]


def compare_fsdp2() -> dict | None:
    """Per-parameter FSDP vs FSDP2 after STEPS steps (AdamW and SGD, plain and tied; AdamW
    with bf16 compute and fp32 reduction)."""
    out = {}
    for kind in ("plain", "tied"):
        for opt in ("adamw", "sgd"):
            ours = train_pp(kind, opt)[0].full_state_dict()
            theirs = train_fsdp2(kind, opt)[0]
            sd = {
                n: p.full_tensor().detach().clone()
                for n, p in theirs.named_parameters(remove_duplicate=False)
            }
            out[(kind, opt)] = compare(ours, sd)
    # mixed precision: FSDP2's MixedPrecisionPolicy(bf16, fp32) against ours
    ours = train_pp("plain", "adamw", PerParamConfig(mp=MixedPrecision(torch.bfloat16)))[0]
    out[("plain", "adamw bf16")] = compare(ours.full_state_dict(), train_fsdp2_bf16())
    return out if dist.get_rank() == 0 else None


def train_fsdp2_bf16(steps: int = STEPS) -> dict:
    """FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = make_model("plain")
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    o = make_optimizer("adamw", model.parameters())
    for x, y in make_batches(steps):
        lm_loss(model, rank_slice(x), rank_slice(y)).backward()
        o.step()
        o.zero_grad()
    return {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}


def predicted_peak_pp(model: PerParamFSDP, world: int, cfg: PerParamConfig, batch: int, acts):
    """``accounting.fsdp_peak.fsdp_step_peak`` of one fp32 AdamW step of the per-parameter
    wrapper. The terms are those of ``_workers_fsdp.predicted_peak`` (read its docstring), with
    per-parameter sizes:

    * ``gathered_params``: a block's padded parameters, ``D * S`` elements, whether they sit
      in the rank-major all-gather output (prefetched) or, after the copy-out, in the
      per-parameter buffers (the copy-out frees the first as it fills the second);
    * ``unsharded_grads``: a block's gradients at the end of its backward. During the
      backward the gradients replace the freed parameter buffers one by one, and at the end
      the reduce-scatter input takes the place of the (now freed) gathered block while each
      gradient is dropped as soon as it is packed: the same total as the flat units' model;
    * not modelled: without prefetch, the copy-out moment holds a block twice (the
      rank-major all-gather output and the per-parameter buffers) beside the previous
      block's reduce-scatter input in flight (4 ranks: +6 %); the last block's backward has
      no reduce-scatter in flight yet, where the model counts a second gathered block when
      prefetching (4 ranks: -6 %);
    * ``optimizer_workspace``: single-tensor AdamW's temporaries of the largest *parameter*
      shard (the flat mode steps one shard per unit, this one a shard per parameter).
    """
    from shardlab.accounting import peak
    from shardlab.accounting.fsdp_peak import fsdp_step_peak

    return fsdp_step_peak(
        padded_numel=model.padded_numel,
        world=world,
        unit_bytes=[u.packed * world * 4 for u in model.units[1:]],
        shard_bytes=[u.packed * 4 for u in model.units[1:]],
        root_bytes=model.units[0].packed * world * 4,  # the root: whole step
        root_shard_bytes=model.units[0].packed * 4,
        activation_bytes=acts[0],
        head_activation_bytes=acts[1],
        backward_workspace_bytes=peak.logits_workspace(batch, SEQ, VOCAB, 4),
        stepped_numels=[p.numel() for p in model.parameters()],
        prefetch=cfg.prefetch,
        reshard_after_forward=cfg.reshard_after_forward,
    )


def _saved(mt, seen: dict, *_) -> None:
    seen.setdefault("units", mt.live_bytes("activations"))


def memory_rows_pp(world: int) -> list[dict]:
    """Peak live bytes of one step (MemoryTrace) for reshard/prefetch on/off vs predict_peak."""
    from shardlab.runtime import MemoryTrace, phase

    rows = []
    x, y = make_batches(1, seed=10)[0]
    xr, yr = rank_slice(x), rank_slice(y)
    for rs in (True, False):
        for pf in (True, False):
            cfg = PerParamConfig(reshard_after_forward=rs, prefetch=pf)
            model, opt = train_pp("plain", "adamw", cfg, 1)  # Adam moments exist
            seen: dict = {}
            with MemoryTrace() as mt:
                mt.watch(model, opt)
                mt.tag([s.full for u in model.units for s in u.slots], "parameters")
                mt.tag([xr, yr], "activations")
                last = model.module.blocks[-1].register_forward_hook(partial(_saved, mt, seen))
                with phase("forward"):
                    loss = lm_loss(model, xr, yr)
                last.remove()
                with phase("backward"):
                    loss.backward()
                    model.finish_gradient_synchronization()
                with phase("optimizer"):
                    opt.step()
                opt.zero_grad()
            tl = mt.timeline()
            acts = (seen["units"], max(tl.bytes["activations"]) - seen["units"])
            pred = predicted_peak_pp(model, world, cfg, xr.shape[0], acts)
            rows.append(
                {
                    "run": f"reshard={rs} prefetch={pf}",
                    "measured_peak": tl.peak,
                    "predicted_peak": pred.total,
                    "ratio": tl.peak / pred.total,
                    "measured_phase": tl.phases[tl.peak_index],
                    "measured_at_peak": {k: v for k, v in tl.peak_breakdown.items() if v},
                    "predicted_terms": pred.terms,
                    "predicted_phase": pred.phase_of_peak,
                }
            )
    return rows


def extra_checks_pp() -> dict | None:
    """Hidden-test launch (4 ranks): the public checks, FSDP2, fp16, peaks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rep = check_perparam("small")
    pytorch, memory_rows = compare_fsdp2(), memory_rows_pp(world)
    fp16 = MixedPrecision(torch.float16, torch.float32)
    sd = train_pp("plain", "adamw", PerParamConfig(mp=fp16))[0].full_state_dict()
    if rank == 0:
        rep.update(pytorch=pytorch, memory=memory_rows)
        rep["fp16"] = compare(sd, reference_mixed("plain", "adamw", world, fp16))
        return rep
    return None


def modes_report() -> dict | None:
    """Flat units and per-parameter shards side by side (one step each): the chapter's table."""
    world = dist.get_world_size()
    rows = [mode_row("flat", world), mode_row("per-param", world)]
    model, _ = train_pp("plain", "adamw", None, 0)
    flat, _ = train_fsdp("plain", "adamw", None, 0)
    sd = {
        "per-param": {k: tuple(v.shape) for k, v in model.module.state_dict().items()},
        "flat": {k: tuple(v.shape) for k, v in flat.state_dict().items()},
        "full": {k: tuple(v.shape) for k, v in model.full_state_dict().items()},
    }
    return {"world": world, "modes": rows, "state_dict": sd} if dist.get_rank() == 0 else None
