"""Planted bug for labs/04_fsdp: the reduce-scattered gradient shard is not averaged.

The student waits for the reduce-scatter (a SUM over ranks) and stores the shard as the
gradient without dividing by D, so every shard is updated with D times the mean gradient.

Lost (13 of 28 points): every test that compares trained weights with a reference (the split
reference bitwise, the full batch, bf16 and fp16 with the same casts, one unit, FSDP2).
Kept: the unit layout, the gradient shapes, the bytes held and sent, the peaks, and the two
tests that compare our runs with each other (reshard/prefetch settings; no_sync against
syncing every microbatch): all of them carry the same factor D.

Checkpoint tests (checkpoint.py, 25 points) lose 7: the three that compare a run continued
after resharding with one process doing the new world's arithmetic (2 -> 1 public; 4 -> 2 and
2 -> 1 hidden), since the factor changes with D. Saving, restoring, bytes, refusals and the
SIGKILL test do not depend on the gradient's scale and are kept (measured by running the
checkpoint tests on the bugged lab).

The 16-byte recipe tests (test_fsdp_mixed.py and its hidden twin, 9 points) lose 2: the bitwise
comparison with one process. AdamW is nearly scale-invariant, so the doubled gradient moves the
weights by eps-sized amounts that the 2**-11 loss tolerance does not see; bytes are unchanged.

The HSDP tests (test_fsdp_hsdp.py and its hidden twin, 10 points) lose 6: the three that compare
trained weights (with one process, bitwise; with FSDP2 HSDP) -- the shard-axis sum is kept, so
every update is S = 2 times too large. Bytes per axis and the state per rank are kept.
"""

FILE = "fsdp_units.py"
OLD = "        out = out.div_(self.world).to(self.shard.dtype)  # sum over ranks -> mean\n"
NEW = (
    "        out = out.to(self.shard.dtype)  # planted bug: the sum over ranks is kept, not the mean\n"
)
LOST = {
    "test_fsdp.py::test_bitwise_equal_to_split_reference_on_2_ranks",
    "test_fsdp.py::test_close_to_full_batch",
    "test_fsdp.py::test_mixed_precision_matches_same_casts",
    "test_fsdp_hidden.py::test_equal_to_pytorch_fsdp2",
    "test_fsdp_hidden.py::test_fp16_and_single_unit",
    "test_checkpoint.py::test_continue_on_1_rank",
    "test_checkpoint_hidden.py::test_reshard_4_to_2",
    "test_checkpoint_hidden.py::test_reshard_2_to_1",
    "test_fsdp_mixed.py::test_bitwise_ranks_and_single_process_microbatches",
    "test_fsdp_hsdp.py::test_hsdp_bitwise_equal_to_reference",
    "test_fsdp_hsdp_hidden.py::test_hsdp_accumulation_and_models_bitwise",
    "test_fsdp_hsdp_hidden.py::test_hsdp_equal_to_pytorch_fsdp2",
}
# The released stubs score 0: FSDPConfig validation, padded_numel / blocks_policy and the
# tied-across-units check of build_units ship complete (the notebook uses them before any
# student code runs), so their tests are left out of rubric.toml.
STUB_PASSES: set[str] = set()
