"""Functions run on every rank by the DDP tests, notebook and benchmark (importable by name).

Model, data, loss and optimizers: :mod:`shardlab.models.tiny` (``tiny_gpt`` in the variants
``plain``, ``tied``, ``frozen`` and ``odd``; ``step_batch`` global batches, ``rank_slice`` of
them per rank; ``lm_loss``; AdamW and SGD).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from ddp import DDP
from shardlab.models import (
    lm_loss,
    make_optimizer,
    rank_slice,
    split_microbatches,
    step_batch,
    tiny_gpt,
    train_step,
)
from shardlab.models import predicted_step_peak as predicted_peak  # noqa: F401 (tests, notebook)
from shardlab.runtime.cases import stub_or_raise
from torch import nn

STEPS = 3
make_model = tiny_gpt  # the name tests and the benchmark import


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference(kind: str, opt: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """Single process, full global batch, same seeds."""
    model = tiny_gpt(kind)
    o = make_optimizer(opt, model.parameters())
    for s in range(steps):
        o.zero_grad()
        lm_loss(model, *step_batch(model.config, s)).backward()
        o.step()
    return state(model)


def train_ddp(kind, opt, bucket_size_mb=None, microbatches=1, steps=STEPS):
    """Train with the from-scratch DDP. Ranks start from *different* seeds (checks broadcast)."""
    model = tiny_gpt(kind, seed=dist.get_rank())
    ddp = DDP(model, bucket_size_mb=bucket_size_mb)
    o = make_optimizer(opt, ddp.parameters())
    for s in range(steps):
        o.zero_grad()
        chunks = split_microbatches(rank_slice(step_batch(model.config, s)), microbatches)
        for i, xy in enumerate(chunks):
            if i < len(chunks) - 1:
                with ddp.no_sync():
                    (lm_loss(ddp, *xy) / len(chunks)).backward()
            else:
                (lm_loss(ddp, *xy) / len(chunks)).backward()
        ddp.finish_gradient_synchronization()
        o.step()
    return state(model)


def train_torch_ddp(kind, opt, steps=STEPS):
    from torch.nn.parallel import DistributedDataParallel

    model = tiny_gpt(kind, seed=dist.get_rank())
    ddp = DistributedDataParallel(model)
    o = make_optimizer(opt, ddp.parameters())
    for s in range(steps):
        o.zero_grad()
        lm_loss(ddp, *rank_slice(step_batch(model.config, s))).backward()
        o.step()
    return state(model)


CASES = [
    # (name, kind, optimizer, bucket_size_mb, microbatches)
    ("plain-adamw-per-param", "plain", "adamw", None, 1),
    ("plain-sgd-bucketed", "plain", "sgd", 0.001, 1),
    ("tied-adamw-bucketed", "tied", "adamw", 0.001, 1),
    ("tied-sgd-per-param", "tied", "sgd", None, 1),
    ("frozen-adamw-bucketed", "frozen", "adamw", 0.001, 1),
    ("frozen-sgd-per-param", "frozen", "sgd", None, 1),
    ("plain-adamw-no-sync", "plain", "adamw", 0.001, 2),
    ("tied-sgd-no-sync", "tied", "sgd", None, 2),
]


def correctness(cases=None, torch_cases=(("plain", "adamw"),)) -> dict:
    """Run every case; return {name: state or error}. Rank 0 adds single-process references."""
    torch.set_num_threads(1)
    out: dict = {"runs": {}, "torch": {}, "ref": {}}
    for name, kind, opt, bucket, m in cases or CASES:
        # a stub is reported per case so it does not hide the others; any other error ends
        # the run with this rank's traceback (its peers may be waiting for its messages)
        out["runs"][name] = stub_or_raise(train_ddp, kind, opt, bucket, m, case=name)
        if isinstance(out["runs"][name], str):
            dist.barrier()
        if dist.get_rank() == 0:
            out["ref"][name] = reference(kind, opt)
    for kind, opt in torch_cases:
        out["torch"][f"{kind}-{opt}"] = train_torch_ddp(kind, opt)
    return out


def tensor_bytes(ts) -> int:
    """Bytes of distinct tensors (by data pointer, so a tied weight counts once)."""
    seen: dict[int, int] = {}
    for t in ts:
        if t is not None:
            seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def model_state_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Persistent model state held by this rank, measured from the tensors themselves.

    Optimizer state tensors of a parameter's shape are the moments; AdamW's scalar ``step``
    counters (4 bytes per tensor) are reported separately as ``bookkeeping``.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    moments = [t for st in opt.state.values() for t in st.values() if torch.is_tensor(t)]
    big = [t for t in moments if t.dim() > 0]
    return {
        "weights": tensor_bytes(params),
        "grads": tensor_bytes(p.grad for p in params),
        "moment1": tensor_bytes(st["exp_avg"] for st in opt.state.values()),
        "moment2": tensor_bytes(st["exp_avg_sq"] for st in opt.state.values()),
        "bookkeeping": sum(t.numel() * t.element_size() for t in moments if t.dim() == 0),
        "optimizer_other": tensor_bytes(big)
        - tensor_bytes(
            t for st in opt.state.values() for k, t in st.items() if k in ("exp_avg", "exp_avg_sq")
        ),
    }


def measure(kind: str = "plain", bucket_size_mb: float | None = 0.001, microbatches: int = 4):
    """Model-state bytes and bytes sent per step / per accumulated update (AdamW, fp32)."""
    from shardlab.runtime import CommTrace

    torch.set_num_threads(1)
    model = tiny_gpt(kind)
    ddp = DDP(model, bucket_size_mb=bucket_size_mb)
    opt = make_optimizer("adamw", ddp.parameters())
    out: dict = {"n_params": sum(p.numel() for p in ddp.params)}
    xy = rank_slice(step_batch(model.config, 0))
    with CommTrace() as tr:
        opt.zero_grad()
        lm_loss(ddp, *xy).backward()
        ddp.finish_gradient_synchronization()
        opt.step()
    out["step_sent"] = tr.sent_bytes()
    out["step_wire"] = tr.wire_bytes()  # measured on the sockets; None where not measurable
    out["step_backend"] = tr.backend_bytes()  # gloo's own algorithm (accounting.wire)
    out["step_calls"] = tr.count()
    out["step_ops"] = sorted({r.op for r in tr.records})
    out["state"] = model_state_bytes(model, opt)  # after step, before zero_grad: all alive
    chunks = split_microbatches(xy, microbatches)
    out["microbatches"] = len(chunks)
    for sync in (True, False):
        with CommTrace() as tr:
            opt.zero_grad()
            for i, c in enumerate(chunks):
                last = i == len(chunks) - 1
                if sync or last:
                    (lm_loss(ddp, *c) / len(chunks)).backward()
                    ddp.finish_gradient_synchronization()
                else:
                    with ddp.no_sync():
                        (lm_loss(ddp, *c) / len(chunks)).backward()
            opt.step()
        out[f"accum_sent_sync={sync}"] = tr.sent_bytes()
        out[f"accum_wire_sync={sync}"] = tr.wire_bytes()
        out[f"accum_backend_sync={sync}"] = tr.backend_bytes()
    return out


def suite(cases=None, measure_kw=None, profile=True) -> dict:
    """Everything the tests need from one launch: correctness, measurements, peak profiles."""
    out = {"correctness": correctness(cases)}
    out["measure"] = measure(**(measure_kw or {}))
    if profile:
        out["profile"] = profile_step("mine")
    return out


# ---------------------------------------------------------------- peak memory, benchmark

PROFILE_BATCH = 4  # global sequences per step for the memory profile
PROFILE_BUCKET_MB = 0.02


def _build(impl: str, size: str, bucket_size_mb: float):
    from torch.nn.parallel import DistributedDataParallel

    model = tiny_gpt("plain", size=size)
    if impl == "mine":
        w = DDP(model, bucket_size_mb=bucket_size_mb)
        return model, w, w.finish_gradient_synchronization
    return model, DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb), None


def profile_step(
    impl: str = "mine", size: str = "profile", bucket_size_mb: float = PROFILE_BUCKET_MB,
    n: int = PROFILE_BATCH,
) -> dict:
    """One AdamW step (after a warm-up step) under MemoryTrace, plus what the prediction needs.

    Returns the timeline, ``n_params``, the measured model state, and the sizes
    :func:`predicted_peak` uses: ``n_state`` (= ``n_params``), ``stepped`` (numel of each
    tensor AdamW steps) and ``logits_shape`` (``(b, s, V)`` of this rank's fp32 logits).
    """
    from shardlab.runtime import MemoryTrace

    torch.set_num_threads(1)
    model, wrapped, finish = _build(impl, size, bucket_size_mb)
    opt = make_optimizer("adamw", model.parameters())
    xy = rank_slice(step_batch(model.config, 0, n))
    train_step(wrapped, opt, xy, finish)  # creates the AdamW state
    opt.zero_grad(set_to_none=True)
    with MemoryTrace() as mt:
        mt.watch(model, opt)
        if impl == "mine":  # the buckets are the gradients; allocated before the trace
            mt.tag([b.buffer for b in wrapped._buckets], "gradients")
        train_step(wrapped, opt, xy, finish)  # in phases forward, backward, optimizer
    c = model.config
    n = sum(p.numel() for p in model.parameters())
    return {
        "timeline": mt.timeline(),
        "n_params": n,
        "n_state": n,
        "state": model_state_bytes(model, opt),
        "stepped": [p.numel() for p in model.parameters()],
        "logits_shape": (xy[0].shape[0], c.seq_len, c.vocab_size),
    }
