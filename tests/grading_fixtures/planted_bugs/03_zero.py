"""Planted bug for labs/03_zero: ZeRO-1 all-gathers the updated pieces but never uses them.

The student issues the all-gather of the owners' weight pieces into ``recv`` and forgets to
copy ``recv`` back into the weight segments, as if ``all_gather_single`` wrote into the
weights. Every rank keeps stale copies of the parameters it does not own.

Lost (10 of 41 points): the tests that compare ZeRO-1's trained weights (single process on
2, 3 and 4 ranks; bitwise against PyTorch, which checks ZeRO-1 and ZeRO-2 in one test).
Kept: ZeRO-2, the owner assignment, and every byte count and peak (the same collectives run
with the same buffers; only the copy back is missing).
"""

FILE = "zero1.py"
OLD = (
    "        work.wait()\n"
    "        self.flat_weights.view(D, S)[:, lo:hi].copy_(recv.view(D, -1))\n"
)
NEW = (
    "        work.wait()\n"
    "        # planted bug: recv is never copied into the weight segments\n"
)
LOST = {
    "test_zero.py::test_zero1_matches_single_process",
    "test_zero.py::test_bitwise_equal_to_pytorch",
    "test_zero.py::test_four_ranks",
    "test_zero_hidden.py::test_zero1_three_ranks",
}
STUB_PASSES: set[str] = set()
