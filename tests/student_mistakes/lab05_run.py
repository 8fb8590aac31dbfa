"""Rank entry point of the lab 05 mistake test: lab 05's own harness, with a student's
``_send`` that tags each message with the *sending* virtual stage instead of the receiving
one (``self._tag(backward, mb, k)`` for ``dest_k``), so no receive ever matches it."""

from __future__ import annotations

import pathlib
import sys

import torch.distributed as dist

LAB05 = pathlib.Path(__file__).resolve().parents[2] / "labs" / "05_pipeline"


def _send_wrong_tag(self, t, backward, mb, k):
    dest_k = k - 1 if backward else k + 1
    work = dist.isend(
        t, group=self.group, group_dst=dest_k % self.cfg.p, tag=self._tag(backward, mb, k)
    )  # the mistake: the tag of this stage, not of the receiving one
    self._pending.append((work, t))


def check(kind: str = "gpipe", m: int = 4):
    if str(LAB05) not in sys.path:
        sys.path.insert(0, str(LAB05))
    import _workers_pipeline as W
    import pipeline

    pipeline.PipelineExecutor._send = _send_wrong_tag  # this rank's process only
    return W.check_all("test", m, 2 * m, [(kind, 1)], trace=False)
