"""Planted bug for labs/05_pipeline: ZB-H1's deferred weight gradients are not accumulated.

``BW`` of every microbatch assigns its weight gradient to ``p.grad`` instead of adding it, so
after the step each weight holds only the gradient of the last microbatch (divided by m).
GPipe, 1F1B and interleaved use ``B`` (autograd accumulates for them) and stay correct; ZB-V
and DualPipe-V run ``BW`` too and lose with ZB-H1 (in the same tests).

Lost: every test that compares a ZB-H1 (or ZB-V / DualPipe-V) run with the single process (2
and 4 ranks, the full batch, the 3-rank uneven split and the 8-microbatch run of the hidden
tests).
Kept: the stage split, the action order, the boundary bytes, the activations in flight (BW
still frees what it should) and the failing-rank message.
"""

FILE = "pipeline.py"
OLD = "                p.grad = gp if p.grad is None else p.grad.add_(gp)  # accumulate microbatches\n"
NEW = "                p.grad = gp  # planted bug: the earlier microbatches' gradients are dropped\n"
LOST = {  # measured: make test-slow (tests/test_grading_reallabs.py -k 05_pipeline)
    "test_pipeline.py::test_equal_to_single_process",
    "test_pipeline.py::test_close_to_full_batch",
    "test_pipeline_hidden.py::test_three_uneven_stages_equal_single_process",
    "test_pipeline_hidden.py::test_four_chunks_and_eight_microbatches",
}
STUB_PASSES: set[str] = set()
