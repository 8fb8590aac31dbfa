"""Planted bug for labs/04_fsdp, HSDP only: the replica all-reduce runs on the wrong group.

``FlatParam.reduce_replicas`` must sum the R replicas' copies of *this* shard across the
``replicate`` group (the ranks that hold the same slice). The bug all-reduces across the shard
group instead: the ranks that hold *different* slices of one replica. The shapes agree (every
slice has ``shard_numel`` elements), so nothing raises; each rank ends up with the sum of two
unrelated slices divided by R, and the replicas never agree. It is the classic HSDP mistake on
a 2-D mesh -- the two axes swapped -- and plain FSDP (no replicate group) never runs this code.

Lost (6 of 10 HSDP points; every other test of the lab is untouched): the three tests that
compare trained weights (one process, bitwise; FSDP2 HSDP), and the two byte tests, which see
the all-reduce's bytes on the shard axis and none on the replicate axis. Kept: the state per
rank (the bug moves no state).
"""

FILE = "fsdp_units.py"
OLD = "        dist.all_reduce(self.shard.grad, group=self.replicate)\n"
NEW = "        dist.all_reduce(self.shard.grad, group=self.group)  # planted bug: the shard axis\n"
LOST = None  # measured below by test_real_lab_grading_extra_bug
STUB_PASSES: set[str] = set()
