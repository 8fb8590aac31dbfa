"""Functions every rank runs for the checkpoint tests, chapter and benchmark (importable).

Training is lab 04's: the two-block tiny GPT, AdamW, the global batches of
``_workers_fsdp.make_batches`` (4 sequences: 4, 2 or 1 per rank). Each rank seeds its RNG
with ``100 + rank`` so that the saved RNG states differ and their restoration is visible.
"""

from __future__ import annotations

import copy
import math
import os
import signal

import checkpoint as ckpt
import torch
import torch.distributed as dist
from _workers_fsdp import LR, ZERO_GRAD_PARAM, accumulate, make_batches, make_model
from fsdp import FSDP
from fsdp_units import all_gather_into_tensor
from shardlab.accounting import checkpoint as acc
from shardlab.models import lm_loss, make_optimizer, rank_slice
from shardlab.testing import ulps

TOTAL = 4  # training steps of every run
STATES = ("exp_avg", "exp_avg_sq")  # AdamW's per-element state
# Bounds of a resharded continuation against one that stayed on the old world size (derived in
# test_checkpoint.py; the chapter prints its verdicts against the same numbers): ulps at the
# tensor's scale, and the absolute difference of the zero-gradient key bias.
SCALE_ULPS = 16
ZERO_GRAD_TOL = LR["adamw"] / 100


def fresh(kind: str = "plain", **cfg) -> tuple[FSDP, torch.optim.Optimizer]:
    model = FSDP(make_model(kind, **cfg), dist.group.WORLD)
    return model, make_optimizer("adamw", model.parameters())


def train_step(model: FSDP, opt, step: int) -> None:
    """Training step ``step`` (1-based) on this rank's slice of global batch ``step - 1``."""
    x, y = make_batches(TOTAL)[step - 1]
    accumulate(model, rank_slice(x), rank_slice(y))
    opt.step()
    opt.zero_grad()


def snapshot(model: FSDP, opt) -> dict:
    """Full fp32 weights and AdamW moments per parameter name, the step, this rank's RNG."""
    out = {"params": model.full_state_dict(), "rng": torch.get_rng_state()}
    for k in STATES:
        out[k] = {}
    for u in model.units:
        for f in u.flats:
            st = opt.state.get(f.shard, {})
            out["step"] = float(st["step"]) if "step" in st else out.get("step")
            for k in STATES:
                if k not in st:
                    continue
                full = st[k].new_empty(f.padded, dtype=torch.float32)  # (padded,)
                all_gather_into_tensor(full, st[k], group=f.group)
                for slot, view in zip(f.slots, full[: f.numel].split(f.sizes())):
                    for _, _, name in slot.aliases:
                        out[k][name] = view.view(slot.shape).clone()
    return out


def _kill_during_save(after_records: int) -> None:
    """Make this rank SIGKILL itself after writing ``after_records`` records of its shard."""
    write, count = ckpt._write_record, [0]

    def dying(fh, t):
        if count[0] == after_records:
            fh.flush()  # a partial shard file really is on disk
            os.kill(os.getpid(), signal.SIGKILL)
        count[0] += 1
        return write(fh, t)

    ckpt._write_record = dying


def train_and_save(root: str, save_at=(2,), kill: tuple[int, int] | None = None) -> dict:
    """Train TOTAL steps from scratch, saving after each step in ``save_at``; ``kill = (rank,
    step)`` kills that rank in the middle of that step's save. Returns snapshots per save and
    the final weights (every rank: its RNG is in them)."""
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    model, opt = fresh()
    out = {}
    for step in range(1, TOTAL + 1):
        train_step(model, opt, step)
        if step in save_at:
            if kill is not None and kill == (rank, step):
                _kill_during_save(after_records=2)
            ckpt.save_checkpoint(root, step, model, opt)
            out[step] = snapshot(model, opt)
    out["final"] = model.full_state_dict()
    return out


def load_and_continue(path: str, save_root: str | None = None, save_at=(), bad=()) -> dict:
    """Load ``path`` into a fresh model at this world size and train to TOTAL (optionally
    saving into ``save_root``). Also runs, on rank 0, the single-process reference that
    continues from the loaded state with this world size's arithmetic. First, each of
    ``bad = [(path, model config), ...]`` is tried and must be refused (:func:`try_load`)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    refusals = try_load(bad)
    torch.manual_seed(999)  # whatever load restores must not come from here
    model, opt = fresh()
    rep = ckpt.load_checkpoint(path, model, opt)
    loaded = snapshot(model, opt)
    out = {"report": rep, "loaded": loaded, "rank": rank, "world": world, "refusals": refusals}
    meta = ckpt.read_meta(path)
    numels = [f["numel"] for f in meta["flats"]]
    rng_bytes = next(r["nbytes"] for r in meta["records"] if r["kind"] == "rng")
    out["predicted_read"] = acc.reshard_read_bytes(
        numels, meta["world_size"], world, rank, len(STATES), 4, rng_bytes
    )
    for step in range(rep.step + 1, TOTAL + 1):
        train_step(model, opt, step)
        if step in save_at:
            ckpt.save_checkpoint(save_root, step, model, opt)
            out[step] = snapshot(model, opt)
    out["final"] = model.full_state_dict()
    if rank == 0:
        out["reference"] = reference_continue(loaded, rep.step, world)
    return out


def reference_continue(state: dict, step: int, world: int) -> dict:
    """One process: set weights, moments and step from ``state``, then train to TOTAL the
    way ``world`` ranks add their gradients (each rank's gradient separately, summed in rank
    order, / world): on 1 or 2 ranks FSDP must match it bit for bit."""
    model = make_model("plain")
    opt = make_optimizer("adamw", model.parameters())
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(state["params"][n])
            opt.state[p] = {"step": torch.tensor(state["step"], dtype=torch.float32)}
            opt.state[p].update({k: state[k][n].clone() for k in STATES})
    for s in range(step + 1, TOTAL + 1):
        x, y = make_batches(TOTAL)[s - 1]
        total = None
        for r in range(world):
            local = copy.deepcopy(model)
            lm_loss(local, *rank_slice((x, y), r, world)).backward()
            g = [p.grad for p in local.parameters()]
            total = g if total is None else [a + b for a, b in zip(total, g)]
        for p, g in zip(model.parameters(), total):
            p.grad = g / world
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)}


def scale_ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest ``|a - b|`` in ulps of the tensor's scale: the spacing of fp32 numbers at
    ``max |b|`` (an element near 0 has a tiny ulp of its own, so its raw ulps say little)."""
    scale = float(b.abs().max())
    if scale == 0.0:
        return 0.0 if torch.equal(a, b) else math.inf
    return float((a - b).abs().max()) / 2.0 ** (math.floor(math.log2(scale)) - 23)


def ulp_report(got: dict, want: dict) -> dict:
    """Raw and tensor-scale ulps over all parameters but AdamW's noise-driven key bias
    (``ZERO_GRAD_PARAM``: its gradient is exactly 0, so Adam scales rounding noise up to
    updates of size ~lr), whose largest absolute difference is reported on its own."""
    rest = [n for n in want if not n.endswith(ZERO_GRAD_PARAM)]
    zero = [n for n in want if n.endswith(ZERO_GRAD_PARAM)]
    return {
        "bitwise": all(torch.equal(got[n], want[n]) for n in want),
        "max_ulps": max(ulps(got[n], want[n]) for n in rest),
        "max_scale_ulps": max(scale_ulps(got[n], want[n]) for n in rest),
        "zero_grad_param_max_abs": max(float((got[n] - want[n]).abs().max()) for n in zero),
    }


def try_load(cases) -> list[dict]:
    """Try each ``(path, model config)``; record the ValueError and whether the weights and
    optimizer stayed untouched (a refusal comes before anything changes)."""
    out = []
    for path, cfg in cases:
        model, opt = fresh(**cfg)
        before = model.full_state_dict()
        try:
            ckpt.load_checkpoint(path, model, opt)
            msg = None
        except ValueError as e:
            msg = str(e)
        after = model.full_state_dict()
        same = all(torch.equal(before[n], after[n]) for n in before) and not opt.state
        out.append({"error": msg, "untouched": same})
    return out
