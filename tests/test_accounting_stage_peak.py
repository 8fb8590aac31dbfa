"""accounting.stage_peak: a pipeline stage's peak walked action by action, by hand."""

from __future__ import annotations

import pytest
from shardlab.accounting import pipeline
from shardlab.accounting.stage_peak import block_backward_temporaries, stage_peak


def test_temporaries_are_the_output_projection_backward():
    # lab 09's block: b=2, s=16, h=32, f=128, fp32: output gradient 4,096 + input gradient
    # 16,384 + weight gradient 16,384 + bias gradient 128 = 36,992 bytes
    assert block_backward_temporaries(2, 16, 32, 128, 4) == 36_992
    assert block_backward_temporaries(2, 16, 32, 128, 4, bias=False) == 36_864
    with pytest.raises(ValueError, match="ffn=0"):
        block_backward_temporaries(2, 16, 32, 0)


# one stage's numbers, chosen so each term is recognisable
KW = dict(chunk_bytes=1000, persistent_bytes=100_000, grad_bytes=500, message_bytes=10,
          temporaries_bytes=300)


def test_first_stage_1f1b_peaks_at_its_first_backward():
    acts = pipeline.schedule("1f1b", 2, 2)[0]  # F0 F1 B0 B1
    assert [str(a) for a in acts] == ["F0", "F1", "B0", "B1"]
    pk = stage_peak(acts, first=True, last=False, **KW)
    # B0: two microbatches in flight, no gradient yet, sends of F0 and F1 + the receive posted
    # for B1 (the one B0 consumes is the output gradient inside the temporaries)
    assert (pk.phase_of_peak, pk.unit_of_peak) == ("backward", 2)
    assert pk.terms["activations"] == 2000 and pk.terms["grads"] == 0
    assert pk.terms["buffers"] == 3 * 10 and pk.terms["backward_temporaries"] == 300
    assert pk.total == 100_000 + 2000 + 30 + 300
    # B1: one microbatch in flight, the gradients from B0, nothing posted ahead
    b1 = [pt for pt in pk.timeline if pt.phase == "backward" and pt.unit == 3][0]
    assert b1.total == 100_000 + 500 + 1000 + 2 * 10 + 300


def test_last_stage_frees_its_head_before_the_blocks_backward():
    acts = pipeline.schedule("1f1b", 2, 2)[1]  # F0 B0 F1 B1
    kw = dict(KW, head_bytes=400, head_grad_bytes=7, backward_workspace_bytes=200,
              temporaries_bytes=800)
    pk = stage_peak(acts, first=False, last=True, **kw)
    # B1's block: gradients of B0, one microbatch less its head, B0's send, no receive ahead
    assert (pk.phase_of_peak, pk.unit_of_peak) == ("backward", 3)
    assert pk.total == 100_000 + 500 + (1000 - 400) + 10 + 800
    start = [pt for pt in pk.timeline if pt.unit == 1 and "backward_workspace" in pt.terms
             and pt.terms["backward_workspace"]][0]
    # B0's start: the whole microbatch, the logits workspace, the receive posted for F1
    assert start.total == 100_000 + 1000 + 200 + 10
    block0 = [pt for pt in pk.timeline if pt.unit == 1 and pt.terms["backward_temporaries"]][0]
    assert block0.terms["grads"] == 7  # only the head's gradients exist during the first B


def test_gpipe_and_end_of_step_moments():
    acts = pipeline.schedule("gpipe", 2, 4)[1]
    pk = stage_peak(acts, first=False, last=True, bucket_bytes=500,
                    optimizer_workspace_bytes=900, **KW)
    assert pk.terms["activations"] == 4 * 1000  # GPipe holds every microbatch
    assert pk.total == 100_000 + 4000 + 300  # first B's block: nothing sent, nothing ahead
    ends = {pt.phase: pt.total for pt in pk.timeline if pt.unit is None}
    assert ends == {"dp all-reduce": 101_000, "optimizer": 101_400}
    # a large bucket moves the peak to the all-reduce
    pk = stage_peak(acts, first=False, last=True, bucket_bytes=10_000, **KW)
    assert (pk.phase_of_peak, pk.total) == ("dp all-reduce", 110_500)


def test_bad_input():
    acts = pipeline.schedule("zb-h1", 2, 2)[0]
    with pytest.raises(ValueError, match="F/B actions of one chunk"):
        stage_peak(acts, first=True, last=False, **KW)
    with pytest.raises(ValueError, match="head_bytes=2000"):
        stage_peak(pipeline.schedule("1f1b", 2, 2)[1], first=False, last=True,
                   head_bytes=2000, **KW)
    with pytest.raises(ValueError, match="message_bytes=-1"):
        stage_peak([], first=True, last=True, **{**KW, "message_bytes": -1})
