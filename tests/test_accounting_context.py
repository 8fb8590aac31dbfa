"""shardlab.accounting.context: CP bytes per layer (ring / all-gather, GQA) and attention memory."""

from __future__ import annotations

import pytest
from shardlab.accounting import comm, context

MiB = 2**20


def test_llama3_405b_per_gpu_volume():
    # 8 K/V heads of 128 over t=8: one head per GPU; s=131072, c=16, bf16
    fwd = context.cp_volume(1, 131072, 8, 128, 16, q=2, t=8, phase="forward")
    assert fwd == 60 * MiB
    assert context.cp_volume(1, 131072, 8, 128, 16, q=2, t=1, phase="forward") == 480 * MiB
    # without GQA (128 K/V heads) the per-GPU figure shrinks by the same factor t
    mha = context.cp_volume(1, 131072, 128, 128, 16, q=2, t=8, phase="forward")
    assert mha == context.cp_volume(1, 131072, 128, 128, 16, q=2, t=1, phase="forward") / 8
    assert mha == 16 * fwd


def test_phases_variants_and_all_gather_identity():
    args = (2, 4096, 4, 64, 8)
    kv = context.kv_bytes(2, 4096, 4, 64, q=2)
    assert kv == 2 * 2 * 2 * 4096 * 4 * 64
    fwd = context.cp_volume(*args, phase="forward")
    assert fwd == comm.ring_sent_bytes("all_gather", kv, 8) == kv * 7 / 8
    assert context.cp_volume(*args, phase="backward") == 2 * fwd
    assert context.cp_volume(*args) == 3 * fwd  # phase="step"
    for phase in context.PHASES:
        assert context.cp_volume(*args, variant="all_gather", phase=phase) == context.cp_volume(
            *args, variant="ring", phase=phase
        )
    assert context.cp_volume(*args, layers=3, microbatches=2) == 6 * context.cp_volume(*args)
    assert context.cp_volume(2, 4096, 4, 64, 1) == 0  # c=1: nothing moves


def test_kv_heads_per_rank():
    assert context.kv_heads_per_rank(8, 8) == 1
    assert context.kv_heads_per_rank(8, 2) == 4
    assert context.kv_heads_per_rank(2, 8) == 1  # replicated head when t > kv_heads
    with pytest.raises(ValueError, match="t=3 and kv_heads=8"):
        context.kv_heads_per_rank(8, 3)


def test_attention_memory_terms():
    ring = context.attention_memory(1, 256, 4, 2, 16, 4, "ring", q=4)
    n = 64
    assert ring["kv_buffers"] == 2 * 2 * 4 * n * 2 * 16  # two K/V blocks in flight
    assert ring["scores"] == 4 * 4 * n * n
    assert ring["rows"] == (3 * 16 + 6) * 4 * 4 * n
    assert ring["total"] == sum(v for k, v in ring.items() if k != "total")
    two = context.attention_memory(1, 256, 4, 2, 16, 2, "ring", q=4)
    assert two["kv_buffers"] == 2 * 4 * 128 * 2 * 16  # c=2: only one block ever arrives
    ag = context.attention_memory(1, 256, 4, 2, 16, 4, "all_gather", q=4)
    assert ag["kv_buffers"] == 2 * 4 * 256 * 2 * 16
    assert ag["scores"] == 4 * 4 * n * 256
    # doubling s quadruples the all-gather's score matrix on each rank; the ring's too, but
    # from a c^2 smaller start
    ag2 = context.attention_memory(1, 512, 4, 2, 16, 4, "all_gather", q=4)
    assert ag2["scores"] == 4 * ag["scores"]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: context.cp_volume(1, 100, 8, 128, 16), "c=16 does not divide the sequence s=100"),
        (lambda: context.check_sequence(20, 4, zigzag=True), r"2c = 8 \(c=4\).*s=20"),
        (lambda: context.cp_volume(1, 64, 8, 128, 4, variant="tree"), "variant='tree'"),
        (lambda: context.cp_volume(1, 64, 8, 128, 4, phase="fwd"), "phase='fwd'"),
        (lambda: context.cp_volume(1, 64, 0, 128, 4), "kv_heads=0"),
        (
            lambda: context.attention_memory(1, 64, 6, 4, 16, 2),
            "kv_heads=4 does not divide heads=6",
        ),
    ],
)
def test_bad_input_names_values(call, match):
    with pytest.raises(ValueError, match=match):
        call()
