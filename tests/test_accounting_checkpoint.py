"""accounting.checkpoint: shard-file bytes and resharding reads, against hand counts."""

import pytest
from shardlab.accounting import checkpoint as ck


def test_shard_numel_and_file_bytes():
    assert [ck.shard_numel(n, 4) for n in (1, 4, 5, 9)] == [1, 1, 2, 3]
    # flats of 5 and 8 elements on 4 ranks: slices of 2 and 2; weights + 2 AdamW moments
    assert ck.shard_file_bytes([5, 8], 4, 2) == (2 + 2) * 4 * 3
    assert ck.shard_file_bytes([5, 8], 4, 2, itemsize=2, rng_bytes=5056) == 4 * 2 * 3 + 5056
    assert ck.checkpoint_bytes([5, 8], 4, 1) == 4 * (2 + 2) * 4 * 2


def test_reshard_reads_whole_overlapping_slices():
    # 9 elements: old slices of 3 on 4 ranks ([0,3) [3,6) [6,9) [9,12) = padding only);
    # new slices of 5 on 2 ranks: [0,5) meets old 0, 1; [5,9) meets old 1, 2
    assert ck.reshard_read_bytes([9], 4, 2, 0, 0) == 6 * 4
    assert ck.reshard_read_bytes([9], 4, 2, 1, 0) == 6 * 4
    # one new rank reads every slice that holds data (not the padding-only one)
    assert ck.reshard_read_bytes([9], 4, 1, 0, 2, rng_bytes=10) == 9 * 4 * 3 + 10
    # same world: each rank reads exactly its own file
    assert ck.reshard_read_bytes([8, 6], 2, 2, 1, 2, rng_bytes=7) == ck.shard_file_bytes(
        [8, 6], 2, 2, rng_bytes=7
    )
    # a new rank with no data (more ranks than elements) reads only an RNG state
    assert ck.reshard_read_bytes([2], 1, 4, 3, 2, rng_bytes=7) == 7


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ck.shard_numel(0, 2), "numel=0"),
        (lambda: ck.shard_file_bytes([4], 0, 2), "world=0"),
        (lambda: ck.shard_file_bytes([4], 2, -1), "n_states=-1"),
        (lambda: ck.reshard_read_bytes([4], 2, 2, 2, 2), "rank=2 must be < new_world=2"),
    ],
)
def test_bad_input_names_the_value(call, match):
    with pytest.raises(ValueError, match=match):
        call()
