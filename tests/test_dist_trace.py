"""CommTrace on real gloo ranks (bytes follow the ring model; DDP and FSDP2 are visible),
MemoryTrace exactness (in-process and under DDP on 2 ranks) and the plot helper."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import _dist_workers as w  # noqa: E402
from shardlab.models import GPT, GPTConfig, make_batch  # noqa: E402
from shardlab.runtime import MemoryTrace, launch, phase, plot_memory  # noqa: E402

V = 12  # elements; divisible by 2, 3 and 4


@pytest.mark.parametrize("d", [2, 3])
def test_collective_bytes_follow_ring_model(d):
    res = launch(w.trace_collectives, d, V, quiet=True)
    nbytes = V * 4
    for rank, (records, table) in enumerate(res):
        by = {}
        for r in records:
            by.setdefault((r.phase, r.op), []).append(r)
        (ar,) = by[("ar", "all_reduce")]
        assert ar.sent_bytes == pytest.approx(2 * nbytes * (d - 1) / d)
        assert (ar.group_size, ar.numel, ar.dtype) == (d, V, "torch.float32")
        (rs,) = by[("rs", "reduce_scatter")]
        assert rs.numel == V and rs.sent_bytes == pytest.approx(nbytes * (d - 1) / d)
        ags = by[("ag", "all_gather")]
        assert [a.c10d for a in ags] == ["c10d._allgather_base_", "c10d.allgather_"]
        for a in ags:
            assert a.numel == V and a.sent_bytes == pytest.approx(nbytes * (d - 1) / d)
        (bc,) = by[("other", "broadcast")]
        assert bc.sent_bytes == pytest.approx(nbytes) and bc.peer == 0
        (a2a,) = by[("other", "all_to_all")]
        assert a2a.sent_bytes == pytest.approx(nbytes * (d - 1) / d)
        (aar,) = by[("async", "all_reduce")]
        assert aar.async_op is True and aar.sent_bytes == ar.sent_bytes
        assert ar.async_op is False
        if rank == 0:
            assert by[("p2p", "send")][0].sent_bytes == 5 * 8
            assert by[("async", "send")][0].sent_bytes == 3 * 4
        elif rank == 1:
            (rv,) = by[("p2p", "recv")]
            assert rv.sent_bytes == 0 and rv.nbytes == 40 and rv.peer == 0
            assert by[("async", "recv")][0].sent_bytes == 0
        assert all(r.seconds >= 0 for r in records)
        assert "all_reduce" in table and "sent bytes" in table


def test_ddp_reducer_allreduce_is_visible():
    res = launch(w.trace_ddp, 2, quiet=True)
    for records, n in res:
        bw = [r for r in records if r.phase == "backward"]
        assert [r.op for r in bw] == ["all_reduce"]
        assert bw[0].numel == n and bw[0].sent_bytes == pytest.approx(2 * 4 * n / 2)
        setup_ops = {r.op for r in records if r.phase == "setup"}
        assert "broadcast" in setup_ops


def test_fsdp2_gathers_and_reduce_scatters_are_visible():
    res = launch(w.trace_fsdp2, 2, quiet=True)
    for records, n in res:
        fw = [r for r in records if r.phase == "forward"]
        bw = [r for r in records if r.phase == "backward"]
        assert {r.op for r in fw} == {"all_gather"}
        assert sum(r.numel for r in fw) == n
        rs = [r for r in bw if r.op == "reduce_scatter"]
        assert sum(r.numel for r in rs) == n
        assert sum(r.sent_bytes for r in rs) == pytest.approx(4 * n / 2)


# ----------------------------------------------------------------------------- MemoryTrace

CFG = GPTConfig(vocab_size=32, seq_len=8, n_layer=2, n_head=2, d_model=16)


def _bytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


def test_params_grads_optimizer_exact():
    model = GPT(CFG)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-3)
    idx, tgt = make_batch(CFG, 2, seed=0)
    with MemoryTrace() as mt:
        mt.watch(model, opt)
        assert mt.live_bytes("parameters") == _bytes(params)
        with phase("forward"):
            loss = model(idx, tgt)[1]
        assert mt.live_bytes("activations") > 0
        with phase("backward"):
            loss.backward()
        assert mt.live_bytes("gradients") == _bytes(p.grad for p in params)
        assert mt.live_bytes("parameters") + mt.live_bytes("gradients") == 2 * _bytes(params)
        with phase("optimizer"):
            opt.step()
        state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        assert mt.live_bytes("optimizer") == _bytes(state)
        opt.zero_grad(set_to_none=True)
        assert mt.live_bytes("gradients") == 0
    tl = mt.timeline()
    assert tl.peak == max(tl.total()) and tl.peak >= 4 * _bytes(params)
    assert [m[1] for m in tl.markers if m[2] == "start"] == ["forward", "backward", "optimizer"]
    assert tl.phase_peak("backward") > 0


def test_views_counted_once_and_freed():
    with MemoryTrace() as mt:
        a = torch.zeros(100)
        v = a[10:]  # noqa: F841 - a view keeps the storage alive
        assert mt.live_bytes() == 400
        del a
        assert mt.live_bytes() == 400
        del v
        assert mt.live_bytes() == 0
        with mt.category("communication"):
            b = torch.ones(10)
        assert mt.live_bytes("communication") == 40
        b.untyped_storage().resize_(0)
        assert mt.live_bytes("communication") == 0
    with pytest.raises(ValueError, match="category='weights'"):
        mt.tag(b, "weights")


def test_ddp_ranks_exact_and_plot():
    res = launch(w.memory_ddp, 2, quiet=True)
    for o in res:
        assert o["param_grad"] == 2 * o["pbytes"]
        tl = o["timeline"]
        assert tl.peak_breakdown["parameters"] == o["pbytes"]
        assert tl.peak_breakdown["communication"] > 0  # DDP's gradient buckets
        assert [r.op for r in o["comm"] if r.phase == "backward"] == ["all_reduce"]
    import matplotlib

    matplotlib.use("Agg")
    fig = plot_memory([o["timeline"] for o in res], predicted_peak=res[0]["timeline"].peak * 1.1)
    assert len(fig.axes) == 2
