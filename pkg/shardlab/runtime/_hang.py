"""Caller side of hang detection (internal): recognise a deadlock from the ranks' reports.

Every rank's watcher (:mod:`shardlab.runtime._commwatch`) writes ``RUN_DIR/rank<R>.comm``:
the ``torch.distributed`` call its main thread is in, the messages it has in flight (operation,
peer, tag, bytes), where in the user's code it waits, and for how long nothing moved.
:class:`HangWatch` reads those files while the launcher waits. When every rank still running
has been blocked in communication and no rank wrote a byte to its sockets for ``warn_after``
seconds, it prints one line on stderr saying so; after ``end_after`` seconds it returns the
summary and the launcher stops the run with :class:`~shardlab.runtime.LaunchDeadlock`.

The summary names each rank's wait and the likely mistake, e.g. ``rank 0 blocked in send to
1 (at ring.py:22 in ring_reduce_scatter), rank 1 blocked in send to 0 (...) for 10 s: both
ranks send first — a deadlock``. :func:`diagnose` knows five patterns: every rank sends
first; a receive whose peer sends the same message with another tag; a receive from a peer
that sends to someone else (a wrong ring neighbour); a receive from a rank that already
returned; ranks in different collective calls.
"""

from __future__ import annotations

import json
import os
import sys
import time

_READ_EVERY = 0.5  # seconds between two reads of the ranks' files
_FRESH = 3.0  # a report older than this (the rank holds the GIL in C code) is not "blocked"


def _read(run_dir: str, rank: int) -> dict | None:
    try:
        with open(os.path.join(run_dir, f"rank{rank}.comm")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _msg(e: dict, tags: bool) -> str:
    """``send to 1``, ``irecv from 0 (tag 3)``."""
    to = "to" if e["op"] in ("send", "isend") else "from"
    peer = "any rank" if e.get("peer") is None else f"{e['peer']}"
    return f"{e['op']} {to} {peer}" + (f" (tag {e.get('tag')})" if tags else "")


def describe(rank: int, st: dict, tags: bool) -> str:
    """One rank's wait in words: ``rank 0 blocked in send to 1 (at f.py:3 in g)``."""
    if st.get("exit_barrier"):
        return f"rank {rank} returned and waits for the other ranks to finish"
    pending = st.get("pending") or []
    call = st.get("call") or {}
    blocking = [e for e in pending if e["op"] in ("send", "recv")]
    if blocking:
        what = "blocked in " + _msg(blocking[0], tags)
    elif pending:
        more = f" (and {len(pending) - 4} more)" if len(pending) > 4 else ""
        what = "blocked waiting for " + ", ".join(_msg(e, tags) for e in pending[:4]) + more
    else:
        what = f"blocked in {call.get('fn', 'a torch.distributed call')}"
    where = f" (at {st['where']})" if st.get("where") else ""
    return f"rank {rank} {what}{where}"


def _sends(st: dict, include_history: bool = True) -> list[dict]:
    items = list(st.get("pending") or [])
    if include_history:
        items += st.get("history") or []
    return [e for e in items if e["op"] in ("send", "isend")]


def diagnose(states: dict[int, dict]) -> str:
    """The likely mistake behind a hang of these ranks (every one of them blocked)."""
    active = {r: s for r, s in states.items() if not s.get("exit_barrier")}
    pend = {r: s.get("pending") or [] for r, s in active.items()}
    recvs = [(r, e) for r, es in pend.items() for e in es if e["op"] in ("recv", "irecv")]
    if active and not recvs and all(pend.values()):
        who = "both ranks send" if len(states) == 2 else "every rank sends"
        return (
            f"{who} first — a deadlock (a send waits until its receiver posts the receive; "
            "post both with isend and irecv, then wait)"
        )
    for r, e in recvs:
        p = e.get("peer")
        if p is None or p not in states:
            continue
        peer = states[p]
        to_me = [s for s in _sends(peer) if s.get("peer") == r]
        want = sorted({x.get("tag") for q, x in recvs if q == r and x.get("peer") == p})
        sent = sorted({s.get("tag") for s in _sends(peer, False) if s.get("peer") == r})
        if sent and not set(sent) & set(want):
            return (
                f"the message tags differ: rank {r} waits for rank {p}'s messages with "
                f"{_list('tag', want)}, rank {p}'s messages to rank {r} carry "
                f"{_list('tag', sent)} "
                "(a receive only matches a send with the same tag)"
            )
        if to_me:
            continue
        if peer.get("exit_barrier"):
            return f"rank {r} waits for a message from rank {p}, which returned without sending it"
        elsewhere = sorted({s.get("peer") for s in _sends(peer)} - {None, r})
        if elsewhere:
            to = ", ".join(str(q) for q in elsewhere)
            return (
                f"rank {r} waits for a message from rank {p}, but rank {p} sends to rank {to} — "
                "a wrong peer (in a ring, send to the right neighbour (r+1) % D and receive "
                "from the left one (r-1) % D)"
            )
    sends = [e for es in pend.values() for e in es if e["op"] in ("send", "isend")]
    if recvs and not sends and len(recvs) >= len(active):
        return (
            "every rank waits to receive and none is sending — a deadlock (a send is missing, "
            "or comes after a receive that waits for the other rank's send)"
        )
    calls = {r: (s.get("call") or {}).get("fn") for r, s in active.items() if not pend.get(r)}
    if len(set(calls.values())) > 1 or (calls and recvs):
        parts = ", ".join(f"rank {r} in {fn}" for r, fn in sorted(calls.items()))
        return (
            f"the ranks are in different calls ({parts}) — every rank must make the same "
            "collective calls in the same order"
        )
    return "every rank waits for another — a deadlock"


def _list(word: str, items) -> str:
    """``tag 3`` or ``tags 2, 6``."""
    return f"{word}{'s' if len(items) > 1 else ''} " + ", ".join(str(i) for i in items)


class HangWatch:
    """Reads the ranks' reports while the launcher waits; see the module docstring."""

    def __init__(self, run_dir: str, nprocs: int, warn_after: float, end_after: float | None):
        self.run_dir, self.nprocs = run_dir, nprocs
        self.warn_after, self.end_after = warn_after, end_after
        self.next_read = 0.0
        self.bytes: tuple | None = None
        self.moved_at = 0.0
        self.warned = False
        self.summary = ""

    def check(self, alive: list[int]) -> str | None:
        """The deadlock summary once the run should end, else None (prints the warning)."""
        now = time.monotonic()
        if now < self.next_read or not alive:
            return None
        self.next_read = now + _READ_EVERY
        wall = time.time()
        states = {r: _read(self.run_dir, r) for r in alive}
        if any(
            s is None or s.get("blocked_for", 0) <= 0 or wall - s.get("t", 0) > _FRESH
            for s in states.values()
        ):
            self.bytes, self.warned = None, False
            return None
        nbytes = tuple(s.get("bytes") for s in states.values())
        if nbytes != self.bytes:  # something moved on a socket: count from now
            first = self.bytes is None
            self.bytes, self.moved_at = nbytes, now
            if first:  # first sight of everybody blocked: trust their own clocks
                self.moved_at = now - min(s["blocked_for"] for s in states.values())
        stuck = min(now - self.moved_at, min(s["blocked_for"] for s in states.values()))
        if stuck < self.warn_after:
            return None
        self.summary = summarize(states, stuck)
        if self.end_after is not None and stuck >= self.end_after:
            return self.summary
        if not self.warned:
            self.warned = True
            end = (
                "" if self.end_after is None else f"; the run is stopped after {self.end_after:g} s"
            )
            sys.stderr.write(f"shardlab.launch: {self.summary}{end}\n")
            sys.stderr.flush()
        return None


def summarize(states: dict[int, dict], stuck: float) -> str:
    tags = any(e.get("tag") for s in states.values() for e in s.get("pending") or [])
    waits = ", ".join(describe(r, s, tags) for r, s in sorted(states.items()))
    return f"{waits} for {stuck:.0f} s: {diagnose(states)}"
