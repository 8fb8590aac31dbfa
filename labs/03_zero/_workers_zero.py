"""Functions run on every rank by the ZeRO tests, notebook and benchmark (importable by name)."""

from __future__ import annotations

import contextlib
import traceback

import torch
import torch.distributed as dist
from torch import nn
from zero import ShardedOptimizer, ZeRO2

IN, HID, VOCAB, SEQ = 8, 16, 11, 5
GLOBAL_BATCH = 24  # divisible by 2, 3, 4 ranks and by 2 microbatches per rank
STEPS = 3


class MLP(nn.Module):
    def __init__(self, frozen: bool = False, hid: int = HID) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN, hid)
        self.fc2 = nn.Linear(hid, hid)
        self.fc3 = nn.Linear(hid, IN)
        if frozen:
            self.fc1.requires_grad_(False)

    def forward(self, x):  # (b, IN) -> scalar loss
        y = self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))
        return ((y - x.flip(-1)) ** 2).mean()


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(IN, IN)

    def forward(self, x):  # (b, IN) -> scalar loss
        return ((self.fc(x) - x.flip(-1)) ** 2).mean()


class Tied(nn.Module):
    """Embedding and output projection share one weight (like GPT's wte / lm_head)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HID)
        self.mix = nn.Linear(HID, HID)
        self.head = nn.Linear(HID, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):  # (b, SEQ) tokens
        logits = self.head(torch.tanh(self.mix(self.emb(x))))  # (b, SEQ, VOCAB)
        return nn.functional.cross_entropy(logits.flatten(0, 1), x.roll(1, -1).flatten())


def make_model(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    makers = {
        "mlp": MLP,
        "frozen": lambda: MLP(frozen=True),
        "tied": Tied,
        "odd": lambda: MLP(hid=7),  # sizes that do not divide by 2, 3 or 4
        "linear": Linear,  # two tensors: on 3 ranks one rank owns nothing (ZeRO-1)
    }
    return makers[kind]()


def make_batch(kind: str, step: int, n: int = GLOBAL_BATCH) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    if kind == "tied":
        return torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return torch.randn(n, IN, generator=g)


OPTS = {
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    "sgd": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
}


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
    model = make_model(kind)
    cls, kw = OPTS[opt]
    o = cls(param_groups(model, groups), **kw)
    for s in range(steps):
        o.zero_grad()
        for xc in make_batch(kind, s).chunk(microbatches):
            (model(xc) / microbatches).backward()
        o.step()
    return state(model)


def _local(x: torch.Tensor, group=None) -> torch.Tensor:
    r, d = dist.get_rank(group), dist.get_world_size(group)
    n = x.shape[0] // d
    return x[r * n : (r + 1) * n]


def train_zero1(kind, opt, groups=False, steps=STEPS, group=None):
    model = make_model(kind)  # same seed everywhere: ShardedOptimizer does not broadcast
    cls, kw = OPTS[opt]
    o = ShardedOptimizer(param_groups(model, groups), cls, group=group, **kw)
    for s in range(steps):
        o.zero_grad()
        model(_local(make_batch(kind, s), group)).backward()
        o.step()
    return state(model)


def train_zero2(kind, opt, bucket_size_mb=0.0005, microbatches=1, steps=STEPS, group=None):
    model = make_model(kind, seed=dist.get_rank())  # different seeds: checks the broadcast
    cls, kw = OPTS[opt]
    z = ZeRO2(model, cls, bucket_size_mb=bucket_size_mb, group=group, **kw)
    for s in range(steps):
        z.zero_grad()
        chunks = _local(make_batch(kind, s), group).chunk(microbatches)
        for i, xc in enumerate(chunks):
            if i < len(chunks) - 1:
                with z.no_sync():
                    (z(xc) / len(chunks)).backward()
            else:
                (z(xc) / len(chunks)).backward()
        z.finish_gradient_synchronization()
        z.step()
    return state(model)


def train_torch(kind, opt, zero: bool, steps=STEPS):
    """PyTorch's DDP, with ZeroRedundancyOptimizer when ``zero``."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    model = make_model(kind)
    ddp = DistributedDataParallel(model)
    cls, kw = OPTS[opt]
    ps = [p for p in ddp.parameters() if p.requires_grad]
    o = ZeroRedundancyOptimizer(ps, cls, **kw) if zero else cls(ps, **kw)
    for s in range(steps):
        o.zero_grad()
        ddp(_local(make_batch(kind, s))).backward()
        o.step()
    return state(model)


ZERO1_CASES = [
    # (name, kind, optimizer, param groups)
    ("mlp-adamw", "mlp", "adamw", False),
    ("tied-sgd", "tied", "sgd", False),
    ("frozen-adamw", "frozen", "adamw", False),
    ("mlp-adamw-groups", "mlp", "adamw", True),
]
ZERO2_CASES = [
    # (name, kind, optimizer, bucket_size_mb, microbatches)
    ("mlp-adamw", "mlp", "adamw", 0.0005, 1),
    ("tied-sgd", "tied", "sgd", 0.0005, 1),
    ("frozen-adamw", "frozen", "adamw", 0.0005, 1),
    ("mlp-sgd-no-sync", "mlp", "sgd", 0.0005, 2),
]


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # report per case so one bug does not hide the others
        return traceback.format_exc()


def correctness(zero1_cases=None, zero2_cases=None, torch_cases=(("mlp", "adamw"),)) -> dict:
    """Every case on every rank; rank 0 adds the single-process references."""
    torch.set_num_threads(1)
    rank0 = dist.get_rank() == 0
    out: dict = {"zero1": {}, "zero2": {}, "ref1": {}, "ref2": {}, "torch": {}}
    for name, kind, opt, groups in ZERO1_CASES if zero1_cases is None else zero1_cases:
        out["zero1"][name] = _try(train_zero1, kind, opt, groups)
        if rank0:
            out["ref1"][name] = reference(kind, opt, groups)
    for name, kind, opt, bucket, m in ZERO2_CASES if zero2_cases is None else zero2_cases:
        out["zero2"][name] = _try(train_zero2, kind, opt, bucket, m)
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


def measure(kind: str = "mlp", bucket_size_mb: float = 0.0005, microbatches: int = 4) -> dict:
    """Model-state bytes and bytes sent per step / per accumulated update, ZeRO-1 and ZeRO-2."""
    from shardlab.dist import CommTrace

    torch.set_num_threads(1)
    cls, kw = OPTS["adamw"]
    x = _local(make_batch(kind, 0))
    microbatches = len(x.chunk(microbatches))
    out: dict = {"microbatches": microbatches}

    # ZeRO-1
    model = make_model(kind)
    o = ShardedOptimizer([p for p in model.parameters() if p.requires_grad], cls, **kw)
    with CommTrace() as tr:
        o.zero_grad()
        model(x).backward()
        o.step()
    params = list(model.parameters())
    out["zero1"] = {
        "n_params": sum(p.numel() for p in o.params),
        "padded_numel": o.padded_numel,
        "loads": o.loads,
        "step_sent": tr.sent_bytes(),
        "step_ops": sorted({r.op for r in tr.records}),
        "state": {
            "weights": _bytes(params),
            "grads": _bytes(p.grad for p in params),
            **_moments(o.optim),
        },
    }
    with CommTrace() as tr:  # accumulate locally, reduce once in step()
        o.zero_grad()
        for xc in x.chunk(microbatches):
            (model(xc) / microbatches).backward()
        o.step()
    out["zero1"]["accum_sent_sync=False"] = tr.sent_bytes()

    # ZeRO-2
    model = make_model(kind)
    z = ZeRO2(model, cls, bucket_size_mb=bucket_size_mb, **kw)
    with CommTrace() as tr:
        z.zero_grad()
        z(x).backward()
        full_grads_after_backward = _bytes(p.grad for p in model.parameters())
        z.finish_gradient_synchronization()
        z.step()
    out["zero2"] = {
        "n_params": sum(b.numel for b in z.buckets),
        "padded_numel": z.padded_numel,
        "n_buckets": len(z.buckets),
        "step_sent": tr.sent_bytes(),
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
            chunks = x.chunk(microbatches)
            for i, xc in enumerate(chunks):
                if not sync and i < len(chunks) - 1:
                    with z.no_sync():
                        (z(xc) / len(chunks)).backward()
                else:
                    (z(xc) / len(chunks)).backward()
                    z.finish_gradient_synchronization()
            z.step()
        out["zero2"][f"accum_sent_sync={sync}"] = tr.sent_bytes()
    return out


def suite(zero1_cases=None, zero2_cases=None, measure_kw=None) -> dict:
    """Everything the tests need from one launch."""
    out = {"correctness": correctness(zero1_cases, zero2_cases)}
    out["measure"] = measure(**(measure_kw or {}))
    return out


def _build(impl: str, hid: int, bucket_size_mb: float):
    """(model, forward module, optimizer-like, finish) for one layout, AdamW fp32."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    cls, kw = OPTS["adamw"]
    torch.manual_seed(0)
    model = MLP(hid=hid)
    if impl == "zero1":
        return model, model, ShardedOptimizer(list(model.parameters()), cls, **kw), None
    if impl == "zero2":
        z = ZeRO2(model, cls, bucket_size_mb=bucket_size_mb, **kw)
        return model, z, z, z.finish_gradient_synchronization
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb)
    return model, ddp, ZeroRedundancyOptimizer(list(model.parameters()), cls, **kw), None


def profile_step(impl: str, hid: int = 64, bucket_size_mb: float = 0.01) -> dict:
    """One AdamW step (after a warm-up step) under MemoryTrace."""
    from shardlab.dist import MemoryTrace, phase

    torch.set_num_threads(1)
    model, fwd, opt, finish = _build(impl, hid, bucket_size_mb)
    x = _local(make_batch("mlp", 0, n=256))
    for traced in (False, True):
        opt.zero_grad()
        with MemoryTrace() if traced else contextlib.nullcontext() as mt:
            if traced:
                mt.watch(model, opt.optimizer if impl == "zero2" else opt)
            with phase("forward"):
                loss = fwd(x)
            with phase("backward"):
                loss.backward()
                if finish is not None:
                    finish()
            with phase("optimizer"):
                opt.step()
    n = sum(p.numel() for p in model.parameters())
    n_state = opt.padded_numel if impl == "zero2" else n  # ZeRO-2 stores the padding too
    return {"timeline": mt.timeline(), "n_params": n, "n_state": n_state}


def benchmark(hid: int = 256, steps: int = 30, bucket_size_mb: float = 25.0) -> dict:
    """Median step time and traced peak: ZeRO-1 and ZeRO-2 vs DDP + ZeroRedundancyOptimizer."""
    import statistics
    import time

    torch.set_num_threads(1)
    out = {}
    for impl in ("zero1", "zero2", "torch"):
        model, fwd, opt, finish = _build(impl, hid, bucket_size_mb)
        x = _local(make_batch("mlp", 0, n=256))
        times = []
        for _ in range(steps + 2):
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            fwd(x).backward()
            if finish is not None:
                finish()
            opt.step()
            times.append(time.perf_counter() - t0)
        out[impl] = {"step_s": statistics.median(times[2:])}
        out[impl]["peak"] = profile_step(impl, hid, bucket_size_mb)["timeline"].peak
    return out
