"""Which form of reduce-scatter a lab issues for a bucket: the list form or the single tensor.

``torch.distributed`` offers two forms of the same reduce-scatter: the single-tensor form
(``reduce_scatter_tensor``, one contiguous ``(D c,)`` input) and the list form
(``reduce_scatter`` over ``D`` tensors). They carry the same sum, but gloo runs them
differently: the single form as one all-reduce of a copy of the input, the list form as ``D``
all-reduces, one per output piece (``torch.profiler`` shows ``D`` ``gloo:all_reduce`` events
per call). The wire bytes are the same (``shardlab.accounting.wire``); the list form pays ``D``
times the latency terms and saves the copy, and a caller whose pieces are not contiguous
(lab 03's owner-major ZeRO-1 rows) saves its own pack copy too. ``labs/03_zero/
benchmark_gloo_forms.py`` times both by bucket size and rank count; on NCCL the list form is
flattened into a copy by the backend, so there the single form is always the one to use.

Used by lab 03's ZeRO-1 and ZeRO-2 (``zero1.py``, ``zero2.py``), one rule for both.
"""

from __future__ import annotations

import torch.distributed as dist

# From a bucket of this many MB gloo's list reduce-scatter measured faster than the packed
# single one on 2 and on 4 ranks (benchmark_gloo_forms.py, two idle runs, 4 ranks: 2.1-2.3x
# its time at 1 MB, 1.1-1.2x at 8 MB, 0.66-0.84x at 16 MB, 0.59-0.66x at 25 MB; 2 ranks:
# 0.83-1.32x at 1 MB, 0.44-0.76x from 4 MB).
LIST_FORM_MIN_MB = 16.0


def list_form(chunk_bytes: int, group=None, min_mb: float = LIST_FORM_MIN_MB) -> bool:
    """Whether a reduce-scatter of ``chunk_bytes`` (all ``D`` pieces together) takes the list
    form: on gloo from ``min_mb`` up; below it, and on every other backend, the single form."""
    return dist.get_backend(group) == "gloo" and chunk_bytes >= min_mb * 2**20
