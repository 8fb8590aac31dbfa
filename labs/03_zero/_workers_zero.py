"""Functions run on every rank by the ZeRO tests, notebook and benchmark (importable by name).

Model, data, loss and optimizers: :mod:`shardlab.models.tiny` (``tiny_gpt`` in the variants
``plain``, ``tied``, ``frozen``, ``odd`` and ``two`` (two trainable tensors); ``step_batch``
global batches, ``rank_slice`` of them per rank; ``lm_loss``; AdamW and SGD).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from shardlab.models import (
    OPTIMIZERS,
    lm_loss,
    rank_slice,
    split_microbatches,
    step_batch,
    tiny_gpt,
    train_step,
)
from shardlab.models import predicted_step_peak as predicted_peak  # noqa: F401 (tests, notebook)
from shardlab.testing import stub_or_raise
from torch import nn
from zero1 import ShardedOptimizer
from zero2 import ZeRO2

STEPS = 3
make_model = tiny_gpt  # the name callers import


def param_groups(model: nn.Module, groups: bool):
    ps = [p for p in model.parameters() if p.requires_grad]
    if not groups:
        return ps
    # Two groups with different hyperparameters: matrices and vectors (biases).
    return [
        {"params": [p for p in ps if p.ndim > 1]},
        {"params": [p for p in ps if p.ndim <= 1], "lr": 3e-3, "weight_decay": 0.0},
    ]


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference(kind: str, opt: str, groups: bool = False, steps: int = STEPS, microbatches=1):
    """Single process, full global batch, plain ``optimizer_cls``."""
    model = tiny_gpt(kind)
    cls, kw = OPTIMIZERS[opt]
    o = cls(param_groups(model, groups), **kw)
    for s in range(steps):
        o.zero_grad()
        for xy in split_microbatches(step_batch(model.config, s), microbatches):
            (lm_loss(model, *xy) / microbatches).backward()
        o.step()
    return state(model)


def train_zero1(kind, opt, groups=False, steps=STEPS, group=None):
    """Several chunks (1 KB buckets), weight all-gathers overlapped with the next forward
    (``measure`` runs the synchronous path): each chunk must land before its first use."""
    model = tiny_gpt(kind)  # same seed everywhere: ShardedOptimizer does not broadcast
    cls, kw = OPTIMIZERS[opt]
    o = ShardedOptimizer(
        param_groups(model, groups), cls, group=group, bucket_size_mb=0.001,
        overlap_gather=True, **kw,
    )
    for s in range(steps):
        o.zero_grad()
        lm_loss(model, *rank_slice(step_batch(model.config, s), group=group)).backward()
        o.step()
    o.wait_for_weights()  # the last step's gathers: no forward follows to wait for them
    return state(model)


def train_zero2(kind, opt, bucket_size_mb=0.0005, microbatches=1, steps=STEPS, group=None):
    model = tiny_gpt(kind, seed=dist.get_rank())  # different seeds: checks the broadcast
    cls, kw = OPTIMIZERS[opt]
    z = ZeRO2(model, cls, bucket_size_mb=bucket_size_mb, group=group, **kw)
    for s in range(steps):
        z.zero_grad()
        chunks = split_microbatches(
            rank_slice(step_batch(model.config, s), group=group), microbatches
        )
        for i, xy in enumerate(chunks):
            if i < len(chunks) - 1:
                with z.no_sync():
                    (lm_loss(z, *xy) / len(chunks)).backward()
            else:
                (lm_loss(z, *xy) / len(chunks)).backward()
        z.finish_gradient_synchronization()
        z.step()
    return state(model)


def train_torch(kind, opt, zero: bool, steps=STEPS):
    """PyTorch's DDP, with ZeroRedundancyOptimizer when ``zero``."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = tiny_gpt(kind)
    ddp = DistributedDataParallel(model)
    cls, kw = OPTIMIZERS[opt]
    ps = [p for p in ddp.parameters() if p.requires_grad]
    o = ZeroRedundancyOptimizer(ps, cls, **kw) if zero else cls(ps, **kw)
    for s in range(steps):
        o.zero_grad()
        lm_loss(ddp, *rank_slice(step_batch(model.config, s))).backward()
        o.step()
    return state(model)


ZERO1_CASES = [
    # (name, kind, optimizer, param groups)
    ("plain-adamw", "plain", "adamw", False),
    ("tied-sgd", "tied", "sgd", False),
    ("frozen-adamw", "frozen", "adamw", False),
    ("plain-adamw-groups", "plain", "adamw", True),
]
ZERO2_CASES = [
    # (name, kind, optimizer, bucket_size_mb, microbatches)
    ("plain-adamw", "plain", "adamw", 0.001, 1),
    ("tied-sgd", "tied", "sgd", 0.001, 1),
    ("frozen-adamw", "frozen", "adamw", 0.001, 1),
    ("plain-sgd-no-sync", "plain", "sgd", 0.001, 2),
]


def correctness(zero1_cases=None, zero2_cases=None, torch_cases=(("plain", "adamw"),)) -> dict:
    """Every case on every rank; rank 0 adds the single-process references."""
    torch.set_num_threads(1)
    rank0 = dist.get_rank() == 0
    out: dict = {"zero1": {}, "zero2": {}, "ref1": {}, "ref2": {}, "torch": {}}
    # stub_or_raise: a stub (NotImplementedError) is reported per case, any other error ends
    # the run with this rank's traceback
    for name, kind, opt, groups in ZERO1_CASES if zero1_cases is None else zero1_cases:
        out["zero1"][name] = stub_or_raise(train_zero1, kind, opt, groups)
        if rank0:
            out["ref1"][name] = reference(kind, opt, groups)
    for name, kind, opt, bucket, m in ZERO2_CASES if zero2_cases is None else zero2_cases:
        out["zero2"][name] = stub_or_raise(train_zero2, kind, opt, bucket, m)
        if rank0:
            out["ref2"][name] = reference(kind, opt, microbatches=m)
    for kind, opt in torch_cases:
        out["torch"][f"ddp-{kind}-{opt}"] = train_torch(kind, opt, zero=False)
        out["torch"][f"zero-{kind}-{opt}"] = train_torch(kind, opt, zero=True)
    return out


def _bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _moments(opt: torch.optim.Optimizer) -> dict[str, int]:
    sts = list(opt.state.values()) if opt is not None else []
    return {
        "moment1": _bytes(st.get("exp_avg") for st in sts),
        "moment2": _bytes(st.get("exp_avg_sq") for st in sts),
        # AdamW's scalar step counters: 4 bytes per optimized tensor, listed apart
        "bookkeeping": _bytes(
            t for st in sts for t in st.values() if torch.is_tensor(t) and t.dim() == 0
        ),
    }


def measure(kind: str = "plain", bucket_size_mb: float = 0.001, microbatches: int = 4) -> dict:
    """Model-state bytes and bytes sent per step / per accumulated update, ZeRO-1 and ZeRO-2."""
    from shardlab.runtime import CommTrace

    torch.set_num_threads(1)
    cls, kw = OPTIMIZERS["adamw"]
    model = tiny_gpt(kind)
    xy = rank_slice(step_batch(model.config, 0))
    chunks = split_microbatches(xy, microbatches)
    out: dict = {"microbatches": len(chunks)}

    # ZeRO-1
    o = ShardedOptimizer([p for p in model.parameters() if p.requires_grad], cls, **kw)
    with CommTrace() as tr:
        o.zero_grad()
        lm_loss(model, *xy).backward()
        o.step()
    params = [p for p in model.parameters() if p.requires_grad]
    out["zero1"] = {
        "n_params": sum(p.numel() for p in o.params),
        "padded_numel": o.padded_numel,
        "loads": o.loads,
        "step_sent": tr.sent_bytes(),
        "step_wire": tr.wire_bytes(),  # measured on the sockets; None where not measurable
        "step_backend": tr.backend_bytes(),  # gloo's own algorithm (accounting.wire)
        "step_calls": tr.count(),
        "step_ops": sorted({r.op for r in tr.records}),
        "state": {
            "weights": _bytes(params),
            "grads": _bytes(p.grad for p in params),
            **_moments(o.optim),
        },
    }
    for sync in (True, False):  # no_sync() until the last microbatch: reduce once
        with CommTrace() as tr:
            o.zero_grad()
            for i, c in enumerate(chunks):
                with o.no_sync() if not sync and i < len(chunks) - 1 else contextlib.nullcontext():
                    (lm_loss(model, *c) / len(chunks)).backward()
            o.step()
        out["zero1"][f"accum_sent_sync={sync}"] = tr.sent_bytes()
        out["zero1"][f"accum_wire_sync={sync}"] = tr.wire_bytes()
        out["zero1"][f"accum_backend_sync={sync}"] = tr.backend_bytes()

    # ZeRO-2
    model = tiny_gpt(kind)
    z = ZeRO2(model, cls, bucket_size_mb=bucket_size_mb, **kw)
    with CommTrace() as tr:
        z.zero_grad()
        lm_loss(z, *xy).backward()
        full_grads_after_backward = _bytes(p.grad for p in model.parameters())
        z.finish_gradient_synchronization()
        z.step()
        z.wait_for_weights()  # the all-gathers run on: keep their bytes in this window
    out["zero2"] = {
        "n_params": sum(b.numel for b in z.buckets),
        "padded_numel": z.padded_numel,
        "n_buckets": len(z.buckets),
        "step_sent": tr.sent_bytes(),
        "step_wire": tr.wire_bytes(),  # measured on the sockets; None where not measurable
        "step_backend": tr.backend_bytes(),  # gloo's own algorithm (accounting.wire)
        "step_calls": tr.count(),
        "step_ops": sorted({r.op for r in tr.records}),
        "full_grads_after_backward": full_grads_after_backward,
        "state": {
            "weights": _bytes(b.weights for b in z.buckets),
            "grads": _bytes(b.shard.grad for b in z.buckets)
            + _bytes(p.grad for p in model.parameters()),
            **_moments(z.optimizer),
        },
    }
    for sync in (True, False):
        with CommTrace() as tr:
            z.zero_grad()
            for i, c in enumerate(chunks):
                if not sync and i < len(chunks) - 1:
                    with z.no_sync():
                        (lm_loss(z, *c) / len(chunks)).backward()
                else:
                    (lm_loss(z, *c) / len(chunks)).backward()
                    z.finish_gradient_synchronization()
            z.step()
            z.wait_for_weights()
        out["zero2"][f"accum_sent_sync={sync}"] = tr.sent_bytes()
        out["zero2"][f"accum_wire_sync={sync}"] = tr.wire_bytes()
        out["zero2"][f"accum_backend_sync={sync}"] = tr.backend_bytes()
    return out


def suite(zero1_cases=None, zero2_cases=None, measure_kw=None, profile=True) -> dict:
    """Everything the tests need from one launch (``profile``: peak memory per layout)."""
    out = {"correctness": correctness(zero1_cases, zero2_cases)}
    out["measure"] = measure(**(measure_kw or {}))
    if profile:
        out["profile"] = {impl: profile_step(impl) for impl in ("zero1", "zero2")}
    return out


# ---------------------------------------------------------------- peak memory, benchmark

PROFILE_BATCH = 4  # global sequences per step for the memory profile
PROFILE_BUCKET_MB = 0.02


def _build(impl: str, size: str, bucket_size_mb: float):
    """(model, forward module, optimizer-like, finish) for one layout, AdamW fp32."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    cls, kw = OPTIMIZERS["adamw"]
    model = tiny_gpt("plain", size=size)
    if impl == "zero1":
        opt = ShardedOptimizer(list(model.parameters()), cls, bucket_size_mb=bucket_size_mb, **kw)
        return model, model, opt, None
    if impl == "zero2":
        z = ZeRO2(model, cls, bucket_size_mb=bucket_size_mb, **kw)
        return model, z, z, z.finish_gradient_synchronization
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb)
    return model, ddp, ZeroRedundancyOptimizer(list(model.parameters()), cls, **kw), None


def profile_step(
    impl: str, size: str = "profile", bucket_size_mb: float = PROFILE_BUCKET_MB,
    n: int = PROFILE_BATCH,
) -> dict:
    """One AdamW step (after a warm-up step) under MemoryTrace, plus what the prediction
    needs: ``n_state`` (elements the layout's model-state formula is applied to: ``D*S``
    for ZeRO-1, ``N_pad`` for ZeRO-2), ``stepped`` (numel of each tensor this rank's AdamW
    steps), ``buckets`` (bytes of each ZeRO-2 gradient bucket) and ``logits_shape``
    (``(b, s, V)`` of this rank's fp32 logits)."""
    from shardlab.runtime import MemoryTrace

    torch.set_num_threads(1)
    model, fwd, opt, finish = _build(impl, size, bucket_size_mb)
    xy = rank_slice(step_batch(model.config, 0, n))
    train_step(fwd, opt, xy, finish)  # creates the AdamW state
    opt.zero_grad()
    inner = opt.optimizer if impl == "zero2" else getattr(opt, "optim", opt)
    with MemoryTrace() as mt:
        mt.watch(model, inner)
        if impl == "zero1":  # flat buffers allocated before the trace
            mt.tag(opt.flat_weights, "parameters")
            mt.tag(opt.flat_grads, "gradients")
        if impl == "zero2":
            mt.tag([b.weights for b in opt.buckets], "parameters")
            mt.tag([b.grad_shard for b in opt.buckets], "gradients")
        train_step(fwd, opt, xy, finish)  # in phases forward, backward, optimizer
    c = model.config
    stepped = [p.numel() for g in inner.param_groups for p in g["params"]] if inner else []
    return {
        "timeline": mt.timeline(),
        "n_params": sum(p.numel() for p in model.parameters()),
        "n_state": opt.padded_numel if impl in ("zero1", "zero2") else None,
        "stepped": stepped,
        "buckets": [b.padded * 4 for b in opt.buckets] if impl == "zero2" else [],
        "logits_shape": (xy[0].shape[0], c.seq_len, c.vocab_size),
    }
