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
    ]
    for fig in figs:
        assert fig.axes
        plt.close(fig)


def test_bad_input_is_a_sentence():
    with pytest.raises(ValueError, match="D"):
        diagrams.ring_allreduce(0)
    with pytest.raises(ValueError, match="rectangle"):
        diagrams.moe_dispatch(((1, 2), (3,)))
    with pytest.raises(ValueError, match="rank=16"):
        diagrams.mesh_groups(2, 2, 2, 2, rank=16)
