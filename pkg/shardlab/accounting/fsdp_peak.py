"""The predicted peak of one fp32 AdamW step of a flat-unit FSDP (ZeRO-3) model, composed once.

Lab 04 (flat and per-parameter units), lab 09 (FSDP x TP, where every size is a tp slice) and
``shardlab train`` (fsdp, fsdp+tp) predict the same step: a root unit (embedding, final norm,
head) gathered the whole step, then one unit per block. They differ only in the sizes they
read off their model, so the composition of :func:`.peak.predict_peak`'s terms lives here and
each caller passes sizes:

* ``persistent``: weight shards + AdamW moments, ``model_state(N_pad, D, "zero3", recipe)``
  without its gradients: ``zero_grad()`` frees the gradient shards after each step, so at the
  start of backward they do not exist;
* ``gathered_params`` / ``unsharded_grads``: each block's gathered buffer (``unit_bytes``)
  by the reshard/prefetch schedule, and its full gradient during its backward; the root's
  gathered buffer (``root_bytes``) is a ``buffers`` term for the whole step;
* ``grad_shards``: each block's gradient shard from the end of its backward to the optimizer
  step; the root's shard (``root_shard_bytes``) is complete right after block 0's backward
  (the last), so it joins block 0's;
* ``activations``: the blocks' saved tensors (``activation_bytes``) and those the head adds
  after the last block (``head_activation_bytes``, freed by the head's backward first);
* ``backward_workspace``: the gradients of the log-probabilities and logits
  (:func:`.peak.logits_workspace`), in their own moment before any block's backward;
* ``optimizer_workspace``: single-tensor AdamW's temporaries of the largest stepped tensor
  (:func:`.peak.adam_workspace` of ``stepped_numels``).
"""

from __future__ import annotations

from collections.abc import Sequence

from . import memory, peak


def fsdp_step_peak(
    padded_numel: int,
    world: int,
    unit_bytes: Sequence[float],
    shard_bytes: Sequence[float],
    root_bytes: float,
    root_shard_bytes: float,
    activation_bytes: float,
    head_activation_bytes: float,
    backward_workspace_bytes: float,
    stepped_numels: Sequence[int],
    prefetch: bool | int,
    reshard_after_forward: bool,
    recipe: str = "fp32",
) -> peak.PeakBreakdown:
    """``predict_peak`` of one step (module docstring): ``padded_numel`` elements sharded over
    ``world`` data-parallel ranks; ``unit_bytes`` / ``shard_bytes`` per block unit in forward
    order; the root's gathered and shard bytes; saved-activation, head and logits-workspace
    bytes; the numels the optimizer steps; the wrapper's prefetch and reshard flags."""
    shards = list(shard_bytes)
    if shards:
        shards[0] += root_shard_bytes  # the root's shard is complete after block 0's backward
    state = memory.model_state(padded_numel, world, "zero3", recipe)
    return peak.predict_peak(
        persistent_bytes=state.total - state.per_object["grads"],
        unit_bytes=list(unit_bytes),
        activation_bytes=activation_bytes,
        buffer_bytes=root_bytes,
        prefetch=prefetch,
        reshard_after_forward=reshard_after_forward,
        grad_unit_bytes=list(unit_bytes),
        grad_shard_bytes=shards,
        backward_workspace_bytes=backward_workspace_bytes,
        backward_workspace_at="before_units",
        head_activation_bytes=head_activation_bytes,
        optimizer_workspace_bytes=peak.adam_workspace(list(stepped_numels)),
    )


def flat_unit_sizes(model, q: int = 4) -> dict[str, object]:
    """The size arguments of :func:`fsdp_step_peak` read off a flat-unit wrapper (lab 04's
    ``FSDP``, lab 09's FSDP x TP): ``model.units[0]`` is the root, each ``FlatParam`` has
    ``padded`` and ``shard_numel`` elements of ``q`` bytes."""
    return dict(
        padded_numel=model.padded_numel,
        unit_bytes=[f.padded * q for u in model.units[1:] for f in u.flats],
        shard_bytes=[f.shard_numel * q for u in model.units[1:] for f in u.flats],
        root_bytes=sum(f.padded * q for f in model.units[0].flats),
        root_shard_bytes=sum(f.shard_numel * q for f in model.units[0].flats),
        stepped_numels=[p.numel() for p in model.parameters()],
        prefetch=model.config.prefetch,
        reshard_after_forward=model.config.reshard_after_forward,
    )
