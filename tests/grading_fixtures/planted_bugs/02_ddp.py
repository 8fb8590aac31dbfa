"""Planted bug for labs/02_ddp: forgetting to average the gradients (sum instead of mean).

The student all-reduces (SUM) every gradient but never divides by D, in the per-parameter
path and in the bucket path alike, so every rank steps with D times the mean gradient.

Lost (15 of 31 points): every test that compares trained weights, with a single process, with
PyTorch's DDP, on 2, 3 and 4 ranks, per parameter, bucketed and under no_sync. AdamW is
nearly scale-invariant, but not quite: its eps makes a D-fold gradient move the small-gradient
parameters (attention qkv) by 190-740 times the tolerance, so the AdamW-only cases fail too.
Kept: bucketing, the model-state bytes, the bytes sent (the same all-reduces run) and the
peak memory (no tensor is added or removed).
In the bf16 recipe (test_ddp_mixed.py) only the bitwise comparison is lost (2 more points):
the doubled gradient moves the weights by eps-sized amounts, which the 2**-11 loss tolerance
(2-rank and 4-rank trajectories) does not see, and the bytes are unchanged.
"""

FILE = "ddp.py"
# the per-parameter path and the bucket path (_launch): the two places that divide by D
OLD = """\
            p.grad.div_(self.world_size)
            work = dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            self._handles.append((p, work))
            # END SOLUTION
            return
        b = self._bucket_of[id(p)]
        # BEGIN SOLUTION hint: make p.grad a view of its bucket slot (copy once); all_reduce the bucket async when full
        i = b.index[id(p)]
        view = b.views[i]
        if p.grad.data_ptr() != view.data_ptr():  # first gradient of this step: move it in
            view.copy_(p.grad)
            p.grad = view  # the autograd-made tensor is freed here
        if not self.require_sync:
            return  # later microbatches accumulate into the bucket in place
        b.ready.add(i)
        if len(b.ready) == len(b.params):
            self._launch(b)
        # END SOLUTION

    def _launch(self, b: _Bucket) -> None:
        # BEGIN SOLUTION hint: divide the flat buffer by D and start an async all_reduce
        b.buffer.div_(self.world_size)
"""
NEW = OLD.replace(
    "            p.grad.div_(self.world_size)\n",
    "            # planted bug: no p.grad.div_(self.world_size): summed, not averaged\n",
).replace(
    "        b.buffer.div_(self.world_size)\n",
    "        # planted bug: no b.buffer.div_(self.world_size): summed, not averaged\n",
)
LOST = {
    "test_ddp.py::test_matches_single_process",
    "test_ddp.py::test_no_sync_accumulation",
    "test_ddp.py::test_bitwise_equal_to_pytorch_ddp",
    "test_ddp.py::test_four_ranks",
    "test_ddp_hidden.py::test_three_ranks_match_single_process",
    "test_ddp_mixed.py::test_bitwise_ranks_and_single_process_microbatches",
}
# The released stub scores 0: DDPConfig validation and the DDP-is-a-Module check test code
# that ships complete and are left out of rubric.toml; make_buckets is a solution block.
STUB_PASSES: set[str] = set()
