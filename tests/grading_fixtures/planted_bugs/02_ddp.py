"""Planted bug for labs/02_ddp: forgetting to average gradients (per-parameter path).

Not yet measured: LOST is None, so tests/test_grading_reallabs.py skips this lab until it is
filled in from one run of ``shardlab grade`` (see book/instructors.md).
"""

FILE = "ddp.py"
OLD = "            p.grad.div_(self.world_size)\n"
NEW = "            pass  # planted bug: gradients are summed, not averaged\n"
LOST = None
STUB_PASSES: set[str] = set()
