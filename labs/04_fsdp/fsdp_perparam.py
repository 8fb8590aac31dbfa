"""Per-parameter FSDP (the FSDP2 design): every parameter stays on its module as a dim-0 shard.

What is sharded. The model is cut into units by a :class:`WrapPolicy` (every ``Block``, or
every ``Linear`` and ``Embedding``; the root unit takes every parameter left). Each parameter
``p`` of shape ``(d0, *rest)`` is zero-padded to ``D * c`` rows, ``c = ceil(d0 / D)``, and
rank ``r`` keeps rows ``[r c, (r+1) c)`` as an fp32 ``nn.Parameter`` of shape ``(c, *rest)``
registered on ``p``'s module under ``p``'s own name (tied names share one shard), so
``model.parameters()`` is what an optimizer or gradient clipping needs; after a step its
``.grad`` is a ``(c, *rest)`` fp32 tensor. Per rank that is ``accounting.memory.model_state(
N_pad, D, "zero3", "fp32")`` with ``N_pad = memory.fsdp_padded_numel(shapes, D, "per_param")``
(padding rows are zeros: their gradients and Adam updates stay zero). Modules the
:class:`MixedPrecision` policy names (e.g. ``nn.LayerNorm``) keep full fp32 parameters on
every rank (replicated, computed in fp32). Storage and collectives: ``fsdp_perparam_units``.

Which collectives run, when (``D`` ranks, ``q`` bytes per element sent). Per unit and pass,
exactly one of each, on all of the unit's shards packed rank-major (``S`` elements per rank):

1. forward pre-hook: ``all_gather_into_tensor`` of the packed shards, copied out into each
   parameter's padded ``(D c, *rest)`` buffer (prefetch: the next unit's gather is issued
   first); with ``reshard_after_forward`` the buffers are freed after forward and
   gathered again before the unit's backward (:class:`fsdp.AllGatherBeforeBackward`);
2. backward: when autograd finishes a gradient (post-accumulate hook) the unit keeps it and
   frees that parameter's gathered buffer (the gradient takes its place); the unit's last
   gradient finishes the previous unit's reduce-scatter (which overlapped this backward),
   packs the gradients rank-major, dropping each as soon as it is packed, and issues one
   async ``reduce_scatter_tensor`` (SUM; divided by D into ``.grad`` by
   :meth:`PerParamFSDP.finish_gradient_synchronization`). So a unit's parameters and
   gradients never both exist in full, nor its gradients and their packed copy;
3. replicated parameters: one ``all_reduce`` of their packed gradients per step.

Bytes per step: ``comm.step_volume("zero3", N_pad, D, q)`` (``3 q N_pad (D-1)/D``, 2 without
resharding) plus ``comm.step_volume("ddp", N_rep, D, 4)`` for ``N_rep`` replicated elements.
With one all-gather per unit the collective count equals the flat units'; the difference is
padding (per parameter instead of per unit) and the copy-out/copy-in around each collective.

Mixed precision: fp32 master shards always; ``param_dtype`` is the dtype gathered and
computed in (shards are cast before the all-gather); gradients are reduce-scattered in
``reduce_dtype`` and averaged into fp32 ``.grad``. Total-norm clipping
(:meth:`PerParamFSDP.clip_grad_norm_`) all-reduces the squared local norms.

In production: ``torch.distributed.fsdp.fully_shard`` (parameters become DTensors with
``Shard(0)`` placements; ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``; one
``fully_shard`` call per unit is the wrapping policy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
import torch.distributed as dist
from fsdp import AllGatherBeforeBackward
from fsdp_perparam_units import ShardedUnit, Slot
from shardlab.models import Block
from torch import nn

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _module_classes(name: str, value) -> tuple[type, ...]:
    if not isinstance(value, tuple) or not all(
        isinstance(c, type) and issubclass(c, nn.Module) for c in value
    ):
        raise ValueError(f"{name}={value!r} must be a tuple of nn.Module subclasses")
    return value


@dataclass(frozen=True)
class WrapPolicy:
    """Which modules become units: every (non-root) module that is an instance of ``classes``."""

    classes: tuple[type, ...] = (Block,)

    def __post_init__(self) -> None:
        if not _module_classes("classes", self.classes):
            raise ValueError("classes=() wraps nothing: use at least one module class")

    def __call__(self, name: str, module: nn.Module) -> bool:
        return bool(name) and isinstance(module, self.classes)


@dataclass(frozen=True)
class MixedPrecision:
    """Per-module precision: ``param_dtype`` is what shards are cast to before the all-gather
    (gathered and computed in), ``reduce_dtype`` what gradients are reduce-scattered (and
    all-reduced) in; master weights, their ``.grad`` and the Adam moments stay fp32 shards.
    Modules of a class in ``fp32_replicated`` (e.g. ``nn.LayerNorm``) are not sharded: their
    parameters stay fp32 on every rank and they compute in fp32."""

    param_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    fp32_replicated: tuple[type, ...] = ()

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {_DTYPES}")
        _module_classes("fp32_replicated", self.fp32_replicated)


@dataclass(frozen=True)
class PerParamConfig:
    """Schedule and policies of :class:`PerParamFSDP`."""

    reshard_after_forward: bool = True
    prefetch: bool = True
    wrap: WrapPolicy = field(default_factory=WrapPolicy)
    mp: MixedPrecision = field(default_factory=MixedPrecision)

    def __post_init__(self) -> None:
        for name in ("reshard_after_forward", "prefetch"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if not isinstance(self.wrap, WrapPolicy) or not isinstance(self.mp, MixedPrecision):
            raise ValueError(f"wrap={self.wrap!r} / mp={self.mp!r}: use WrapPolicy, MixedPrecision")


def _cast(x, dtype: torch.dtype):
    if torch.is_tensor(x) and x.is_floating_point():
        return x.to(dtype)
    if isinstance(x, (tuple, list)):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def add_cast_hooks(module: nn.Module, mp: MixedPrecision) -> None:
    """Run the ``fp32_replicated`` modules in fp32 (inputs cast up, outputs back down)."""
    if mp.param_dtype == torch.float32:
        return
    for m in module.modules():
        if isinstance(m, mp.fp32_replicated):
            m.register_forward_pre_hook(lambda _m, args: _cast(args, torch.float32))
            m.register_forward_hook(lambda _m, _a, out: _cast(out, mp.param_dtype))


def build_units(module: nn.Module, group, cfg: PerParamConfig):
    """Root unit first, then the policy's matches; parameters of ``fp32_replicated`` modules
    are returned apart as ``[(param, names)]`` (they stay unsharded)."""
    names = [""] + [n for n, m in module.named_modules() if cfg.wrap(n, m)]
    owner: dict[int, tuple[int, str]] = {}  # id(param) -> (unit index or -1, first name)
    params: list[dict] = [{} for _ in names]
    replicated: dict = {}
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        k = max(i for i, n in enumerate(names) if n == "" or f"{mod_name}.".startswith(f"{n}."))
        k = -1 if isinstance(mod, cfg.mp.fp32_replicated) else k
        for attr, p in mod.named_parameters(recurse=False, remove_duplicate=False):
            fqn = f"{mod_name}.{attr}" if mod_name else attr
            j, first = owner.setdefault(id(p), (k, fqn))
            if j != k:
                raise ValueError(
                    f"parameter {fqn!r} is the same tensor as {first!r} but they fall in "
                    "different units (or one is replicated); tied parameters must live in "
                    "one unit: change the wrap policy"
                )
            target = replicated if k < 0 else params[k]
            target.setdefault(id(p), (p, []))[1].append((mod, attr, fqn))
    dt = (cfg.mp.param_dtype, cfg.mp.reduce_dtype)
    units = [
        ShardedUnit(n or "root", module.get_submodule(n), list(pl.values()), group, *dt)
        for i, (n, pl) in enumerate(zip(names, params))
        if pl or i == 0  # the root is unit 0 even when it shards nothing
    ]
    return units, list(replicated.values())


class PerParamFSDP(nn.Module):
    """Per-parameter fully sharded data parallel; ``.module`` is the wrapped model, whose
    ``parameters()`` are the local shards (and the replicated fp32 parameters)."""

    def __init__(self, module: nn.Module, group, config: PerParamConfig | None = None) -> None:
        super().__init__()
        self.config = config or PerParamConfig()
        self.group, self.world = group, group.size()
        self.module = module
        self.units, self.replicated = build_units(module, group, self.config)
        for p, _ in self.replicated:  # every rank starts from rank 0's values
            dist.broadcast(p.data, group=group, group_src=0)
        add_cast_hooks(module, self.config.mp)
        self._in_flight: list[ShardedUnit] = []  # at most one reduce-scatter in flight
        self._end_queued = False
        for i, u in enumerate(self.units[1:], start=1):
            u.module.register_forward_pre_hook(partial(self._pre_forward, i))
            u.module.register_forward_hook(partial(self._post_forward, i))

    @property
    def padded_numel(self) -> int:
        """N_pad: elements of every sharded parameter padded on dim 0, over all ranks."""
        return sum(u.packed for u in self.units) * self.world

    @property
    def replicated_numel(self) -> int:
        return sum(p.numel() for p, _ in self.replicated)

    def forward(self, *args, **kwargs):
        self._pre_forward(0)
        return self._post_forward(0, self.module, args, self.module(*args, **kwargs))

    def _pre_forward(self, i: int, *_) -> None:
        # BEGIN SOLUTION hint: wait for unit i's gather and register fresh leaves (hook: partial(self._on_grad, i)); with prefetch start unit i+1's gather
        self.units[i].wait_gather()
        self.units[i].make_views(partial(self._on_grad, i))
        if self.config.prefetch and i + 1 < len(self.units):
            self.units[i + 1].start_gather()
        # END SOLUTION

    def _post_forward(self, i: int, module, inputs, output):
        if self.config.reshard_after_forward:
            self.units[i].free()
        if not torch.is_grad_enabled():
            return output
        outs = output if isinstance(output, (tuple, list)) else (output,)
        idx = [k for k, o in enumerate(outs) if torch.is_tensor(o) and o.requires_grad]
        if not idx:
            return output
        wrapped = AllGatherBeforeBackward.apply(self, i, *(outs[k] for k in idx))
        new = list(outs)
        for k, w in zip(idx, wrapped):
            new[k] = w
        return type(output)(new) if isinstance(output, (tuple, list)) else new[0]

    def _pre_backward(self, i: int) -> None:
        if not self._end_queued:  # once per backward: clean up when autograd finishes
            self._end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        self.units[i].wait_gather()
        order = [0, *range(len(self.units) - 1, 0, -1)]  # the root's head runs backward first
        pos = order.index(i)
        if self.config.prefetch and pos + 1 < len(order):
            self.units[order[pos + 1]].start_gather()

    def _on_grad(self, i: int, s: Slot, leaf: torch.Tensor) -> None:
        # BEGIN SOLUTION hint: move leaf.grad into unit i (keep_grad; leaf.grad = None); when the unit is complete, self._reduce it
        grad, leaf.grad = leaf.grad, None
        if self.units[i].keep_grad(s, grad):
            self._reduce(self.units[i])
        # END SOLUTION

    def _reduce(self, unit: ShardedUnit) -> None:
        # the previous unit's reduce-scatter ran during this unit's whole backward; finishing
        # it before packing keeps one reduce-scatter input alive at a time
        for u in self._in_flight:
            u.drain()
        unit.reduce()
        self._in_flight = [unit]

    def _end_of_backward(self) -> None:
        self._end_queued = False
        for u in self.units:
            if u._grads:  # some parameter got no gradient: its slice stays zero
                self._reduce(u)
            u.free()

    def finish_gradient_synchronization(self) -> None:
        """Wait for the reduce-scatters and all-reduce the replicated gradients (mean)."""
        self._in_flight = []
        for u in self.units:
            u.drain()
            u.free()
        # BEGIN SOLUTION hint: pack the replicated params' grads (zeros if None) in reduce_dtype, one all_reduce (SUM), divide by D, copy back as fp32 .grad
        ps = [p for p, _ in self.replicated if p.requires_grad]
        if not ps:
            return
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps]
        ).to(self.config.mp.reduce_dtype)  # (N_rep,)
        dist.all_reduce(flat, group=self.group)
        flat = flat.div_(self.world).float()
        for p, g in zip(ps, flat.split([p.numel() for p in ps])):
            p.grad = g.view_as(p).clone()
        # END SOLUTION

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale every gradient of ``self.parameters()`` so the *global* norm is <= max_norm.

        A shard's gradient is a piece of the full one (padding rows are 0), so the squared
        norm of the full gradient is the all-reduced sum of the ranks' squared local norms;
        replicated gradients are equal on every rank and are added once.
        """
        sharded = {id(s.shard) for u in self.units for s in u.slots}
        grads = [(p.grad, id(p) in sharded) for p in self.parameters() if p.grad is not None]
        # BEGIN SOLUTION hint: local sum of squares of the sharded grads, all_reduce (SUM), add the replicated grads' squares, sqrt; coef = min(1, max_norm / (total + 1e-6)), multiply every grad
        sq = torch.zeros((), dtype=torch.float32, device=next(self.parameters()).device)
        for g, is_shard in grads:
            if is_shard:
                sq += g.float().pow(2).sum()
        dist.all_reduce(sq, group=self.group)  # sum over ranks of the squared local norms
        for g, is_shard in grads:
            if not is_shard:
                sq += g.float().pow(2).sum()
        total = sq.sqrt()
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g, _ in grads:
            g.mul_(coef)
        # END SOLUTION
        return total

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter unsharded in fp32, ``{name: tensor}`` (tied names all present)."""
        out: dict[str, torch.Tensor] = {}
        for u in self.units:
            if u.slots:
                out.update(u.full_params())
        for p, aliases in self.replicated:
            for _, _, name in aliases:
                out[name] = p.detach().float().clone()
        return out
