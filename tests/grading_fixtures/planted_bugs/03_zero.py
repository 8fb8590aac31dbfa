"""Planted bug for labs/03_zero: ZeRO-1 all-gathers the updated pieces into the wrong rows.

The student lists the rows' views in reverse owner order, so the all-gather writes owner
``o``'s piece into row ``D-1-o``: every rank holds the same weights (the ranks still agree bit
for bit), but not the trained ones.

Lost (10 of 41 points): the tests that compare ZeRO-1's trained weights (single process on
2, 3 and 4 ranks; bitwise against PyTorch, which checks ZeRO-1 and ZeRO-2 in one test).
Kept: ZeRO-2, the owner assignment, and every byte count and peak (the same collectives run
with the same buffers; only the rows are swapped).
"""

FILE = "zero1.py"
OLD = "        pieces = [weights[o, lo:hi] for o in range(D)]  # written in place: no copy-in\n"
NEW = (
    "        pieces = [weights[o, lo:hi] for o in reversed(range(D))]  # planted bug: wrong rows\n"
)
LOST = {
    "test_zero.py::test_zero1_matches_single_process",
    "test_zero.py::test_bitwise_equal_to_pytorch",
    "test_zero.py::test_four_ranks",
    "test_zero_hidden.py::test_zero1_three_ranks",
}
STUB_PASSES: set[str] = set()
