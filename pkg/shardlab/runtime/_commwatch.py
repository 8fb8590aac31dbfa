"""Rank side of hang detection (internal): what this rank is waiting for, written where the
launcher can read it.

A rank started by :func:`shardlab.runtime.launch` calls :func:`start` after joining the
process group. Two things then happen in that rank:

* ``torch.distributed``'s point-to-point functions (``send``, ``recv``, ``isend``, ``irecv``)
  are replaced by thin recorders (:class:`_P2P`) that call the original and remember each
  message still in flight: the operation, the peer (a global rank), the tag and the bytes.
  A recorder compares equal to the function it wraps, so ``dist.P2POp`` and
  ``batch_isend_irecv`` accept it.
* a daemon thread looks at the main thread every ``_TICK`` seconds: its innermost Python
  frame, the ``torch.distributed`` call it is in (the outermost frame of that package, with
  its ``dst``/``src``/``tag`` arguments), the CPU time the main thread used and the bytes
  this process wrote to its TCP sockets (:mod:`shardlab.runtime.wire`). The main thread is
  *blocked in communication* when it is inside a ``torch.distributed`` call (or has messages
  in flight and stands on a line calling ``.wait(``), its frame has not moved and it used
  (almost) no CPU since the last change. The
  thread writes that state as JSON to ``RUN_DIR/rank<R>.comm``; the caller's
  :mod:`shardlab.runtime._hang` reads every rank's file and recognises a deadlock.

Nothing here runs outside a launched rank, and it never raises into the user's code.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import json
import linecache
import os
import sys
import threading
import time
import weakref

_TICK = 0.25  # seconds between two looks at the main thread
_IDLE_CPU = 0.05  # a main thread using less than this fraction of one core is waiting

_lock = threading.Lock()
_pending: dict[int, dict] = {}  # messages in flight, by sequence number
_history: collections.deque = collections.deque(maxlen=16)  # the last completed ones
_seq = itertools.count()


def _global_peer(group, peer, group_peer):
    import torch.distributed as dist

    if peer is None and group_peer is not None:
        try:
            return dist.get_global_rank(group, group_peer) if group is not None else group_peer
        except Exception:  # noqa: BLE001 - a description only
            return group_peer
    return peer


class _P2P:
    """``torch.distributed.<name>`` that records what it posts, then calls the original."""

    def __init__(self, name: str, orig):
        self.name, self.orig = name, orig
        self.sig = inspect.signature(orig)
        self.blocking = name in ("send", "recv")
        self.__doc__, self.__name__ = orig.__doc__, orig.__name__
        self.__wrapped__ = orig

    def __eq__(self, other):  # torch's own checks: ``op in [isend, irecv]``
        return other is self or other is self.orig

    def __hash__(self):
        return hash(self.orig)

    def __call__(self, *args, **kwargs):
        try:
            entry = self._describe(args, kwargs)
        except Exception:  # noqa: BLE001 - a bad call: let torch raise its own error
            return self.orig(*args, **kwargs)
        key = next(_seq)
        with _lock:
            _pending[key] = entry
        try:
            result = self.orig(*args, **kwargs)
        except BaseException:
            with _lock:
                _pending.pop(key, None)
            raise
        with _lock:
            if self.blocking or result is None:
                _done(key)
            else:
                # a weak reference: holding the Work would keep its tensors alive after the
                # user dropped them, and change every memory measurement of the rank
                entry["work"] = weakref.ref(result)
        return result

    def _describe(self, args, kwargs) -> dict:
        b = self.sig.bind(*args, **kwargs)
        a = b.arguments
        send = self.name in ("send", "isend")
        peer = _global_peer(
            a.get("group"),
            a.get("dst" if send else "src"),
            a.get("group_dst" if send else "group_src"),
        )
        t = a.get("tensor")
        nbytes = int(t.numel() * t.element_size()) if t is not None else 0
        return {
            "op": self.name,
            "peer": peer,
            "tag": int(a.get("tag", 0) or 0),
            "bytes": nbytes,
            "posted": time.time(),
        }


def _done(key: int) -> None:
    entry = _pending.pop(key, None)
    if entry is not None:
        entry.pop("work", None)
        entry["done"] = time.time()
        _history.append(entry)


def _install() -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name in ("send", "recv", "isend", "irecv"):
        orig = getattr(c10d, name)
        if isinstance(orig, _P2P):
            continue
        wrapper = _P2P(name, orig)
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is orig:
            setattr(dist, name, wrapper)


def _torch_call(frame) -> dict | None:
    """The outermost ``torch.distributed`` frame of the main thread's stack, described."""
    found = None
    f = frame
    while f is not None:
        path = f.f_code.co_filename.replace(os.sep, "/")
        if "/torch/distributed/" in path and f.f_code.co_name not in ("wrapper", "<lambda>"):
            found = f
        f = f.f_back
    if found is None:
        return None
    loc = found.f_locals
    out = {"fn": found.f_code.co_name}
    for k in ("dst", "src", "group_dst", "group_src", "tag"):
        v = loc.get(k)
        if isinstance(v, int):
            out[k] = v
    return out


def _user_frame(frame) -> str:
    """``file:line in function`` of the innermost frames outside torch and this package
    (up to three, innermost first: ``a.py:9 in _recv < a.py:31 in step``)."""
    out = []
    f = frame
    while f is not None and len(out) < 3:
        path = f.f_code.co_filename.replace(os.sep, "/")
        if "/torch/" not in path and "/shardlab/runtime/" not in path:
            out.append(f"{os.path.basename(path)}:{f.f_lineno} in {f.f_code.co_name}")
        elif out:
            break
        f = f.f_back
    return " < ".join(out)


def _on_wait_line(frame) -> bool:
    """True when the innermost Python frame is on a line calling ``.wait(`` (``req.wait()``:
    a ``Work``'s wait is a C method, so the caller's line is the innermost Python frame)."""
    if frame is None:
        return False
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
    return ".wait(" in line


def _socket_bytes() -> int | None:
    try:
        from shardlab.runtime import wire

        return wire.socket_bytes_written()
    except Exception:  # noqa: BLE001 - progress is optional
        return None


def _state(main_ident: int, clock, last: dict) -> dict:
    now = time.time()
    cpu = time.clock_gettime(clock) if clock is not None else None
    with _lock:
        for key, entry in list(_pending.items()):
            ref = entry.get("work")
            # never a strong reference from this thread (see _P2P.__call__): a message counts
            # as in flight while the user's code still holds its Work object
            if ref is not None and ref() is None:
                _done(key)
        pending = [{k: v for k, v in e.items() if k != "work"} for e in _pending.values()]
        history = list(_history)
    prev_cpu, prev_t = last.get("tick_cpu"), last.get("tick_t")
    last.update(tick_cpu=cpu, tick_t=now)
    if cpu is not None and prev_cpu is not None and (
        cpu - prev_cpu > _IDLE_CPU * max(now - prev_t, _TICK)
    ):
        # The main thread computed since the last look: it is not waiting, and its frames are
        # left alone. Holding a frame object from this thread would keep the locals of a
        # function that returns meanwhile alive (its tensors included) and change the rank's
        # memory measurements.
        last.update(where=None, since=now, cpu=cpu)
        return {"t": now, "pid": os.getpid(), "blocked_for": 0.0, "call": None, "where": "",
                "exit_barrier": False, "pending": pending, "history": history[-6:],
                "bytes": None}
    frame = sys._current_frames().get(main_ident)
    call = _torch_call(frame) if frame is not None else None
    user = _user_frame(frame) if frame is not None else ""
    where = (id(frame), frame.f_lasti if frame is not None else -1, len(pending))
    on_wait_line = bool(pending) and _on_wait_line(frame)
    del frame  # only plain values are kept (see above)
    if where != last.get("where"):
        last.update(where=where, since=now, cpu=cpu)
    idle = (
        cpu is None
        or last["cpu"] is None
        or (cpu - last["cpu"] <= _IDLE_CPU * max(now - last["since"], _TICK))
    )
    if not idle:  # computing inside one C call (a long matmul): not waiting
        last.update(since=now, cpu=cpu)
    # inside a torch.distributed call, or on a line that waits for a posted message (a rank
    # that sleeps or computes with a receive posted early is not waiting for anyone)
    waiting = (call is not None or on_wait_line) and idle
    return {
        "t": now,
        "pid": os.getpid(),
        "blocked_for": (now - last["since"]) if waiting else 0.0,
        "call": call,
        "where": user,
        # the launcher's own barrier after the function returned (no user frame on the stack)
        "exit_barrier": call is not None and call["fn"] == "barrier" and not user,
        "pending": pending,
        "history": history[-6:],
        "bytes": _socket_bytes() if waiting else None,  # only needed (and read) when stuck
    }


def _loop(path: str, main_ident: int) -> None:
    try:
        clock = time.pthread_getcpuclockid(main_ident)
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        clock = None
    last: dict = {}
    while True:
        time.sleep(_TICK)
        try:
            text = json.dumps(_state(main_ident, clock, last))
            with open(path + ".tmp", "w") as f:
                f.write(text)
            os.replace(path + ".tmp", path)
        except Exception:  # noqa: BLE001 - the watcher must never disturb the rank
            pass


def start(run_dir: str, rank: int) -> None:
    """Record point-to-point messages and report this rank's waits to ``rank<R>.comm``."""
    try:
        _install()
    except Exception:  # noqa: BLE001 - without recorders the frames still tell a lot
        pass
    ident = threading.main_thread().ident
    path = os.path.join(run_dir, f"rank{rank}.comm")
    threading.Thread(
        target=_loop, args=(path, ident), daemon=True, name="shardlab-commwatch"
    ).start()
