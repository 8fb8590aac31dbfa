"""Functions every rank runs for the FSDP tests, notebook and benchmark (importable by name).

References (computed on rank 0 only, in the same process):

* ``reference_full``: one process, the whole global batch per step (the training we imitate);
* ``reference_split``: one process that computes the D per-rank gradients separately (same
  shapes, same casts), adds them and divides by D. It does the arithmetic FSDP does, so on
  2 ranks (where ``a + b == b + a`` exactly) FSDP must equal it bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
from functools import partial

import torch
import torch.distributed as dist
from fsdp import FSDP, FSDPConfig
from shardlab import testing
from shardlab.accounting import comm, memory
from shardlab.models import (
    OPTIMIZERS,
    SIZES,
    lm_loss,
    make_optimizer,
    rank_slice,
    split_microbatches,
    tiny_gpt,
)
from shardlab.runtime import CommTrace
from torch import nn

SIZE = "two-block"  # shardlab.models.SIZES: 2 blocks, so root + 2 units
GLOBAL_BATCH, SEQ, VOCAB = 4, SIZES[SIZE]["seq_len"], SIZES[SIZE]["vocab_size"]
STEPS = 3
LR = {name: kw["lr"] for name, (_, kw) in OPTIMIZERS.items()}
RECIPE = "fp32"  # fp32 weights (= master), fp32 grads, fp32 Adam moments: 16 B/param
# max |param - reference_full| after STEPS steps; why these values: see test_fsdp.py
TOL = {"sgd": 1e-6, "adamw": 1e-6}
# attention's key bias gets an exactly-zero gradient (softmax ignores a constant shift), so its
# computed gradient is rounding noise that Adam rescales to updates of size ~lr
ZERO_GRAD_PARAM = "attn.qkv.bias"


def make_model(kind: str = "plain", seed: int = 0, **cfg) -> nn.Module:
    """Tiny GPT: "plain", "tied" (embedding = head) or "frozen" (``pos_emb`` and
    ``blocks[0].ln1`` fixed: a frozen flat in the root unit and in the first block's unit)."""
    return tiny_gpt("frozen-ln1" if kind == "frozen" else kind, seed, size=SIZE, **cfg)


def make_batches(steps: int = STEPS, batch: int = GLOBAL_BATCH, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, VOCAB, (batch, SEQ), generator=g),
         torch.randint(0, VOCAB, (batch, SEQ), generator=g))
        for _ in range(steps)
    ]


def named(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


def reference_full(kind: str, opt: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    model = make_model(kind)
    o = make_optimizer(opt, model.parameters())
    for x, y in make_batches(steps):
        lm_loss(model, x, y).backward()
        o.step()
        o.zero_grad()
    return named(model)


def reference_split(kind, opt, world, steps=STEPS, dtype=torch.float32, microbatches=1):
    """Per-rank gradients computed one after another in ``dtype``, summed in fp32, / D."""
    model = make_model(kind)
    o = make_optimizer(opt, model.parameters())
    params = [p for p in model.parameters() if p.requires_grad]
    for x, y in make_batches(steps):
        total = None
        for r in range(world):
            xr, yr = rank_slice((x, y), r, world)
            low = copy.deepcopy(model).to(dtype)  # the same casts as the gathered buffer
            for xm, ym in split_microbatches((xr, yr), microbatches):
                lm_loss(low, xm, ym).backward()
            g = [p.grad.float() for p in low.parameters() if p.requires_grad]
            total = g if total is None else [a + b for a, b in zip(total, g)]
        for p, g in zip(params, total):
            p.grad = g / world
        o.step()
        o.zero_grad()
    return named(model)


def train_fsdp(kind, opt, cfg=None, steps=STEPS, microbatches=1, sync_each=True, **model_cfg):
    model = FSDP(make_model(kind, **model_cfg), dist.group.WORLD, cfg or FSDPConfig())
    o = make_optimizer(opt, model.parameters())
    for x, y in make_batches(steps):
        accumulate(model, rank_slice(x), rank_slice(y), microbatches, sync_each)
        o.step()
        o.zero_grad()
    return model, o


def accumulate(model: FSDP, x, y, microbatches=1, sync_each=True) -> None:
    """Forward/backward over ``microbatches`` pieces, reduce-scatter per piece or once."""
    pieces = split_microbatches((x, y), microbatches)
    for k, (xm, ym) in enumerate(pieces):
        last = k == len(pieces) - 1
        ctx = model.no_sync() if not (sync_each or last) else contextlib.nullcontext()
        with ctx:
            (lm_loss(model, xm, ym) / len(pieces)).backward()
    model.finish_gradient_synchronization()


def compare(got: dict, want: dict) -> dict:
    """Bitwise flag, worst absolute difference and where it is."""
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    diff = {n: (got[n] - want[n]).abs().max().item() for n in want}
    worst = max(diff, key=diff.get)
    rest = [d for n, d in diff.items() if not n.endswith(ZERO_GRAD_PARAM)]
    return {
        "bitwise": all(torch.equal(got[n], want[n]) for n in want),
        "max_abs": diff[worst],
        "worst": worst,
        "max_abs_nonzero_grad": max(rest),
    }


def state_bytes(model: FSDP, opt: torch.optim.Optimizer) -> dict:
    """Bytes this rank really holds: shards, their grads, Adam moments (step counters aside)."""
    shards = list(model.parameters())
    moments = [
        t for p in shards for k, t in opt.state.get(p, {}).items() if k in ("exp_avg", "exp_avg_sq")
    ]
    nb = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    return {
        "weights": nb(shards),
        "grads": nb([p.grad for p in shards if p.grad is not None]),
        "moments": nb(moments),
        "gathered_left": sum(
            f.buffer.untyped_storage().nbytes() for u in model.units for f in u.flats
        ),
    }


def traced_step(model: FSDP, opt, x, y, microbatches=1, sync_each=True) -> CommTrace:
    with CommTrace() as tr:
        for ph, fn in (
            ("fwd+bwd", lambda: accumulate(model, x, y, microbatches, sync_each)),
            ("optimizer", opt.step),
        ):
            with tr.phase(ph):
                fn()
    opt.zero_grad()
    return tr


def comm_rows(world: int, q: int = 4) -> list[dict]:
    """Measured vs predicted sent bytes per step, reshard on/off (plain model, AdamW)."""
    rows = []
    x, y = make_batches(1, seed=7)[0]
    for reshard in (True, False):
        model, opt = train_fsdp("plain", "adamw", FSDPConfig(reshard_after_forward=reshard), 1)
        tr = traced_step(model, opt, rank_slice(x), rank_slice(y))
        n_pad = model.padded_numel
        pred = comm.step_volume("zero3", n_pad, world, q, reshard_after_forward=reshard)
        rows.append(_row(f"reshard_after_forward={reshard}", tr, n_pad, pred))
    return rows


def accum_rows(world: int, microbatches: int = 4, q: int = 4) -> list[dict]:
    rows = []
    x, y = make_batches(1, batch=GLOBAL_BATCH * microbatches, seed=8)[0]
    for sync in (True, False):
        model, opt = train_fsdp("plain", "adamw", None, 0)
        tr = traced_step(model, opt, rank_slice(x), rank_slice(y), microbatches, sync)
        n_pad = model.padded_numel
        pred = comm.grad_accum_volume("zero3", n_pad, world, q, microbatches, sync)
        rows.append(_row(f"m={microbatches} sync_every_microbatch={sync}", tr, n_pad, pred))
    return rows


def _row(label, tr, n_pad, pred) -> dict:
    sent = tr.sent_bytes()
    return {
        "run": label,
        "N_padded": n_pad,
        "all_gathers": tr.count(op="all_gather"),
        "reduce_scatters": tr.count(op="reduce_scatter"),
        "measured_bytes": sent,
        "predicted_bytes": pred,
        "ratio": sent / pred,
        # measured on the sockets (None where not measurable) and gloo's own algorithm
        "wire_bytes": tr.wire_bytes(),
        "gloo_bytes": tr.backend_bytes(),
    }


def state_row(world: int) -> dict:
    """Bytes held between backward and the optimizer step (grads and moments both alive)."""
    model, opt = train_fsdp("plain", "adamw", None, 1)
    x, y = make_batches(1, seed=9)[0]
    accumulate(model, rank_slice(x), rank_slice(y))
    n = sum(p.numel() for p in make_model("plain").parameters())
    got = state_bytes(model, opt)
    pred = memory.model_state(model.padded_numel, world, "zero3", RECIPE)
    measured = got["weights"] + got["grads"] + got["moments"]
    return {
        "N": n,
        "N_padded": model.padded_numel,
        "padding": model.padded_numel - n,
        "units": len(model.units),
        **{f"measured_{k}": v for k, v in got.items()},
        "measured_bytes": measured,
        "predicted_bytes": pred.total,
        "ratio": measured / pred.total,
    }


def check_all(world_checks: str = "full") -> dict | None:
    """Every correctness and byte check of one launch; rank 0 returns the report."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rep: dict = {"world": world, "runs": {}}
    kinds = ("plain", "tied", "frozen") if world_checks == "full" else ("plain", "tied")
    for kind in kinds:
        for opt in ("adamw", "sgd"):
            model, o = train_fsdp(kind, opt)
            sd = model.full_state_dict()
            grads = [(tuple(p.shape), p.dtype) for p in model.parameters()]
            if rank == 0:
                rep["runs"][(kind, opt)] = {
                    "split": compare(sd, reference_split(kind, opt, world)),
                    "full": compare(sd, reference_full(kind, opt)),
                    "units": [u.name for u in model.units],
                    "root_params": [s.aliases[0][2] for f in model.units[0].flats for s in f.slots],
                    "n_flats": sum(len(u.flats) for u in model.units),
                    "params": sd,  # the values the grader compares outside the sandbox
                }
    if world_checks == "full":
        model, o = train_fsdp("plain", "adamw")
        model(make_batches(1)[0][0][:1])[0].sum().backward()  # grads left on shards after sync
        model.finish_gradient_synchronization()
        grads = [
            (tuple(p.grad.shape), p.grad.dtype, tuple(p.shape), p.dtype) for p in model.parameters()
        ]
        base = model.full_state_dict()
        same = {}
        for rs in (True, False):
            for pf in (True, False):
                cfg = FSDPConfig(reshard_after_forward=rs, prefetch=pf)
                sd = train_fsdp("plain", "adamw", cfg)[0].full_state_dict()
                same[(rs, pf)] = all(torch.equal(sd[k], base[k]) for k in base)
        mixed = {}
        for dt in (torch.bfloat16,):
            sd = train_fsdp("plain", "adamw", FSDPConfig(compute_dtype=dt))[0].full_state_dict()
            if rank == 0:
                mixed[str(dt)] = {
                    "split": compare(sd, reference_split("plain", "adamw", world, dtype=dt)),
                    "full_fp32": compare(sd, reference_full("plain", "adamw")),
                    "params": sd,
                }
        rep.update(grads=grads, same_results=same, mixed=mixed)
        rep["memory"] = memory_rows(world)[0]
    rep["comm"] = comm_rows(world)
    rep["state"] = state_row(world)
    return rep if rank == 0 else None


def timed_steps(model, opt, x, y, steps: int) -> list[float]:
    """``shardlab.testing.timed_steps`` with ``finish`` the gradient synchronization this
    lab's wrappers leave to the step (``finish_gradient_synchronization``; none for FSDP2)."""
    finish = getattr(model, "finish_gradient_synchronization", None)
    return testing.timed_steps(model, opt, x, y, steps, finish=finish)


def predicted_peak(model: FSDP, world: int, cfg: FSDPConfig, batch: int, acts: tuple):
    """``accounting.fsdp_peak.fsdp_step_peak`` of one fp32 AdamW step of this wrapper, with
    this wrapper's sizes (``flat_unit_sizes``); every term is a tensor's lifetime:

    * ``persistent``: weight shards + AdamW moments, ``model_state(N_pad, D, "zero3",
      "fp32")`` without its gradients: ``zero_grad()`` frees the gradient shards after each
      step, so at the start of backward they do not exist;
    * ``grad_shards``: each unit's ``padded/D`` gradient shard, from the end of its
      backward (when its reduce-scatter output is allocated) to the optimizer step; the
      root's shard is complete right after block 0's backward (the last), so it joins block 0's;
    * ``gathered_params``: one padded fp32 buffer per block, alive by the reshard/prefetch
      schedule; the root stays gathered the whole forward and the whole backward
      (``buffers``);
    * ``unsharded_grads``: the block's full gradient during its backward;
    * ``activations``: the saved tensors, taken from the trace, ``acts = (units, head)``:
      those alive when the last block's forward ends (embedding and blocks, freed block by
      block in backward) and those the head adds after it (final norm, logits,
      log-probabilities: ``head_activation_bytes``, freed by the head's backward, which runs
      before the first block's);
    * ``backward_workspace``: the gradients of the log-probabilities and of the logits,
      ``logits_workspace(b, s, V)``, in their own moment at the start of backward (the head
      is in the root unit, so they are consumed before any block gradient exists);
    * ``optimizer_workspace``: single-tensor AdamW's two temporaries of the largest shard.
    """
    from shardlab.accounting import peak
    from shardlab.accounting.fsdp_peak import flat_unit_sizes, fsdp_step_peak

    sizes = flat_unit_sizes(model, 4)
    sizes.update(prefetch=cfg.prefetch, reshard_after_forward=cfg.reshard_after_forward)
    return fsdp_step_peak(
        world=world,
        activation_bytes=acts[0],
        head_activation_bytes=acts[1],
        backward_workspace_bytes=peak.logits_workspace(batch, SEQ, VOCAB, 4),
        recipe=RECIPE,
        **sizes,
    )


def _saved(mt, seen: dict, *_) -> None:
    seen.setdefault("units", mt.live_bytes("activations"))


def memory_rows(world: int) -> list[dict]:
    """Peak live bytes of one step (MemoryTrace) for reshard/prefetch on/off vs predict_peak."""
    from shardlab.runtime import MemoryTrace, phase

    rows, timelines = [], {}
    x, y = make_batches(1, seed=10)[0]
    for rs in (True, False):
        for pf in (True, False):
            cfg = FSDPConfig(reshard_after_forward=rs, prefetch=pf)
            model, opt = train_fsdp("plain", "adamw", cfg, 1)  # Adam moments exist
            xr, yr = rank_slice(x), rank_slice(y)
            seen = {}
            with MemoryTrace() as mt:
                mt.watch(model, opt)
                mt.tag([f.buffer for u in model.units for f in u.flats], "parameters")
                mt.tag([xr, yr], "activations")  # the batch: saved for backward, alive all step
                # saved activations when the last block's forward ends (the head's come later)
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
            acts = (seen["units"], max(tl.bytes["activations"]) - seen["units"])  # measured
            pred = predicted_peak(model, world, cfg, xr.shape[0], acts)
            start = next(p for p in pred.timeline if p.phase == "backward")  # start of backward
            label = f"reshard={rs} prefetch={pf}"
            timelines[label] = tl
            rows.append(
                {
                    "run": label,
                    "measured_peak": tl.peak,
                    "predicted_peak": pred.total,
                    "ratio": tl.peak / pred.total,
                    "measured_at_peak": {k: v for k, v in tl.peak_breakdown.items() if v},
                    "measured_phase": tl.phases[tl.peak_index],
                    "predicted_terms": pred.terms,
                    "predicted_phase": pred.phase_of_peak,
                    "predicted_unit": pred.unit_of_peak,
                    "predicted_start_of_backward": start.total,
                    "measured_activations": {"units": acts[0], "head": acts[1]},
                }
            )
    return rows, timelines


def train_fsdp2(kind: str, opt: str, steps: int = STEPS, mesh=None, **cfg):
    """The same training with PyTorch FSDP2: one fully_shard per block plus the root, over
    ``mesh`` (default: every rank on one axis; a 2-D ``(replicate, shard)`` mesh is HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mesh is None:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_model(kind, **cfg)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    o = make_optimizer(opt, model.parameters())
    for x, y in make_batches(steps):
        lm_loss(model, rank_slice(x), rank_slice(y)).backward()
        o.step()
        o.zero_grad()
    return model, o


def compare_pytorch() -> dict | None:
    """Ours vs FSDP2 after STEPS steps (AdamW and SGD, plain and tied)."""
    out = {}
    for kind in ("plain", "tied"):
        for opt in ("adamw", "sgd"):
            ours = train_fsdp(kind, opt)[0].full_state_dict()
            theirs = train_fsdp2(kind, opt)[0]
            sd = {
                n: p.full_tensor().detach().clone()
                for n, p in theirs.named_parameters(remove_duplicate=False)
            }
            out[(kind, opt)] = compare(ours, sd)
    return out if dist.get_rank() == 0 else None


def extra_checks() -> dict | None:
    """Hidden-test launch: FSDP2, accumulation, fp16, one-unit policy, peaks."""
    from fsdp import no_units_policy

    rank, world = dist.get_rank(), dist.get_world_size()
    rep = {"pytorch": compare_pytorch(), "accum": accum_rows(world)}
    # accumulation with no_sync gives the same update as syncing every microbatch
    a = train_fsdp("plain", "sgd", None, 2, microbatches=2, sync_each=True)[0].full_state_dict()
    b = train_fsdp("plain", "sgd", None, 2, microbatches=2, sync_each=False)[0].full_state_dict()
    rep["accum_same"] = compare(a, b)
    sd = train_fsdp("plain", "adamw", FSDPConfig(compute_dtype=torch.float16))[0].full_state_dict()
    one = train_fsdp("plain", "adamw", FSDPConfig(unit_policy=no_units_policy))[0]
    sd1 = one.full_state_dict()
    rows, _ = memory_rows(world)
    rep["memory"] = rows
    if rank == 0:
        rep["fp16"] = compare(sd, reference_split("plain", "adamw", world, dtype=torch.float16))
        rep["one_unit"] = {
            "units": len(one.units),
            **compare(sd1, reference_split("plain", "adamw", world)),
        }
        return rep
    return None


def lab_report() -> dict | None:
    """Everything the notebook shows, from one 2-rank launch (rank 0 returns it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    sd = train_fsdp("plain", "adamw")[0].full_state_dict()
    rep: dict = {}
    if rank == 0:
        rep["correct"] = {
            "split reference": compare(sd, reference_split("plain", "adamw", world)),
            "full-batch reference": compare(sd, reference_full("plain", "adamw")),
        }
    rep["comm"] = comm_rows(world)
    rep["accum"] = accum_rows(world)
    rep["state"] = state_row(world)
    rep["memory"], rep["timelines"] = memory_rows(world)
    return rep if rank == 0 else None


def overlap_rows(d_model: int = 256, n_layer: int = 4, batch: int = 8) -> dict:
    """``overlap_reduce_scatter`` on / off: the trained weights, the sent bytes and the peak of
    one step (MemoryTrace), with every block one ``padded`` flat of ``block_bytes``."""
    from shardlab.runtime import MemoryTrace

    x, y = make_batches(1, batch=batch, seed=12)[0]
    xr, yr = rank_slice(x), rank_slice(y)
    out = {}
    for overlap in (True, False):
        cfg = FSDPConfig(overlap_reduce_scatter=overlap)
        model, opt = train_fsdp("plain", "adamw", cfg, d_model=d_model, n_layer=n_layer)
        tr = traced_step(model, opt, xr, yr)
        with MemoryTrace() as mt:  # as benchmark_fsdp.py measures it
            mt.watch(model, opt)
            timed_steps(model, opt, xr, yr, 1)
        out[overlap] = {
            "weights": model.full_state_dict(),
            "sent": tr.sent_bytes(),
            "peak": mt.peak,
            "block_bytes": 4 * model.units[1].flats[0].padded,
        }
    return out
