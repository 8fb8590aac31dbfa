"""Planted bug for labs/01_collectives: the ring all-reduce averages instead of summing.

Only the tests that check all-reduce values lose points; reduce-scatter, all-gather, chunk
bounds and the byte counts (the same messages are sent) keep theirs: 9.5 of 18.5 points.
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
# Tests the released stubs pass anyway: chunk_bounds ships complete to students.
STUB_PASSES = {"test_collectives.py::test_chunk_bounds_match_tensor_split"}
