"""shardlab.accounting.expert: capacity, expert owners, all-to-all bytes of an MoE layer."""

import itertools
import random

import pytest
from shardlab.accounting import comm, expert


def test_capacity_formula_and_decimal_cf():
    assert expert.capacity(2048, 16, 2, 1.0) == 256
    assert expert.capacity(2048, 16, 2, 1.25) == 320
    # 1.1 * 2 * 40 / 8 = 11 exactly; a float detour gives 11.000000000000002 -> 12
    assert expert.capacity(40, 8, 2, 1.1) == 11
    assert expert.capacity(10, 4, 1, 0.5) == 2  # ceil(1.25)
    assert expert.capacity(1, 64, 1, 0.01) == 1  # never 0 for a positive cf


@pytest.mark.parametrize(
    "args, words",
    [
        ((6, 4, 2, 1.0), ["num_experts=6", "ep=4"]),
        ((4, 2, 5, 1.0), ["top_k=5", "num_experts=4"]),
        ((4, 2, 1, 0.0), ["capacity_factor=0.0"]),
        ((4, 2, 1, -1), ["capacity_factor=-1"]),
        ((0, 1, 1, 1.0), ["num_experts=0"]),
    ],
)
def test_check_moe_names_the_values(args, words):
    with pytest.raises(ValueError) as e:
        expert.check_moe(*args)
    for w in words:
        assert w in str(e.value)


def test_expert_owner_blocks():
    assert [expert.expert_owner(x, 8, 4) for x in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="expert=8"):
        expert.expert_owner(8, 8, 4)
    with pytest.raises(ValueError, match="num_experts=6"):
        expert.expert_owner(0, 6, 4)


def _brute(kept, h, q):
    """Enumerate every row that crosses a rank boundary, one by one."""
    ep, n_exp = len(kept), len(kept[0])
    per = n_exp // ep
    sent = [0] * ep
    for s, x in itertools.product(range(ep), range(n_exp)):
        d = x // per
        for _ in range(kept[s][x]):
            if d != s:
                sent[s] += h * q  # dispatch: the token row leaves its home
                sent[d] += h * q  # return: the output row goes back home
    return sent


def test_a2a_sent_bytes_equals_row_enumeration():
    rng = random.Random(0)
    for ep, per in [(1, 3), (2, 2), (3, 1), (4, 2)]:
        kept = [[rng.randrange(0, 9) for _ in range(ep * per)] for _ in range(ep)]
        assert expert.a2a_sent_bytes(kept, 8, 4) == _brute(kept, 8, 4)
        assert expert.a2a_sent_bytes(kept, 8, 4, backward=True) == [
            2 * b for b in _brute(kept, 8, 4)
        ]


def test_rank_matrix_and_diagonal_stays_home():
    kept = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert expert.rank_matrix(kept) == [[3, 7], [11, 15]]
    assert expert.a2a_sent_bytes(kept, 1, 1) == [7 + 11, 11 + 7]
    assert expert.a2a_sent_bytes([[5, 0], [0, 5]], 4, 2) == [0, 0]
    with pytest.raises(ValueError, match="num_experts=3"):
        expert.rank_matrix([[1, 2, 3], [1, 2, 3]])
    with pytest.raises(ValueError, match=r"kept\[0\]\[1\]"):
        expert.rank_matrix([[1, -2], [1, 2]])


def test_expectation_is_the_mean_over_uniform_routings():
    """Exact expectation: average a2a_sent_bytes over every equally likely routing."""
    ep, n_exp, t, h, q = 2, 4, 2, 3, 2  # 2 ranks x 2 tokens, top-1: 4**4 routings
    total = [0, 0]
    routings = list(itertools.product(range(n_exp), repeat=ep * t))
    for r in routings:
        kept = [[0] * n_exp for _ in range(ep)]
        for i, x in enumerate(r):
            kept[i // t][x] += 1
        for s, b in enumerate(expert.a2a_sent_bytes(kept, h, q)):
            total[s] += b
    want = expert.expected_a2a_sent_bytes(t, 1, h, q, ep)
    assert [b / len(routings) for b in total] == [want, want]
    assert want == 2 * comm.ring_sent_bytes("all_to_all", t * h * q, ep)
    assert expert.expected_a2a_sent_bytes(t, 1, h, q, ep, backward=True) == 2 * want
    assert expert.expected_a2a_sent_bytes(t, 2, h, q, 1) == 0
