"""Functions run on every rank by the DDP tests, notebook and benchmark (importable by name)."""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
from ddp import DDP
from torch import nn

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

    def forward(self, x):  # (b, IN) -> scalar loss against x itself
        y = self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))
        return ((y - x.flip(-1)) ** 2).mean()


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
    }
    return makers[kind]()


def make_batch(kind: str, step: int, n: int = GLOBAL_BATCH) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    if kind == "tied":
        return torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return torch.randn(n, IN, generator=g)


def make_opt(name: str, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def reference(kind: str, opt: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """Single process, full global batch, same seeds."""
    model = make_model(kind)
    o = make_opt(opt, [p for p in model.parameters() if p.requires_grad])
    for s in range(steps):
        o.zero_grad()
        model(make_batch(kind, s)).backward()
        o.step()
    return state(model)


def _local(x: torch.Tensor) -> torch.Tensor:
    r, d = dist.get_rank(), dist.get_world_size()
    n = x.shape[0] // d
    return x[r * n : (r + 1) * n]


def train_ddp(kind, opt, bucket_size_mb=None, microbatches=1, steps=STEPS, seed_offset=True):
    """Train with the from-scratch DDP. Ranks start from *different* seeds (checks broadcast)."""
    model = make_model(kind, seed=dist.get_rank() if seed_offset else 0)
    ddp = DDP(model, bucket_size_mb=bucket_size_mb)
    o = make_opt(opt, [p for p in ddp.parameters() if p.requires_grad])
    for s in range(steps):
        o.zero_grad()
        x = _local(make_batch(kind, s))
        chunks = x.chunk(microbatches)
        for i, xc in enumerate(chunks):
            last = i == len(chunks) - 1
            ctx = ddp.no_sync() if not last else _null()
            with ctx:
                (ddp(xc) / len(chunks)).backward()
        ddp.finish_gradient_synchronization()
        o.step()
    return state(model)


def train_torch_ddp(kind, opt, steps=STEPS):
    from torch.nn.parallel import DistributedDataParallel

    model = make_model(kind, seed=dist.get_rank())
    ddp = DistributedDataParallel(model)
    o = make_opt(opt, [p for p in ddp.parameters() if p.requires_grad])
    for s in range(steps):
        o.zero_grad()
        ddp(_local(make_batch(kind, s))).backward()
        o.step()
    return state(model)


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


CASES = [
    # (name, kind, optimizer, bucket_size_mb, microbatches)
    ("mlp-adamw-per-param", "mlp", "adamw", None, 1),
    ("mlp-sgd-bucketed", "mlp", "sgd", 0.0005, 1),
    ("tied-adamw-bucketed", "tied", "adamw", 0.0005, 1),
    ("tied-sgd-per-param", "tied", "sgd", None, 1),
    ("frozen-adamw-bucketed", "frozen", "adamw", 0.0005, 1),
    ("frozen-sgd-per-param", "frozen", "sgd", None, 1),
    ("mlp-adamw-no-sync", "mlp", "adamw", 0.0005, 2),
    ("tied-sgd-no-sync", "tied", "sgd", None, 2),
]


def correctness(cases=None, torch_cases=(("mlp", "adamw"),)) -> dict:
    """Run every case; return {name: state or error}. Rank 0 adds single-process references."""
    torch.set_num_threads(1)
    out: dict = {"runs": {}, "torch": {}, "ref": {}}
    for name, kind, opt, bucket, m in cases or CASES:
        try:
            out["runs"][name] = train_ddp(kind, opt, bucket, m)
        except Exception:  # report per case so one bug does not hide the others
            out["runs"][name] = traceback.format_exc()
            dist.barrier()
        if dist.get_rank() == 0:
            out["ref"][name] = reference(kind, opt)
    for kind, opt in torch_cases:
        out["torch"][f"{kind}-{opt}"] = train_torch_ddp(kind, opt)
    return out


def tensor_bytes(ts) -> int:
    """Bytes of distinct tensors (by storage pointer, so a tied weight counts once)."""
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
    params = list(model.parameters())
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


def measure(kind: str = "mlp", bucket_size_mb: float | None = 0.0005, microbatches: int = 4):
    """Model-state bytes and bytes sent per step / per accumulated update (AdamW, fp32)."""
    from shardlab.dist import CommTrace

    torch.set_num_threads(1)
    model = make_model(kind)
    ddp = DDP(model, bucket_size_mb=bucket_size_mb)
    opt = make_opt("adamw", [p for p in ddp.parameters() if p.requires_grad])
    out: dict = {"n_params": sum(p.numel() for p in ddp.params)}
    x = _local(make_batch(kind, 0))
    with CommTrace() as tr:
        opt.zero_grad()
        ddp(x).backward()
        ddp.finish_gradient_synchronization()
        opt.step()
    out["step_sent"] = tr.sent_bytes()
    out["step_ops"] = sorted({r.op for r in tr.records})
    out["state"] = model_state_bytes(model, opt)  # after step, before zero_grad: all alive
    for sync in (True, False):
        with CommTrace() as tr:
            opt.zero_grad()
            chunks = x.chunk(microbatches)
            for i, xc in enumerate(chunks):
                last = i == len(chunks) - 1
                with ddp.no_sync() if not (sync or last) else _null():
                    (ddp(xc) / len(chunks)).backward()
                if sync or last:
                    ddp.finish_gradient_synchronization()
            opt.step()
        out[f"accum_sent_sync={sync}"] = tr.sent_bytes()
    return out


def suite(cases=None, measure_kw=None) -> dict:
    """Everything the tests need from one launch: correctness cases, then measurements."""
    out = {"correctness": correctness(cases)}
    kw = {} if measure_kw is None else measure_kw
    out["measure"] = measure(**kw)
    local = GLOBAL_BATCH // dist.get_world_size()
    out["measure"]["microbatches"] = len(torch.empty(local).chunk(kw.get("microbatches", 4)))
    return out


def _step(model, opt, x, finish=None):
    opt.zero_grad()
    model(x).backward()
    if finish is not None:
        finish()
    opt.step()


def profile_step(impl: str, hid: int = 64, bucket_size_mb: float | None = 0.01) -> dict:
    """One AdamW step (after a warm-up step) under MemoryTrace: timeline and model-state bytes."""
    from shardlab.dist import MemoryTrace, phase
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MLP(hid=hid)
    if impl == "mine":
        wrapped = DDP(model, bucket_size_mb=bucket_size_mb)
        finish = wrapped.finish_gradient_synchronization
    else:
        wrapped, finish = DistributedDataParallel(model), None
    opt = make_opt("adamw", model.parameters())
    x = _local(make_batch("mlp", 0, n=256))
    _step(wrapped, opt, x, finish)  # creates the AdamW state
    opt.zero_grad(set_to_none=True)
    with MemoryTrace() as mt:
        mt.watch(model, opt)
        with phase("forward"):
            loss = wrapped(x)
        with phase("backward"):
            loss.backward()
            if finish is not None:
                finish()
        with phase("optimizer"):
            opt.step()
    return {
        "timeline": mt.timeline(),
        "n_params": sum(p.numel() for p in model.parameters()),
        "state": model_state_bytes(model, opt),
    }


def benchmark(hid: int = 256, steps: int = 30, bucket_size_mb: float = 25.0) -> dict:
    """Median step time and traced peak bytes: from-scratch DDP vs PyTorch DDP, same model."""
    import statistics
    import time

    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    out = {}
    for impl in ("mine", "torch"):
        torch.manual_seed(0)
        model = MLP(hid=hid)
        if impl == "mine":
            w = DDP(model, bucket_size_mb=bucket_size_mb)
            finish = w.finish_gradient_synchronization
        else:
            w, finish = DistributedDataParallel(model, bucket_cap_mb=bucket_size_mb), None
        opt = make_opt("adamw", model.parameters())
        x = _local(make_batch("mlp", 0, n=256))
        times = []
        for _ in range(steps + 2):
            dist.barrier()
            t0 = time.perf_counter()
            _step(w, opt, x, finish)
            times.append(time.perf_counter() - t0)
        out[impl] = {"step_s": statistics.median(times[2:])}
    for impl in ("mine", "torch"):
        out[impl]["peak"] = profile_step(impl, hid=hid, bucket_size_mb=bucket_size_mb)[
            "timeline"
        ].peak
    return out
