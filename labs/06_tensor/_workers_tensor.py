"""Functions every rank runs for the tensor-parallel tests, notebook and benchmark.

The reference is :class:`tensor_reference.SerialGPT`, run whole in each process (it is
small); the tensor-parallel model is built from it, so both start from the same weights
and draw the same dropout masks. Comparisons gather the parallel results back to full
tensors (tests only: the model itself never gathers the logits).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from shardlab.accounting import activations, comm
from shardlab.runtime import CommTrace, MemoryTrace
from tensor import TPGroups
from tensor_block import (
    ParallelBlock,
    ParallelGPT,
    TPConfig,
    activation_kwargs,
    sync_sequence_parallel_grads,
)
from tensor_reference import ModelConfig, SerialBlock, SerialGPT, make_batch

MODEL = ModelConfig()  # vocab 64, seq 16, h 32, a 4, ffn 96, 2 layers, dropout 0.1 / 0.1
BATCH = 2
Q = 4  # fp32 activations and communication
SEED = 3  # the step seed of the dropout masks
# (sequence_parallel, recompute, regather) runs compared with one process
RUNS = [
    (False, "none", True), (False, "selective", True), (False, "full", True),
    (True, "none", True), (True, "selective", True), (True, "full", True),
    (True, "none", False),
]
# the 4-rank public launch: with and without SP, each recompute mode once, both SP linears
RUNS_SMALL = [(False, "none", True), (False, "full", True), (True, "selective", True),
              (True, "none", False)]
# activation modes: name -> (t or None for the group's t, sequence_parallel, recompute)
MODES = {
    "none": (1, False, "none"),
    "tp": (None, False, "none"),
    "tp_sp": (None, True, "none"),
    "tp_sp_selective": (None, True, "selective"),
    "full_recompute": (None, False, "full"),
}


def _gather(x: torch.Tensor, dim: int, groups: TPGroups) -> torch.Tensor:
    if groups.tp == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(groups.tp)]
    dist.all_gather(parts, x.contiguous(), group=groups.tp_group)
    return torch.cat(parts, dim)


def full_grads(pm: ParallelGPT, groups: TPGroups) -> dict[str, torch.Tensor]:
    """The parallel model's gradients as full tensors, under SerialGPT's parameter names."""
    t, out = groups.tp, {}
    out["tok.weight"] = _gather(pm.tok.weight.grad, 0, groups)
    out["pos"] = pm.pos.grad
    out["head.weight"] = _gather(pm.head.weight.grad, 0, groups)
    for name in ("weight", "bias"):
        out[f"ln_f.{name}"] = getattr(pm.ln_f, name).grad
    for i, blk in enumerate(pm.blocks):
        pre = f"blocks.{i}."
        for ln in ("ln1", "ln2"):
            for name in ("weight", "bias"):
                out[pre + f"{ln}.{name}"] = getattr(getattr(blk, ln), name).grad
        for name in ("weight", "bias"):  # rank-major [q_r k_r v_r] rows back to q, k, v
            full = _gather(getattr(blk.attn.qkv, name).grad, 0, groups)
            per_rank = [c.chunk(3) for c in full.chunk(t)]
            for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                out[pre + f"{proj}.{name}"] = torch.cat([r[j] for r in per_rank])
        out[pre + "o_proj.weight"] = _gather(blk.attn.o.weight.grad, 1, groups)
        out[pre + "o_proj.bias"] = blk.attn.o.bias.grad
        out[pre + "fc.weight"] = _gather(blk.mlp.fc.weight.grad, 0, groups)
        out[pre + "fc.bias"] = _gather(blk.mlp.fc.bias.grad, 0, groups)
        out[pre + "proj.weight"] = _gather(blk.mlp.proj.weight.grad, 1, groups)
        out[pre + "proj.bias"] = blk.mlp.proj.bias.grad
    return out


def serial_run(model: ModelConfig = MODEL, seed: int = SEED):
    """One process: logits, loss and every gradient."""
    sm = SerialGPT(model)
    idx, tgt = make_batch(model, BATCH)
    logits = sm(idx, seed)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
    loss.backward()
    return logits.detach(), loss.detach(), {n: p.grad for n, p in sm.named_parameters()}


def parallel_run(cfg: TPConfig, groups: TPGroups, seed: int = SEED):
    """The tensor-parallel model: gathered logits, loss and full gradients."""
    pm = ParallelGPT(SerialGPT(cfg.model), groups, cfg)
    idx, tgt = make_batch(cfg.model, BATCH)
    logits = pm.logits(idx, seed)
    loss = pm(idx, tgt, seed)
    loss.backward()
    sync_sequence_parallel_grads(pm, groups)
    return _gather(logits.detach(), 2, groups), loss.detach(), full_grads(pm, groups)


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def equality_rows(model: ModelConfig = MODEL, runs=RUNS) -> list[dict]:
    """Max |parallel - one process| of logits, loss and gradients for each run."""
    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    s_logits, s_loss, s_grads = serial_run(model)
    rows = []
    for sp, rc, rg in runs:
        cfg = TPConfig(model, t, sp, rc, rg)
        logits, loss, grads = parallel_run(cfg, groups)
        assert set(grads) == set(s_grads), set(grads) ^ set(s_grads)
        worst = max(s_grads, key=lambda n: _maxdiff(grads[n], s_grads[n]))
        rows.append({
            "t": t, "sp": sp, "recompute": rc, "regather": rg,
            "logits": _maxdiff(logits, s_logits), "loss": abs(loss.item() - s_loss.item()),
            "grads": _maxdiff(grads[worst], s_grads[worst]), "worst_grad": worst,
            "grad_scale": max(g.abs().max().item() for g in s_grads.values()),
            # what the grader compares with the reference solution's, outside the sandbox
            "values": {"logits": logits.detach(), "loss": loss.detach(), "grads": dict(grads)},
        })
    return rows


def _block_inputs(cfg: TPConfig, groups: TPGroups, seed: int = 5):
    """A (b, s, h) block input and output weight, sliced to this rank's positions under SP."""
    m = cfg.model
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, m.seq, m.h, generator=gen)
    w = torch.randn(BATCH, m.seq, m.h, generator=gen)
    if cfg.sequence_parallel:
        x, w = (z.chunk(groups.tp, dim=1)[groups.tp_rank].contiguous() for z in (x, w))
    return x.requires_grad_(), w


def comm_rows(model: ModelConfig = MODEL) -> list[dict]:
    """Bytes sent by one layer's forward + backward (one microbatch) vs ``comm.tp_volume``."""
    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    serial = SerialGPT(model).blocks[0]
    rows = []
    for name, sp, rg in (("tp", False, True), ("tp_sp", True, True), ("tp_sp", True, False)):
        cfg = TPConfig(model, t, sp, "none", rg)
        blk = ParallelBlock(serial, groups, cfg)
        x, w = _block_inputs(cfg, groups)
        with CommTrace() as tr:
            with tr.phase("forward"):
                out = blk(x, SEED)
            with tr.phase("backward"):
                (out * w).sum().backward()
        pred = comm.tp_volume(BATCH, model.seq, model.h, t, Q, sp=sp)
        regather = 2 * comm.ring_sent_bytes("all_gather", Q * BATCH * model.seq * model.h, t)
        extra = regather if (sp and rg) else 0.0
        sent = tr.sent_bytes()
        rows.append({
            "mode": name, "t": t, "regather": rg if sp else None,
            "all_reduce": tr.count(op="all_reduce"), "all_gather": tr.count(op="all_gather"),
            "reduce_scatter": tr.count(op="reduce_scatter"),
            "forward_bytes": tr.sent_bytes(phase="forward"),
            "backward_bytes": tr.sent_bytes(phase="backward"),
            "measured_bytes": sent, "tp_volume": pred, "regather_bytes": extra,
            "ratio": (sent - extra) / pred,
        })
    return rows


def saved_per_layer(cfg: TPConfig, groups: TPGroups) -> list[int]:
    """Bytes newly saved for backward during each layer's forward (MemoryTrace 'activations')."""
    serials = [SerialBlock(cfg.model, i) for i in range(cfg.model.layers)]
    blocks = [ParallelBlock(s, groups, cfg) for s in serials]
    x, w = _block_inputs(cfg, groups)
    per_layer = []
    with MemoryTrace() as mt:
        mt.watch(torch.nn.ModuleList(blocks))  # weights saved by F.linear stay "parameters"
        y = x
        for blk in blocks:
            before = mt.live_bytes("activations")
            y = blk(y, SEED)
            per_layer.append(mt.live_bytes("activations") - before)
        (y * w).sum().backward()
    return per_layer


def activation_rows(model: ModelConfig = MODEL) -> list[dict]:
    """Saved-activation bytes per layer for the five modes vs ``activation_bytes_per_layer``."""
    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    rows = []
    for mode, (tm, sp, rc) in MODES.items():
        tt = tm or t
        g = TPGroups() if tt == 1 else groups
        per_layer = saved_per_layer(TPConfig(model, tt, sp, rc), g)
        pred = activations.activation_bytes_per_layer(
            model.seq, BATCH, model.h, model.a, tt, mode, **activation_kwargs(model, Q)
        )
        ratios = [m / pred for m in per_layer]
        rows.append({
            "mode": mode, "t": tt, "measured_per_layer": per_layer, "predicted": pred,
            "ratios": ratios, "worst_ratio": max(ratios, key=lambda r: abs(r - 1)),
        })
    return rows


def check_all(model: ModelConfig = MODEL, runs: str = "all") -> dict | None:
    """One launch: equality with one process (``RUNS`` or ``RUNS_SMALL``), bytes sent,
    saved activations (rank 0 returns the report)."""
    chosen = RUNS if runs == "all" else RUNS_SMALL
    rep = {"t": dist.get_world_size(), "equality": equality_rows(model, chosen)}
    rep["comm"] = comm_rows(model)
    rep["activations"] = activation_rows(model)
    return rep if dist.get_rank() == 0 else None


# ----------------------------------------------------------------- PyTorch's DTensor TP
def dtensor_stack(model: ModelConfig, sp: bool):
    """SerialGPT's blocks sharded by ``parallelize_module`` on a 1-D CPU mesh of all ranks:
    ColwiseParallel q/k/v/fc, RowwiseParallel o/proj, and with ``sp`` SequenceParallel norms
    (the column layers all-gather a Shard(1) input, the row layers reduce-scatter to Shard(1))."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    inp = dict(input_layouts=Shard(1)) if sp else {}
    out = dict(output_layouts=Shard(1)) if sp else {}
    plan = {
        **{p: ColwiseParallel(**inp) for p in ("q_proj", "k_proj", "v_proj", "fc")},
        **{p: RowwiseParallel(**out) for p in ("o_proj", "proj")},
        **({"ln1": SequenceParallel(), "ln2": SequenceParallel()} if sp else {}),
    }
    blocks = SerialGPT(model).blocks
    for blk in blocks:
        parallelize_module(blk, mesh, plan)
    return blocks


def our_stack(model: ModelConfig, sp: bool, groups: TPGroups, recompute: str = "none"):
    cfg = TPConfig(model, groups.tp, sp, recompute)
    return torch.nn.ModuleList(ParallelBlock(b, groups, cfg) for b in SerialGPT(model).blocks)


def _run_stack(blocks, x, w, seed=SEED):
    y = x
    for blk in blocks:
        y = blk(y, seed)
    (y * w).sum().backward()
    return y


def dtensor_rows(model: ModelConfig = MODEL) -> list[dict]:
    """Ours vs DTensor on the same blocks, input and dropout masks: max |difference| of the
    output, the input gradient and the (gathered) weight gradients of q_proj and fc."""
    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    rows = []
    for sp in (False, True):
        cfg = TPConfig(model, t, sp)
        x, w = _block_inputs(cfg, groups)
        xd = x.detach().clone().requires_grad_()
        ours, theirs = our_stack(model, sp, groups), dtensor_stack(model, sp)
        y1, y2 = _run_stack(ours, x, w), _run_stack(theirs, xd, w)
        g_ours = full_grads_blocks(ours, groups)
        g_theirs = {
            n: p.grad.full_tensor()
            for n, p in theirs.named_parameters()
            if "proj" in n or "fc" in n
        }
        rows.append({
            "sp": sp, "output": _maxdiff(y1, y2), "input_grad": _maxdiff(x.grad, xd.grad),
            "weight_grads": max(_maxdiff(g_ours[n], g_theirs[n]) for n in g_theirs),
            "n_weight_grads": len(g_theirs),
        })
    return rows


def full_grads_blocks(blocks, groups: TPGroups) -> dict[str, torch.Tensor]:
    """Gathered q/k/v/o/fc/proj gradients of our blocks, under SerialBlock's names."""
    t, out = groups.tp, {}
    for i, blk in enumerate(blocks):
        for name in ("weight", "bias"):
            full = _gather(getattr(blk.attn.qkv, name).grad, 0, groups)
            per_rank = [c.chunk(3) for c in full.chunk(t)]
            for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                out[f"{i}.{proj}.{name}"] = torch.cat([r[j] for r in per_rank])
        out[f"{i}.o_proj.weight"] = _gather(blk.attn.o.weight.grad, 1, groups)
        out[f"{i}.fc.weight"] = _gather(blk.mlp.fc.weight.grad, 0, groups)
        out[f"{i}.fc.bias"] = _gather(blk.mlp.fc.bias.grad, 0, groups)
        out[f"{i}.proj.weight"] = _gather(blk.mlp.proj.weight.grad, 1, groups)
        for name in ("o_proj.bias", "proj.bias"):  # replicated: summed over shards under SP
            mod = blk.attn.o if name.startswith("o") else blk.mlp.proj
            out[f"{i}.{name}"] = all_reduce_if_sp(mod.bias, groups)
    return out


def all_reduce_if_sp(p, groups):
    from tensor import all_reduce

    return all_reduce(p.grad, groups) if getattr(p, "sequence_parallel", False) else p.grad


def loss_comm(model: ModelConfig = MODEL) -> dict:
    """Collectives of the vocabulary-parallel loss alone (forward and backward) and its
    difference from ``F.cross_entropy`` on the full logits."""
    from tensor import vocab_parallel_cross_entropy

    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    gen = torch.Generator().manual_seed(21)
    full = torch.randn(BATCH, model.seq, model.vocab, generator=gen) * 3
    tgt = torch.randint(0, model.vocab, (BATCH, model.seq), generator=gen)
    local = full.chunk(t, dim=-1)[groups.tp_rank].clone().requires_grad_()
    with CommTrace() as tr:
        loss = vocab_parallel_cross_entropy(local, tgt, groups)
        loss.backward()
    ref = full.clone().requires_grad_()
    ref_loss = torch.nn.functional.cross_entropy(ref.flatten(0, 1), tgt.flatten())
    ref_loss.backward()
    return {
        "ops": [(r.op, r.numel) for r in tr.records],
        "loss": abs(loss.item() - ref_loss.item()),
        "grad": _maxdiff(local.grad, ref.grad.chunk(t, dim=-1)[groups.tp_rank]),
    }


def train_rows(model: ModelConfig = MODEL, steps: int = 3, lr: float = 0.5) -> list[dict]:
    """``steps`` SGD steps (a new dropout seed each step) of the parallel model vs one
    process: max |difference| of the gathered weights afterwards."""
    t = dist.get_world_size()
    groups = TPGroups.from_world(t)
    serial = SerialGPT(model)
    opt = torch.optim.SGD(serial.parameters(), lr=lr)
    idx, tgt = make_batch(model, BATCH)
    for step in range(steps):
        opt.zero_grad()
        logits = serial(idx, step)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten()).backward()
        opt.step()
    rows = []
    for sp, rc in ((False, "full"), (True, "selective")):
        pm = ParallelGPT(SerialGPT(model), groups, TPConfig(model, t, sp, rc))
        popt = torch.optim.SGD(pm.parameters(), lr=lr)
        for step in range(steps):
            popt.zero_grad()
            pm(idx, tgt, step).backward()
            sync_sequence_parallel_grads(pm, groups)
            popt.step()
        # the weights, gathered like the gradients: put them in .grad and reuse full_grads
        for p in pm.parameters():
            p.grad = p.detach().clone()
        got = full_grads(pm, groups)
        want = dict(serial.named_parameters())
        rows.append({"sp": sp, "recompute": rc,
                     "max_abs": max(_maxdiff(got[n], want[n].detach()) for n in want)})
    return rows


def extra_checks() -> dict | None:
    """Hidden-test launch: DTensor, the loss's collectives, training steps, another model
    (no dropout, other sizes) for equality, bytes and saved activations."""
    other = ModelConfig(vocab=48, seq=8, h=24, a=2, ffn=40, layers=1, dropout=0.0,
                        attn_dropout=0.0)
    rep = {
        "dtensor": dtensor_rows(),
        "loss_comm": loss_comm(),
        "train": train_rows(),
        "other_equality": equality_rows(other, RUNS),
        "other_comm": comm_rows(other),
        "other_activations": activation_rows(other),
    }
    return rep if dist.get_rank() == 0 else None


def operator_rows(b: int = 2, s: int = 8, h: int = 3) -> dict:
    """Each communication operator alone, forward and backward, against what it must compute
    (every rank's input is rebuilt on every rank from a seed): max |difference| per operator."""
    import tensor as T

    t, r = dist.get_world_size(), dist.get_rank()
    groups = TPGroups.from_world(t)

    def inputs(shape, seed):
        gens = [torch.Generator().manual_seed(seed * 100 + k) for k in range(t)]
        return [torch.randn(shape, generator=g) for g in gens]

    full, shard = (b, s, h), (b, s // t, h)
    cases = {  # name: (operator, input shape, output-grad shape, forward, backward) per rank
        "f (identity / all-reduce)": (T.f, full, full, lambda xs: xs[r], lambda gs: sum(gs)),
        "g (all-reduce / identity)": (T.g, full, full, lambda xs: sum(xs), lambda gs: gs[r]),
        "all-gather / reduce-scatter": (
            T.gather_seq, shard, full, lambda xs: torch.cat(xs, 1),
            lambda gs: sum(gs).chunk(t, 1)[r],
        ),
        "reduce-scatter / all-gather": (
            T.scatter_seq, full, shard, lambda xs: sum(xs).chunk(t, 1)[r],
            lambda gs: torch.cat(gs, 1),
        ),
    }
    out = {}
    for k, (name, (op, in_shape, g_shape, fwd, bwd)) in enumerate(cases.items()):
        try:
            xs, gs = inputs(in_shape, 2 * k), inputs(g_shape, 2 * k + 1)
            x = xs[r].clone().requires_grad_()
            y = op(x, groups)
            (gx,) = torch.autograd.grad(y, x, gs[r])
            out[name] = {"forward": _maxdiff(y, fwd(xs)), "backward": _maxdiff(gx, bwd(gs))}
        except NotImplementedError as e:
            out[name] = {"error": f"NotImplementedError: {e}"}
    return out


def _section(fn, *args, **kwargs):
    """Run one part of the report; a missing student function shows up in its own section."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        return {"error": f"NotImplementedError: {e}"}


def lab_report(runs: str = "all") -> dict | None:
    """Everything the notebook shows from one launch, section by section (rank 0 returns)."""
    chosen = RUNS if runs == "all" else RUNS_SMALL
    rep = {
        "t": dist.get_world_size(),
        "operators": operator_rows(),
        "loss": _section(loss_comm),
        "equality": _section(equality_rows, MODEL, chosen),
        "comm": _section(comm_rows),
        "activations": _section(activation_rows),
    }
    if runs == "all":
        rep["dtensor"] = _section(dtensor_rows)
    return rep if dist.get_rank() == 0 else None
