"""The shared cases of the combined-layouts lab: the two models, meshes, batches and steps,
and the one-process references the distributed runs are compared with.

A leaf module: ``_workers_combined`` (tests, notebook), ``_memory_combined`` (memory checks)
and ``_pytorch_combined`` (PyTorch's composition) import it at the top, and it imports none of
them, so no import among them is circular or deferred.
"""

from __future__ import annotations

import _earlier  # noqa: F401  (labs 04, 05 and 06 by file)
import torch
from _workers_tensor import full_grads
from combined import tp_groups
from shardlab.models import GPT, GPTConfig, lm_loss, step_batch
from tensor_block import ParallelGPT, TPConfig
from tensor_reference import ModelConfig, SerialGPT, make_batch

Q = 4  # fp32 everywhere: weights, activations, communication
STEPS, LR = 3, 0.1
# FSDP x TP: lab 06's GPT without dropout (each dp rank sees other sequences than one
# process would put at the same batch position, so seeded masks would not line up)
TP_MODEL = ModelConfig(vocab=64, seq=16, h=32, a=4, ffn=96, layers=2, dropout=0.0,
                       attn_dropout=0.0)
TP_BATCH = 4  # global: 2 sequences per dp rank
FSDP_TP_MESH = dict(G=4, dp=2, tp=2, pp=1)
# DP x PP: two pipelines of two stages, m microbatches each
PP_MODEL = GPTConfig(vocab_size=64, seq_len=16, n_layer=2, n_head=2, d_model=32)
PP_BATCH, PP_M = 8, 2  # global batch; each pipeline gets 4 = 2 microbatches of 2
DP_PP_MESH = dict(G=4, dp=2, tp=1, pp=2)


def _dp_slice(t: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    return t.chunk(dp)[dp_rank].contiguous()


# ----------------------------------------------------------------- FSDP x TP
def tp_batch(step: int):
    return make_batch(TP_MODEL, TP_BATCH, seed=step)


def fsdp_tp_full_params(model, ag) -> dict[str, torch.Tensor]:
    """Every weight as one full tensor under SerialGPT's names: FSDP's all-gather over dp,
    then lab 06's gather over tp (``full_grads`` reads ``.grad``, so we lend it the weights)."""
    sd = model.full_state_dict()  # tp-local full tensors, ParallelGPT's names
    shell = ParallelGPT(SerialGPT(TP_MODEL), tp_groups(ag), TPConfig(TP_MODEL, ag.mesh.tp))
    for name, p in shell.named_parameters():
        p.grad = sd[name]
    return {k: v.clone() for k, v in full_grads(shell, tp_groups(ag)).items()}


def fsdp_tp_reference(steps: int = STEPS) -> tuple[dict, list[float]]:
    model = SerialGPT(TP_MODEL)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        idx, tgt = tp_batch(step)
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, losses


# ----------------------------------------------------------------- DP x PP
def pp_microbatches(step: int, dp_rank: int, dp: int):
    idx, tgt = (_dp_slice(z, dp_rank, dp) for z in step_batch(PP_MODEL, step, PP_BATCH))
    return [t.clone() for t in idx.chunk(PP_M)], [t.clone() for t in tgt.chunk(PP_M)]


def dp_pp_reference(steps: int = STEPS) -> dict[str, torch.Tensor]:
    model = GPT(PP_MODEL, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        lm_loss(model, *step_batch(PP_MODEL, step, PP_BATCH)).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}
