"""Planted bug for labs/01_collectives: the ring all-reduce averages instead of summing.

Only the tests that check all-reduce values lose points; reduce-scatter, all-gather, chunk,
the byte counts (the same messages are sent) and the point-to-point all-to-all keep theirs:
9 of 21 points lost.
"""

FILE = "collectives.py"
OLD = "    return ring_all_gather(ring_reduce_scatter(x, group), x.numel(), group)\n"
NEW = (
    "    out = ring_all_gather(ring_reduce_scatter(x, group), x.numel(), group)\n"
    "    return out / dist.get_world_size(group)  # planted bug: averages instead of summing\n"
)
LOST = {
    "test_collectives.py::test_ring_all_reduce",
    "test_collectives.py::test_all_reduce_uses_only_point_to_point",  # requires correct values
    "test_collectives_hidden.py::test_many_dtypes",
    "test_collectives_hidden.py::test_integer_sum_is_exact",
    "test_collectives_hidden.py::test_uneven_three_ranks",
    "test_collectives_hidden.py::test_group_argument",
}
# Tests the released stubs pass anyway: none. chunk_bounds ships complete to students,
# so its test is left out of the rubric (the grader ignores unlisted tests).
STUB_PASSES: set[str] = set()
