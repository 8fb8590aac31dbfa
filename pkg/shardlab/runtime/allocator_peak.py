"""The CPU allocator's own peak during one profiled window (benchmarks of labs 02-03).

``MemoryTrace`` counts the tensors autograd and the lab's code hold; it cannot see buffers
that gloo allocates on its worker threads (a reduce-scatter or all-gather copies its whole
input there). ``torch.profiler`` with ``profile_memory=True`` records every (de)allocation of
the process, those threads included, so the benchmarks print both peaks side by side.
"""

from __future__ import annotations


def allocator_peak(prof, window: str = "measured") -> int:
    """Largest live bytes by the CPU allocator's count recorded by ``prof`` (all
    (de)allocations since the profiler started, gloo's worker threads included) while the
    ``record_function(window)`` block ran."""
    events = prof.profiler.kineto_results.events()
    (w,) = [e for e in events if e.name() == window]
    mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = sum(nbytes for t, nbytes in mem if t < w.start_ns())
    peak = live
    for t, nbytes in mem:
        if w.start_ns() <= t <= w.end_ns():
            live += nbytes
            peak = max(peak, live)
    return peak
