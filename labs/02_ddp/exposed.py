"""Exposed communication: the part of a rank's communication that no computation overlaps.

Nothing is sharded here and nothing is sent: this module reads a ``torch.profiler`` trace of
a DDP step (``shardlab train --layout ddp --profile DIR``), where each rank's collectives
appear as intervals on gloo's worker thread (``gloo:all_reduce``) and its forward, backward
and optimizer operators as intervals on the main thread. A collective that runs while the
rank computes costs the step nothing; the rest of it, the *exposed* communication, adds to
the step time one for one:

    exposed = | union(communication) \\ union(compute) |    (microseconds)

DDP's buckets are what hide it: with one bucket holding every gradient the all-reduce can
only start when backward has produced the last gradient, so all of it is exposed; with small
buckets the first all-reduces run during the rest of backward, and only the last bucket's
(and whatever the link cannot keep up with) is left. ``shardlab.runtime.trace_timeline``
computes the same figure for the book's timelines; this is the lab's own copy, to write.
"""

from __future__ import annotations

Interval = tuple[float, float]  # (start, end) in microseconds, start <= end


def exposed_us(comm: list[Interval], compute: list[Interval]) -> float:
    """Microseconds of ``comm`` that no interval of ``compute`` covers.

    Both lists may be unsorted and may overlap themselves (a rank's collectives overlap each
    other when several buckets are in flight; nested operators overlap their parents): time
    covered twice counts once. Empty intervals (``start == end``) count nothing. Raises
    ValueError, naming the interval, when one ends before it starts.
    """
    for name, spans in (("comm", comm), ("compute", compute)):
        for s, e in spans:
            if e < s:
                raise ValueError(f"{name} interval ({s}, {e}) ends before it starts")
    # BEGIN SOLUTION hint: sweep the time axis: every interval gives a start event (+1) and an end event (-1) of its kind; sort the events by time and walk them, counting the open comm and compute intervals; between two consecutive events, add the time when some comm and no compute interval is open
    events = sorted([(s, 1, 0) for s, _ in comm] + [(e, -1, 0) for _, e in comm]
                    + [(s, 1, 1) for s, _ in compute] + [(e, -1, 1) for _, e in compute])
    open_ = [0, 0]  # comm, compute intervals open since the previous event
    total, last = 0.0, None
    for t, step, kind in events:
        if last is not None and open_[0] > 0 and open_[1] == 0:
            total += t - last
        open_[kind] += step
        last = t
    return total
    # END SOLUTION
