"""Which form of a bucket's reduce-scatter and all-gather a lab issues on gloo.

The book counts lab 03's ZeRO traffic with the ring model: a reduce-scatter and an
all-gather of each bucket, ``V c`` each (``c = (D-1)/D``). gloo implements those two
collectives with more local work than they need (``torch.profiler`` and
``labs/03_zero/benchmark_gloo_forms.py``; CPU time per rank and wall time per call, 2 and 4
ranks, 0.25-25 MB):

* ``reduce_scatter_tensor`` runs an all-reduce of a *copy* of the input (``2 V c`` on the
  wire, ``accounting.wire``) and the list ``reduce_scatter`` runs ``D`` all-reduces, one per
  output piece, through copies as well; an in-place ``all_reduce`` of the same buffer sends
  exactly those ``2 V c`` bytes, with no copy. Measured 2026-12-07 at 25 MB: 13 ms CPU per
  rank against 28-30 ms on 2 ranks, 24 against 33-34 ms on 4; the ``D`` in-place
  all-reduces of separate row pieces (ZeRO-1's owner-major rows) 14 and 26 ms;
* ``all_gather`` / ``all_gather_into_tensor`` gather through a flat temporary (the single
  form twice); ``D`` in-place ``broadcast`` calls, each owner's piece from its owner, write
  the pieces where they are. Wire bytes per rank are the same: a binomial tree has ``D - 1``
  edges, so over the ``D`` roots every rank sends ``(D - 1)`` pieces of ``V / D`` bytes,
  ``V c``. Measured at 25 MB: 5 ms CPU against 17-18 ms on 2 ranks, 10 against 18-20 ms on 4.

So on gloo a bucket of at least ``min_mb`` (:data:`GLOO_FORM_MIN_MB`) takes the *gloo
forms*: the reduce-scatter as in-place all-reduces of the buffer (each rank then reads its
own piece: the other pieces' sums are not used), the all-gather as in-place broadcasts.
Smaller buckets (the labs' tests and notebooks) keep the reduce-scatter and all-gather the
book counts, where latency dominates and the in-place forms gained little or lost (4 ranks,
0.25-1 MB: ``D`` row all-reduces took 1.3-2.4x a single reduce-scatter). The measured bytes
the labs' tests compare with ``accounting.comm.step_volume`` are those of the ring-model
collectives; ``tests/test_zero_collective_forms.py`` holds the gloo forms to the same
weights and to the same wire bytes (``accounting.wire``). On NCCL, whose reduce-scatter and
all-gather are the ring algorithms themselves, the standard forms are always used.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

# From a bucket of this many MB the gloo forms: measured faster than both standard forms at
# 4 and 25 MB on 2 and 4 ranks; at 1 MB and below the row all-reduces lost on 4 ranks.
GLOO_FORM_MIN_MB = 16.0


def gloo_form(chunk_bytes: int, group=None, min_mb: float = GLOO_FORM_MIN_MB) -> bool:
    """Whether a bucket of ``chunk_bytes`` (all ``D`` pieces together) takes the gloo forms:
    on gloo from ``min_mb`` up; below it, and on every other backend, the standard ones."""
    return dist.get_backend(group) == "gloo" and chunk_bytes >= min_mb * 2**20


class Works:
    """Several async collectives waited for as one (``wait``, ``is_completed``)."""

    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)


def all_reduce_pieces(pieces: Sequence[torch.Tensor], group=None) -> Works:
    """The gloo form of a reduce-scatter of ``pieces`` (``D`` tensors, piece ``o`` for rank
    ``o``): every piece all-reduced (sum) in place, asynchronously; rank ``o`` then reads
    piece ``o``. A contiguous buffer should pass itself as one piece (one all-reduce)."""
    return Works([dist.all_reduce(p, group=group, async_op=True) for p in pieces])


def broadcast_pieces(pieces: Sequence[torch.Tensor], group=None) -> Works:
    """The gloo form of an all-gather into ``pieces`` (``D`` tensors, piece ``o`` owned by
    rank ``o`` of ``group``): each piece broadcast in place from its owner, asynchronously."""
    return Works([
        dist.broadcast(p, src=o if group is None else dist.get_global_rank(group, o),
                       group=group, async_op=True)
        for o, p in enumerate(pieces)
    ])
