"""Conceptual diagrams of the book, drawn by code (matplotlib) so they regenerate with the chapter.

Each function returns a ``matplotlib.figure.Figure`` and takes the sizes it draws as
arguments, so a chapter can draw the same picture for its own example:

``ring_allreduce``      ring all-reduce as reduce-scatter then all-gather, chunk by chunk (ch 1)
``zero_partitions``     which part of each object every rank keeps, per ZeRO stage (ch 3)
``zero_step_dataflow``  reduce-scatter → update of the owned shard → all-gather (ch 3)
``fsdp_lifecycle``      gather / compute / free / reduce-scatter of each unit on a time axis, with
                        the saved activations and the owned gradient shard feeding the update (ch 4)
``tp_linear_splits``    column- and row-parallel linears with ``f`` and ``g`` marked (ch 6)
``tp_attention_heads``  attention split by whole heads over the tensor-parallel ranks (ch 6)
``tp_layer``            one whole transformer layer under TP: split, replicated, f and g (ch 6)
``sp_regions``          the sequence- and tensor-parallel regions of one layer (ch 7)
``ring_attention``      which ring step computes each causal block, contiguous vs zig-zag (ch 8)
``moe_dispatch``        tokens travelling to their experts' ranks and back (ch 9)
``mesh_groups``         a ``G = D t p c`` mesh with one rank's groups highlighted (ch 10)

Group membership comes from :mod:`shardlab.accounting.mesh`; nothing here computes a byte count
or a time. Importing this package does not import matplotlib (each function does).
"""

from __future__ import annotations

from ._data_parallel import fsdp_lifecycle, ring_allreduce
from ._mesh import mesh_groups
from ._model_parallel import moe_dispatch, ring_attention, sp_regions, tp_linear_splits
from ._tensor import tp_attention_heads, tp_layer
from ._zero import zero_partitions, zero_step_dataflow

__all__ = [
    "fsdp_lifecycle",
    "mesh_groups",
    "moe_dispatch",
    "ring_allreduce",
    "ring_attention",
    "sp_regions",
    "tp_attention_heads",
    "tp_layer",
    "tp_linear_splits",
    "zero_partitions",
    "zero_step_dataflow",
]
