"""Conceptual diagrams: the ring all-reduce they draw is a correct all-reduce; every figure builds."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from shardlab import diagrams  # noqa: E402
from shardlab.diagrams._data_parallel import ring_states  # noqa: E402


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_ring_states_are_an_all_reduce(world):
    states = ring_states(world)
    everyone = frozenset(range(world))
    assert len(states) == 2 * world - 1  # input, D-1 reduce-scatter steps, D-1 all-gather steps
    # after reduce-scatter rank r holds the finished chunk r (lab 01's convention)
    assert all(states[world - 1][r][r] == everyone for r in range(world))
    assert all(chunk == everyone for row in states[-1] for chunk in row)
    # each step moves exactly one chunk per rank: D chunks change per step
    for before, after in zip(states, states[1:]):
        changed = sum(b != a for rb, ra in zip(before, after) for b, a in zip(rb, ra))
        assert changed == world


def test_every_diagram_builds():
    import matplotlib.pyplot as plt

    figs = [
        diagrams.ring_allreduce(4),
        diagrams.fsdp_lifecycle(3, prefetch=False),
        diagrams.tp_linear_splits(4),
        diagrams.sp_regions(),
        diagrams.ring_attention(2),
        diagrams.moe_dispatch(((1, 2), (3, 0))),
        diagrams.mesh_groups(2, 2, 2, 2, rank=9),
        diagrams.zero_partitions(3),
        diagrams.zero_step_dataflow(3),
        diagrams.tp_attention_heads(6, 3),
        diagrams.tp_layer(),
    ]
    for fig in figs:
        assert fig.axes
        plt.close(fig)


@pytest.mark.parametrize("units", [1, 2, 5])
@pytest.mark.parametrize("prefetch", [True, False])
def test_fsdp_lifecycle_holds_activations_and_feeds_the_update(units, prefetch):
    from shardlab.diagrams._data_parallel import fsdp_lifecycle_events

    ev = fsdp_lifecycle_events(units, prefetch)
    span = {(u, k): (s, e) for u, k, s, e in ev if k not in ("all-gather", "full weights")}
    update = min(s for u, k, s, e in ev if k == "update")
    assert update == max(e for u, k, s, e in ev if k == "reduce-scatter")
    for u in range(units):
        f, b = span[(u, "forward")], span[(u, "backward")]
        # activations saved by the forward live until the backward that consumes them ends
        assert span[(u, "saved activations")] == (f[1], b[1])
        # the owned gradient shard appears when the reduce-scatter ends and feeds the update
        rs = span[(u, "reduce-scatter")]
        assert rs[0] == b[1] and span[(u, "gradient shard")] == (rs[1], update)
        assert span[(u, "update")][0] == update
        # gathered twice (forward, backward) except the last unit, kept into its backward
        gathers = [s for v, k, s, e in ev if v == u and k == "all-gather"]
        assert len(gathers) == (1 if u == units - 1 else 2)
        weights = [(s, e) for v, k, s, e in ev if v == u and k == "full weights"]
        for s, e in (f, b):  # full weights exist whenever the unit computes
            assert any(ws <= s and e <= we for ws, we in weights)


@pytest.mark.parametrize("dp", [1, 2, 4, 7])
def test_zero_pictures_follow_the_accounting(dp):
    from shardlab.accounting import memory
    from shardlab.diagrams._zero import ZERO_OBJECTS, zero_held_fractions, zero_step_states

    held = zero_held_fractions(dp)
    for layout in memory.LAYOUTS:
        for obj in ZERO_OBJECTS:
            share = sum(b - a for a, b in held[layout][obj])
            want = 1 if obj in memory.SHARDED_OBJECTS[layout] else dp
            assert share == pytest.approx(want)  # a shard per rank, or a replica on every rank
    # the picture's bytes per rank are model_state's: sum each object's fraction * bytes
    rec = memory.RECIPES["mixed-adam-16"]
    for layout in memory.LAYOUTS:
        per_rank = sum((held[layout][o][0][1] - held[layout][o][0][0]) * rec.bytes_of(o)
                       for o in ZERO_OBJECTS)
        assert per_rank == pytest.approx(memory.model_state(10**6, dp, layout, rec).bytes_per_param)
    states = [h for _, h in zero_step_states(dp)]
    everyone = frozenset(range(dp))
    assert all(states[0][r][c] == {r} for r in range(dp) for c in range(dp))
    for mid in states[1:3]:  # each rank holds only its own chunk, summed over every rank
        assert all((mid[r][c] == everyone) == (c == r) and (mid[r][c] is None) == (c != r)
                   for r in range(dp) for c in range(dp))
    assert all(chunk == everyone for row in states[3] for chunk in row)


def test_tp_pictures_follow_the_accounting():
    from shardlab.accounting import comm
    from shardlab.diagrams._tensor import head_owners, tp_layer_collectives

    assert head_owners(8, 2) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert head_owners(6, 3) == [0, 0, 1, 1, 2, 2]
    k = tp_layer_collectives()
    assert k == {"forward": 2, "backward": 2}
    b, s, h, t, q = 1, 16, 32, 4, 2
    assert comm.tp_volume(b, s, h, t, q) == sum(k.values()) * comm.ring_sent_bytes(
        "all_reduce", q * b * s * h, t
    )


def test_bad_input_is_a_sentence():
    with pytest.raises(ValueError, match="D"):
        diagrams.ring_allreduce(0)
    with pytest.raises(ValueError, match="rectangle"):
        diagrams.moe_dispatch(((1, 2), (3,)))
    with pytest.raises(ValueError, match="rank=16"):
        diagrams.mesh_groups(2, 2, 2, 2, rank=16)
    with pytest.raises(ValueError, match=r"t=3 does not divide a \(heads\)=8"):
        diagrams.tp_attention_heads(8, 3)
    with pytest.raises(ValueError, match="D=0"):
        diagrams.zero_partitions(0)
    with pytest.raises(ValueError, match="prefetch"):
        diagrams.fsdp_lifecycle(2, prefetch="yes")
