"""Planted bug for labs/07_context: the ring backward forgets to bring dK/dV home.

Every rank still passes the dK/dV accumulators around the ring (the bytes are right), but the
owner of a K/V block drops the accumulator that arrives after the last step, so its dK/dV
hold only its own queries' contribution: wrong for every block that another rank attends to.

Lost (10 of 22 points): the ring's equivalence with full attention on 2 and 4 ranks, the
hidden GQA/MQA/MHA shapes (three of their four cases are ring) and the ring on sub-groups.
Kept: the all-gather variant (its own backward), the bytes, the message pattern, zig-zag
balance, the positions and the online-softmax merge.
"""

FILE = "ring_attention.py"
OLD = "            own_dk += home_k\n            own_dv += home_v\n"
NEW = "            pass  # planted bug: the dK/dV that travelled home are dropped\n"
LOST = {
    "test_context.py::test_ring_equals_full_attention_c2",
    "test_context.py::test_ring_equals_full_attention_c4",
    "test_context_hidden.py::test_gqa_mqa_mha_equal_full_attention",
    "test_context_hidden.py::test_ring_on_subgroups",
}
# The released stub scores 0: CPConfig ships complete, so test_config_validation is left
# out of rubric.toml.
STUB_PASSES: set[str] = set()
