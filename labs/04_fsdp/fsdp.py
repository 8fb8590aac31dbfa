"""ZeRO-3 / FSDP from scratch: every rank stores 1/D of the parameters, gradients and optimizer.

What is sharded. The wrapped model is cut into *units* (default: one per transformer block,
``module.blocks[i]``, plus a root unit for everything else: embeddings, final norm, head).
Each unit's parameters live as flat fp32 vectors padded to a multiple of D
(:class:`fsdp_units.FlatParam`); a rank keeps one ``padded/D`` slice of each, its gradient
and (in the optimizer, which only ever sees these slices) its Adam moments. Per rank that is
``accounting.memory.model_state(N_padded, D, "zero3", "fp32")`` bytes, where ``N_padded`` is
the sum of the padded unit sizes. Replicated: nothing but buffers (e.g. masks).

Which collectives run, when. Per step and unit, with ``q`` bytes per element sent:

1. forward pre-hook: ``all_gather_into_tensor`` of the unit (with ``prefetch`` the next
   unit's gather is issued before this unit computes, so it overlaps);
2. forward post-hook: with ``reshard_after_forward`` the gathered copy is freed and the
   unit's outputs pass through :class:`AllGatherBeforeBackward`;
3. its backward re-gathers the unit (prefetching the unit whose backward comes next);
4. when the unit's gradient is complete (``register_post_accumulate_grad_hook`` on the
   gathered leaf), ``reduce_scatter_tensor`` sums it so each rank gets its slice; the slice
   is divided by D into the fp32 ``shard.grad`` by :meth:`FSDP.finish_gradient_synchronization`.
   The gathered copy is freed first (the reduction reads only the gradient). With
   ``overlap_reduce_scatter`` (default) the reduce-scatter runs on while the next unit
   computes, one in flight, so its input (one unit's gradient) is alive during that unit's
   backward; ``False`` waits for it at once: no overlap, one unit-sized buffer less at the peak
   (measured at 25 M on 2 ranks: peak 253.8 MB against 241.2 MB; FSDP2 on CPU, whose
   reduce-scatter blocks, 241.6 MB; benchmark_fsdp.py).

Each all-gather and reduce-scatter of a unit sends ``q * padded * (D-1)/D`` bytes per rank,
so a step sends ``3 q N_padded (D-1)/D`` (``2 q N_padded (D-1)/D`` without resharding), as
``accounting.comm.step_volume("zero3", N_padded, D, q, reshard_after_forward)`` says;
accumulation over microbatches follows ``accounting.comm.grad_accum_volume``. The root unit
stays gathered for the whole forward and the whole backward; block units are gathered one
(two with prefetch) at a time, as in ``accounting.peak.predict_peak``.

Mixed precision (``compute_dtype`` bf16/fp16): shards are cast before the all-gather, so
gather and compute run in the low dtype; gradients are reduce-scattered in ``reduce_dtype``
(fp32 by default) and the optimizer updates fp32 master shards.

HSDP (``replicate_group`` given): the collectives above run inside the shard ``group`` (one
replica of ``D`` ranks, state ``model_state(N_padded, D, "zero3", ...)`` per rank), and
:meth:`FSDP.finish_gradient_synchronization` all-reduces every averaged gradient shard across
the ``R`` replicas once per step: ``2 q (N_padded / D) (R-1)/R`` more bytes per rank
(``accounting.hierarchical.hsdp_step_volume(N_padded, D, R, q, ...)``, by mesh axis).
PyTorch: FSDP2 ``fully_shard(module, mesh=<2-D DeviceMesh ("replicate", "shard")>)``, FSDP1
``ShardingStrategy.HYBRID_SHARD``; both all-reduce per unit right after its reduce-scatter.

In production: PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``) shards each parameter
as a DTensor, overlaps with separate CUDA streams and keeps the root gathered after forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from fsdp_units import FlatParam
from torch import nn

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def blocks_policy(name: str, module: nn.Module) -> bool:
    """Default unit policy: each element of a ``ModuleList`` attribute named ``blocks``."""
    parent, _, idx = name.rpartition(".")
    return idx.isdigit() and (parent == "blocks" or parent.endswith(".blocks"))


def no_units_policy(name: str, module: nn.Module) -> bool:
    """One unit for the whole model (ZeRO-3 with the largest possible gathered working set)."""
    return False


@dataclass(frozen=True)
class FSDPConfig:
    """How the wrapper shards and schedules (see the module docstring)."""

    reshard_after_forward: bool = True
    prefetch: bool = True
    overlap_reduce_scatter: bool = True  # one reduce-scatter in flight during the next backward
    compute_dtype: torch.dtype = torch.float32
    reduce_dtype: torch.dtype = torch.float32
    unit_policy: Callable[[str, nn.Module], bool] = blocks_policy

    def __post_init__(self) -> None:
        for name in ("reshard_after_forward", "prefetch", "overlap_reduce_scatter"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        for name in ("compute_dtype", "reduce_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {_DTYPES}")
        if not callable(self.unit_policy):
            raise ValueError(f"unit_policy={self.unit_policy!r} must be callable (name, module)")


@dataclass
class Unit:
    """One FSDP unit: a module and its flat parameters (trainable and/or frozen)."""

    name: str
    module: nn.Module
    flats: list[FlatParam]


def build_units(
    module: nn.Module, group: dist.ProcessGroup, cfg: FSDPConfig, replicate=None
) -> list[Unit]:
    """Cut ``module`` into units (root first, then policy matches in module order)."""
    names = [""] + [n for n, m in module.named_modules() if n and cfg.unit_policy(n, m)]
    owner_of: dict[int, tuple[int, str]] = {}  # id(param) -> (unit index, first name)
    params: list[dict[int, tuple[nn.Parameter, list]]] = [{} for _ in names]
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        # a module belongs to the deepest unit whose name is a prefix of its own
        k = max(i for i, n in enumerate(names) if n == "" or f"{mod_name}.".startswith(f"{n}."))
        for attr, p in mod.named_parameters(recurse=False, remove_duplicate=False):
            fqn = f"{mod_name}.{attr}" if mod_name else attr
            j, first = owner_of.setdefault(id(p), (k, fqn))
            if j != k:
                raise ValueError(
                    f"parameter {fqn!r} is the same tensor as {first!r} but they fall in "
                    f"different units ({names[k] or 'root'!r} and {names[j] or 'root'!r}); "
                    "tied parameters must live in one unit: change unit_policy"
                )
            params[k].setdefault(id(p), (p, []))[1].append((mod, attr, fqn))
    units = []
    for name, plist in zip(names, params):
        groups = [[x for x in plist.values() if x[0].requires_grad is rg] for rg in (True, False)]
        flats = [
            FlatParam(g, group, cfg.compute_dtype, cfg.reduce_dtype, replicate) for g in groups if g
        ]
        if flats:
            units.append(Unit(name or "root", module.get_submodule(name), flats))
    return units


class AllGatherBeforeBackward(torch.autograd.Function):
    """Forward: identity on a unit's outputs. Backward: all-gather the unit's parameters
    (freed after forward) before autograd enters the unit, and prefetch the next unit."""

    @staticmethod
    def forward(ctx, fsdp: FSDP, index: int, *outputs: torch.Tensor):
        ctx.fsdp, ctx.index = fsdp, index
        return tuple(o.view_as(o) for o in outputs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        ctx.fsdp._pre_backward(ctx.index)
        return (None, None, *grads)


class FSDP(nn.Module):
    """Fully sharded data parallel wrapper; ``.module`` is the wrapped model.

    ``group``: the ranks that shard the state. ``replicate_group`` (HSDP, optional): the ranks
    holding the same shard in the other replicas (one per replica, this rank's mesh column).
    """

    def __init__(
        self,
        module: nn.Module,
        group: dist.ProcessGroup,
        config: FSDPConfig | None = None,
        replicate_group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self.config = config or FSDPConfig()
        self.group, self.world = group, group.size()
        self.replicate_group = replicate_group
        self.module = module
        self.units = build_units(module, group, self.config, replicate_group)
        # the shards are this wrapper's only parameters (what the optimizer gets)
        self.shards = nn.ParameterDict(
            {f"{u.name.replace('.', '_')}_{i}": f.shard for u in self.units for i, f in
             enumerate(u.flats)}
        )
        self._sync = True
        self._end_queued = False
        self._in_flight: list[FlatParam] = []  # flat params with a reduce-scatter in flight
        for i, u in enumerate(self.units):
            if u.module is not module:
                u.module.register_forward_pre_hook(partial(self._pre_forward, i))
                u.module.register_forward_hook(partial(self._post_forward, i))

    @property
    def padded_numel(self) -> int:
        """N_padded: sum of the padded flat sizes (what the byte formulas take as N)."""
        return sum(f.padded for u in self.units for f in u.flats)

    def forward(self, *args, **kwargs):
        self._pre_forward(0)
        return self._post_forward(0, self.module, args, self.module(*args, **kwargs))

    def _pre_forward(self, i: int, *_) -> None:
        # BEGIN SOLUTION hint: gather unit i (wait) and make fresh views; with prefetch, start the gather of unit i+1
        for f in self.units[i].flats:
            f.wait_gather()
            f.make_views(partial(self._post_backward, f))
        if self.config.prefetch and i + 1 < len(self.units):
            for f in self.units[i + 1].flats:
                f.start_gather()
        # END SOLUTION

    def _post_forward(self, i: int, module, inputs, output):
        # BEGIN SOLUTION hint: with reshard_after_forward free unit i; if grads are on, route the output tensors through AllGatherBeforeBackward
        if self.config.reshard_after_forward:
            for f in self.units[i].flats:
                f.free()
        if not torch.is_grad_enabled():
            return output
        flat_out = output if isinstance(output, (tuple, list)) else (output,)
        idx = [k for k, o in enumerate(flat_out) if torch.is_tensor(o) and o.requires_grad]
        if not idx:
            return output
        wrapped = AllGatherBeforeBackward.apply(self, i, *(flat_out[k] for k in idx))
        new = list(flat_out)
        for k, w in zip(idx, wrapped):
            new[k] = w
        return type(output)(new) if isinstance(output, (tuple, list)) else new[0]
        # END SOLUTION

    def _backward_order(self) -> list[int]:
        # the root's backward starts first (head), then blocks in reverse
        return [0, *range(len(self.units) - 1, 0, -1)]

    def _pre_backward(self, i: int) -> None:
        if not self._end_queued:  # once per backward: clean up when autograd finishes
            self._end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
        # BEGIN SOLUTION hint: wait for unit i's gather (its views already point at the buffer); with prefetch, start the gather of the unit that runs backward next
        for f in self.units[i].flats:
            f.wait_gather()
        order = self._backward_order()
        pos = order.index(i)
        if self.config.prefetch and pos + 1 < len(order):
            for f in self.units[order[pos + 1]].flats:
                f.start_gather()
        # END SOLUTION

    def _post_backward(self, f: FlatParam, full: torch.Tensor) -> None:
        # BEGIN SOLUTION hint: take full.grad (drop it from full), free f, then hand the grad to f.reduce_grad (sync unless in no_sync)
        for g in self._in_flight:  # finish the previous unit's reduce-scatter: frees its input
            g.drain()
        grad, full.grad = full.grad, None
        f.free()  # the reduction reads only the gradient: drop the gathered copy first
        f.reduce_grad(grad, self._sync)
        self._in_flight = [f]
        # END SOLUTION
        if not self.config.overlap_reduce_scatter:
            f.drain()  # its input (this unit's gradient) goes before the next unit's backward

    def _end_of_backward(self) -> None:
        self._end_queued = False
        for u in self.units:  # frozen flats and units whose grads never came
            for f in u.flats:
                f.free()

    def finish_gradient_synchronization(self) -> None:
        """Wait for the reduce-scatters (HSDP: then all-reduce across the replicas); afterwards
        each shard's ``.grad`` is the mean gradient over every rank."""
        self._in_flight = []
        for u in self.units:
            for f in u.flats:
                f.drain()
                f.free()
        if self.replicate_group is not None:  # after the last reduce-scatter, once per step
            for u in self.units:
                for f in u.flats:
                    f.reduce_replicas()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate full local gradients without reduce-scatter (sync on the next backward)."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """All-gather every parameter in fp32: ``{name: tensor}`` (tied names all present)."""
        out: dict[str, torch.Tensor] = {}
        for u in self.units:
            for f in u.flats:
                out.update(f.full_params())
        return out
