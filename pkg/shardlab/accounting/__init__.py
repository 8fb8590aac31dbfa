"""shardlab.accounting: the one copy of every byte count, volume and bubble fraction.

Pure Python; importing it never imports torch. Modules:

``memory``       persistent model state per rank (precision recipes x DDP/ZeRO layouts)
``peak``         predicted per-rank peak of a step (state + gathered units + activations + buffers)
``stage_peak``   a pipeline stage's peak, action by action, with autograd's backward temporaries
``activations``  saved-activation bytes per transformer layer (Korthikanti et al.)
``comm``         ring/tree collective volumes, alpha-beta time, per-step volumes
``hierarchical`` two-level networks: hierarchical all-reduce, HSDP volume per axis, ZeRO-Offload
``pipeline``     bubble formulas, schedule generator and event-driven simulator
``pipeline_cores`` the simulator with ranks sharing fewer cores (4 CPU ranks on 2 cores)
``mesh``         device meshes (G = D t p c), rank <-> coordinates, groups, MoE folding
``context``      context parallelism: K/V bytes sent per layer (ring, all-gather), attention memory
``expert``       MoE expert capacity and dispatch/return all-to-all bytes
``compute``      FLOPs per token (6N + attention), recompute FLOPs, time, MFU, collective roofline
``overlap``      compute versus communication: each layout's traffic over the compute it can
                 hide behind, and the break-even sizes
``gemm``         FLOPs, bytes and intensity of a matmul, the roofline and ridge, per-GEMM efficiency;
                 GPU data-sheet presets
``planner``      layouts (D, t, p, c, ep, ZeRO, recompute, m, v, SP) checked, costed and ranked
                 (its search: ``layout_search``; its costs: ``layout_cost``, ``layout_types``)
``wire``         what gloo / NCCL algorithms really send per rank (beside the ring model)
``checkpoint``   bytes of a sharded checkpoint per rank, and what resharding reads
"""

from . import (
    activations,
    checkpoint,
    comm,
    compute,
    expert,
    gemm,
    hierarchical,
    memory,
    mesh,
    overlap,
    peak,
    pipeline,
    pipeline_cores,
    planner,
    stage_peak,
    wire,
)
from .activations import (
    MODES,
    ActivationRow,
    activation_bytes,
    activation_bytes_per_layer,
    activation_table,
)
from .comm import (
    ALGOS,
    COLLECTIVES,
    alpha_beta_time,
    collectives_time,
    grad_accum_volume,
    p2p_time,
    pipeline_p2p_volume,
    ring_sent_bytes,
    rounds,
    sent_bytes,
    step_volume,
    tp_volume,
)
from .compute import (
    ModelShape,
    Roofline,
    collective_roofline,
    compute_time,
    flops_per_token,
    mfu,
    recompute_flops_per_token,
)
from .context import attention_memory, cp_volume, kv_heads_per_rank
from .memory import (
    GB,
    LAYOUTS,
    OBJECTS,
    RECIPES,
    SHARDED_OBJECTS,
    GiB,
    Recipe,
    StateBreakdown,
    fsdp_padded_numel,
    get_recipe,
    model_state,
    state_table,
)
from .mesh import AXES, EXPERT_AXES, Coords, Mesh, MoeFold, moe_fold
from .peak import (
    TERMS,
    PeakBreakdown,
    PeakPoint,
    fsdp_gathered_units_alive,
    predict_layout_peak,
    predict_peak,
)
from .pipeline import (
    ACTION_KINDS,
    KINDS,
    Action,
    SimResult,
    bubble_ratio,
    bubble_time,
    idle_fraction,
    schedule,
    simulate,
    utilization,
)
from .planner import Cluster, Plan, plan
from .stage_peak import block_backward_temporaries
from .wire import backend_sent_bytes, binomial_children, gloo_sent_bytes

__all__ = [
    "Cluster",
    "ModelShape",
    "Plan",
    "Roofline",
    "collective_roofline",
    "compute",
    "compute_time",
    "flops_per_token",
    "gemm",
    "mfu",
    "overlap",
    "plan",
    "planner",
    "recompute_flops_per_token",
    "ACTION_KINDS",
    "ALGOS",
    "AXES",
    "Action",
    "ActivationRow",
    "COLLECTIVES",
    "Coords",
    "EXPERT_AXES",
    "GB",
    "GiB",
    "KINDS",
    "LAYOUTS",
    "MODES",
    "Mesh",
    "MoeFold",
    "OBJECTS",
    "PeakBreakdown",
    "PeakPoint",
    "RECIPES",
    "Recipe",
    "SHARDED_OBJECTS",
    "SimResult",
    "StateBreakdown",
    "TERMS",
    "activation_bytes",
    "activation_bytes_per_layer",
    "activation_table",
    "activations",
    "checkpoint",
    "alpha_beta_time",
    "bubble_ratio",
    "bubble_time",
    "collectives_time",
    "comm",
    "context",
    "cp_volume",
    "attention_memory",
    "kv_heads_per_rank",
    "expert",
    "hierarchical",
    "fsdp_gathered_units_alive",
    "fsdp_padded_numel",
    "get_recipe",
    "grad_accum_volume",
    "idle_fraction",
    "memory",
    "mesh",
    "model_state",
    "moe_fold",
    "p2p_time",
    "peak",
    "pipeline",
    "pipeline_cores",
    "pipeline_p2p_volume",
    "predict_layout_peak",
    "predict_peak",
    "ring_sent_bytes",
    "rounds",
    "schedule",
    "sent_bytes",
    "simulate",
    "state_table",
    "step_volume",
    "tp_volume",
    "utilization",
    "wire",
    "stage_peak",
    "block_backward_temporaries",
    "backend_sent_bytes",
    "binomial_children",
    "gloo_sent_bytes",
]
