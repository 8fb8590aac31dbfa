"""Planted bug for labs/04_fsdp, HSDP only: the replica all-reduce runs on the wrong group.

``FlatParam.reduce_replicas`` must sum the R replicas' copies of *this* shard across the
``replicate`` group (the ranks that hold the same slice). The bug all-reduces across the shard
group instead: the ranks that hold *different* slices of one replica. The shapes agree (every
slice has ``shard_numel`` elements), so nothing raises; each rank ends up with the sum of two
unrelated slices divided by R, and the replicas never agree. It is the classic HSDP mistake on
a 2-D mesh -- the two axes swapped -- and plain FSDP (no replicate group) never runs this code.

Lost (6 of 10 HSDP points; every other test of the lab is untouched, measured): the three
tests that compare trained weights -- with one process, bitwise (plain and with
accumulation), and with FSDP2's HSDP. Kept: the state per rank (the bug moves no state) and
the two byte tests, which file a collective under an axis by its kind (gathers and
reduce-scatters: shard; all-reduces: replicate) and check its group's size -- on a 2 x 2 mesh
both groups have 2 ranks, so the same bytes cross the wire, on the wrong ranks.
"""

FILE = "fsdp_units.py"
OLD = "        dist.all_reduce(self.shard.grad, group=self.replicate)\n"
NEW = "        dist.all_reduce(self.shard.grad, group=self.group)  # planted bug: the shard axis\n"
LOST = {
    "test_fsdp_hsdp.py::test_hsdp_bitwise_equal_to_reference",
    "test_fsdp_hsdp_hidden.py::test_hsdp_accumulation_and_models_bitwise",
    "test_fsdp_hsdp_hidden.py::test_hsdp_equal_to_pytorch_fsdp2",
}
STUB_PASSES: set[str] = set()
