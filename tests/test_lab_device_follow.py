"""Every tensor the labs' modules allocate follows the device of the data it works with.

The labs run on CPU/gloo here, and on CUDA/nccl (one GPU per rank) where a GPU exists. A
``torch.zeros(n)`` without ``device=`` lands on the CPU and breaks the nccl run (an
all-gather into a CPU buffer, a CPU gradient added to a CUDA one), and no CPU test notices.

1. A static check (ast): in every lab module (student modules, ``_workers_*.py`` and the
   other helpers next to them; not the tests or benchmarks) and in ``shardlab.train``, each
   call ``torch.empty/zeros/ones/full/arange/tensor/randn/rand/empty_strided`` passes
   ``device=``, unless it is in :data:`ALLOWED` below with the reason it must be on the CPU.
   (``x.new_empty``, ``torch.empty_like`` ... follow ``x`` and need no entry.)
2. A runtime check on the ``meta`` device: the pieces that run without collectives
   (serial TP model, attention block kernels, a pipeline stage, the MoE router and expert
   MLP) take meta inputs/parameters and return meta outputs and gradients, so nothing in
   them allocates on a fixed device.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ALLOCATORS = set("empty zeros ones full arange tensor randn rand empty_strided".split())

_SEEDED = "seeded data from a CPU torch.Generator (the same numbers on every machine; a CPU "
_SEEDED += "generator cannot draw CUDA tensors)"
_CPU_TEST = "CPU/gloo test worker: builds its model and expected values on the CPU; no "
_CPU_TEST += "GPU path (shardlab train) runs it"

# (file, enclosing function, torch function) -> why this allocation stays on the CPU
ALLOWED: dict[tuple[str, str, str], str] = {
    ("labs/01_collectives/_workers_collectives.py", "rank_input", "randn"): _SEEDED,
    ("labs/01_collectives/_workers_collectives.py", "check_all_to_all", "randn"): _SEEDED,
    ("labs/04_fsdp/checkpoint.py", "load_checkpoint", "tensor"): (
        "AdamW's 'step' is a CPU float32 scalar unless capturable/fused, exactly as "
        "torch.optim.AdamW creates it"
    ),
    ("labs/04_fsdp/_workers_checkpoint.py", "reference_continue", "tensor"): (
        "AdamW's 'step' is a CPU float32 scalar unless capturable/fused (as torch.optim.AdamW)"
    ),
    ("labs/05_pipeline/_workers_pipeline.py", "_broadcast_loss", "zeros"): _CPU_TEST,
    ("labs/05_pipeline/_timing_pipeline.py", "timed", "tensor"): _CPU_TEST,
    ("labs/06_tensor/_workers_tensor.py", "_block_inputs", "randn"): _SEEDED,
    ("labs/06_tensor/_workers_tensor.py", "loss_comm", "randn"): _SEEDED,
    ("labs/06_tensor/_workers_tensor.py", "operator_rows.inputs", "randn"): _SEEDED,
    ("labs/06_tensor/tensor_reference.py", "dropout_mask", "rand"): (
        _SEEDED + "; moved to the caller's device right after (.to(device))"
    ),
    ("labs/06_tensor/tensor_reference.py", "SerialGPT.__init__", "zeros"): (
        "module construction, like nn.Linear: built on the CPU, the caller moves it (.to)"
    ),
    ("labs/06_tensor/tensor_reference.py", "SerialGPT.__init__", "randn"): (
        _SEEDED + "; copied into the parameters with copy_, which crosses devices"
    ),
    ("labs/07_context/_workers_context.py", "make_inputs", "randn"): _SEEDED,
    ("labs/07_context/ring_attention.py", "shard_positions", "arange"): (
        "CPU-side position bookkeeping: _box reads it with int()/bool() (no device sync), "
        "the mask is moved with .to(scores.device) and shard() with .to(x.device)"
    ),
    ("labs/08_expert/_workers_expert.py", "global_batch", "randn"): _SEEDED,
    ("labs/08_expert/_workers_expert.py", "check_moe", "randn"): _SEEDED,
    ("labs/08_expert/_workers_expert.py", "check_all_to_all_rows", "arange"): _CPU_TEST,
    ("labs/08_expert/_workers_expert.py", "check_all_to_all_rows", "tensor"): _CPU_TEST,
    ("labs/08_expert/_workers_expert.py", "check_all_to_all_rows", "full"): _CPU_TEST,
    ("labs/08_expert/_workers_expert.py", "check_all_to_all_rows", "zeros"): _CPU_TEST,
    ("labs/08_expert/_workers_expert.py", "fold_experiment", "tensor"): _CPU_TEST,
    ("labs/08_expert/moe.py", "init_params.rand", "randn"): _SEEDED,
}


def audited_files() -> list[Path]:
    labs = [
        p
        for p in sorted(ROOT.glob("labs/*/*.py"))
        if not p.name.startswith(("test_", "benchmark_")) and p.name != "conftest.py"
    ]
    return labs + sorted(ROOT.glob("pkg/shardlab/train/*.py"))


def allocations(path: Path):
    """``(line, enclosing function, torch function, has device=)`` for each allocator call."""
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = [*scope, child.name]
            f = getattr(child, "func", None) if isinstance(child, ast.Call) else None
            if (
                isinstance(f, ast.Attribute)
                and f.attr in ALLOCATORS
                and isinstance(f.value, ast.Name)
                and f.value.id == "torch"
            ):
                has_device = any(k.arg == "device" for k in child.keywords)
                found.append((child.lineno, ".".join(scope) or "<module>", f.attr, has_device))
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), [])
    return found


def test_the_audit_sees_the_modules():
    names = {p.relative_to(ROOT).as_posix() for p in audited_files()}
    for must in (
        "labs/04_fsdp/fsdp_units.py",
        "labs/05_pipeline/pipeline.py",
        "labs/08_expert/_workers_expert.py",
        "labs/09_combined/layout_fsdp_tp.py",
    ):
        assert must in names
    assert not any("/test_" in n or "/hidden/" in n for n in names)


def test_the_scanner_flags_a_deviceless_allocation(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import torch\n"
        "def f(x):\n"
        "    a = torch.zeros(3, dtype=x.dtype)\n"
        "    b = torch.empty(2, device=x.device)\n"
        "    return x.new_zeros(4), torch.zeros_like(x)\n"
    )
    assert allocations(src) == [(3, "f", "zeros", False), (4, "f", "empty", True)]


def test_every_allocation_follows_a_device():
    bad, used = [], set()
    for path in audited_files():
        rel = path.relative_to(ROOT).as_posix()
        for line, func, name, has_device in allocations(path):
            key = (rel, func, name)
            if key in ALLOWED:
                used.add(key)
            elif not has_device:
                bad.append(f"{rel}:{line} torch.{name}(...) in {func} has no device=")
    assert not bad, (
        "allocations that would land on the CPU in a CUDA run (pass device=x.device, or use "
        "x.new_empty / torch.empty_like; or add them to ALLOWED with the reason):\n"
        + "\n".join(bad)
    )
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match no call any more (remove them): {stale}"


# --- runtime: the collective-free pieces run on the meta device --------------------------


@pytest.fixture
def lab_paths(monkeypatch):
    before = set(sys.modules)
    for lab in ("05_pipeline", "06_tensor", "07_context", "08_expert"):
        monkeypatch.syspath_prepend(str(ROOT / "labs" / lab))
    yield
    for name in set(sys.modules) - before:  # lab modules this test imported: forget them
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(ROOT / "labs")):
            del sys.modules[name]


def _all_meta(*tensors):
    return all(t.device.type == "meta" for t in tensors)


def test_serial_tp_model_follows_meta(lab_paths):
    from tensor_reference import ModelConfig, SerialGPT

    c = ModelConfig()
    model = SerialGPT(c).to("meta")
    idx = torch.zeros(2, c.seq, dtype=torch.long, device="meta")  # (b, s)
    logits = model(idx)  # dropout masks are drawn on the CPU and moved to meta
    assert logits.device.type == "meta" and logits.shape == (2, c.seq, c.vocab)
    logits.float().sum().backward()
    assert _all_meta(*(p.grad for p in model.parameters()))


def test_attention_blocks_follow_meta(lab_paths):
    from attention_blocks import block_attention, block_grads

    q, k, v, dout = (torch.randn(1, 2, 8, 4, device="meta") for _ in range(4))  # (b, h, s, d)
    pos = torch.arange(8)  # CPU positions, as ring_attention passes them
    r0, out, lse = block_attention(q, k, v, pos, pos, True, 0.5)
    assert _all_meta(out, lse)
    delta = (out * dout).sum(-1)  # (b, h, s)
    grads = block_grads(q, k, v, dout, lse, delta, pos, pos, True, 0.5)
    assert _all_meta(*(g for g in grads if isinstance(g, torch.Tensor)))


def test_pipeline_stage_follows_meta(lab_paths):
    from pipeline import split_stages
    from shardlab.models import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=16, d_ff=32)
    first, last = (s.to("meta") for s in split_stages(GPT(cfg), 2))
    x = torch.zeros(2, 8, dtype=torch.long, device="meta")  # (b, s) token ids
    logits = last(first(x))  # (b, s, V)
    assert logits.device.type == "meta"
    logits.sum().backward()
    assert _all_meta(*(p.grad for s in (first, last) for p in s.parameters() if p.requires_grad))


def test_moe_local_pieces_follow_meta(lab_paths):
    import moe

    cfg = moe.MoEConfig(hidden=8, ffn=16, num_experts=4, top_k=2, capacity_factor=1.25, ep=1)
    params = {k: v.to("meta").requires_grad_() for k, v in moe.init_params(cfg).items()}
    x = torch.randn(6, 8, device="meta", requires_grad=True)  # (T, h)
    probs, chosen, gates = moe.route(x, params["router"], cfg.top_k)
    y = moe._expert_mlp(x, params["w1"][0], params["w2"][0])  # (T, h)
    assert _all_meta(probs, chosen, gates, y)
    (y.sum() + gates.sum()).backward()
    assert _all_meta(x.grad, params["router"].grad, params["w1"].grad)
