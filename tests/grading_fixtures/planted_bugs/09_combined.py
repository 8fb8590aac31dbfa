"""Planted bug for labs/09_combined: FSDP shards over the wrong mesh axis (tp instead of dp).

The student wraps the tensor-parallel GPT in FSDP on the *tp* group. Both groups have two
ranks on the 2x2 mesh, so nothing crashes: but FSDP's initial broadcast copies tp rank 0's
weight slice over tp rank 1's (the tp ranks hold *different* slices), the reduce-scatter
averages gradients of different slices, and no gradient is averaged across the data axis.
Every collective FSDP issues now runs on the tp axis.

Lost (9 of 24 points): the FSDP x TP equality with one process, its bytes per axis (the dp
axis carries nothing, the tp axis too much) and the comparison with FSDP2 + DTensor.
Kept: the state and peak (FSDP's shard sizes and schedule are unchanged), the groups, and
every DP x PP test.
"""

FILE = "combined.py"
OLD = '    dp_group = ag.group("dp")\n'
NEW = '    dp_group = ag.group("tp")  # planted bug: FSDP over the tensor-parallel axis\n'
LOST = {
    "test_combined.py::test_fsdp_tp_equals_one_process",
    "test_combined.py::test_fsdp_tp_bytes_per_axis_equal_accounting",
    "test_combined_hidden.py::test_equal_to_pytorch_fsdp2_and_dtensor",
}
# The released stub scores 0: the only test it passes (the mesh-axis checks) is not graded.
STUB_PASSES: set[str] = set()
