"""The bookkeeping behind :class:`~shardlab.runtime.trace_memory.MemoryTrace`.

:class:`_LiveStorages` keeps the live set (one entry per tensor storage: category, bytes,
``weakref.finalize``), the bytes per category after every event, the phase markers and the
peak; :class:`MemoryTimeline` is its picklable result. What is counted and how categories are
assigned is described in :mod:`shardlab.runtime.trace_memory`.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "communication", "other")
_RANK = {c: i for i, c in enumerate(reversed(CATEGORIES))}  # other=0 ... parameters=5


@dataclass
class MemoryTimeline:
    """Picklable result of a :class:`MemoryTrace` (one rank).

    ``bytes[c][i]``: live bytes of category ``c`` after event ``i``; ``times[i]`` seconds since
    the trace began; ``phases[i]`` the phase label at that event; ``markers``: list of
    ``(event index, phase name, "start"|"end")``; ``peak``: the largest total;
    ``peak_index``; ``peak_breakdown``: bytes per category at the peak; ``cuda``: list of
    dicts sampled at markers (empty on CPU)."""

    rank: int
    categories: tuple
    times: list = field(default_factory=list)
    bytes: dict = field(default_factory=dict)
    phases: list = field(default_factory=list)
    markers: list = field(default_factory=list)
    peak: int = 0
    peak_index: int = 0
    peak_breakdown: dict = field(default_factory=dict)
    cuda: list = field(default_factory=list)

    def total(self) -> list[int]:
        n = len(self.times)
        return [sum(self.bytes[c][i] for c in self.categories) for i in range(n)]

    def final(self) -> dict:
        return {c: (self.bytes[c][-1] if self.bytes[c] else 0) for c in self.categories}

    def phase_peak(self, name: str) -> int:
        """Largest total inside events labelled ``name`` (0 if none)."""
        tot = self.total()
        vals = [tot[i] for i, p in enumerate(self.phases) if p == name]
        return max(vals) if vals else 0


def _inner_tensors(t):
    """Plain tensors behind ``t`` (unwraps DTensor and other wrapper subclasses)."""
    import torch

    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return [t]
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None:
        try:
            names, _ = flatten()
            out = []
            for n in names:
                out.extend(_inner_tensors(getattr(t, n)))
            return out
        except Exception:
            return []
    return [t]


class _LiveStorages:
    """The live set of storages by category, the event timeline and the peak; the base of
    :class:`~shardlab.runtime.trace_memory.MemoryTrace`, which feeds it from a dispatch mode."""

    def __init__(self):
        self._lock = threading.RLock()
        self._live: dict[int, list] = {}  # key -> [category, nbytes, finalizer]
        self._totals = dict.fromkeys(CATEGORIES, 0)
        self._times: list[float] = []
        self._bytes = {c: [] for c in CATEGORIES}
        self._phase_at: list = []
        self._markers: list = []
        self._phases: list[str] = []
        self._cuda: list[dict] = []
        self._peak = 0
        self._peak_index = 0
        self._peak_breakdown = dict.fromkeys(CATEGORIES, 0)
        self._closed = False
        self._t0 = time.perf_counter()
        self.rank = 0

    def live_bytes(self, category: str | None = None) -> int:
        with self._lock:
            if category is None:
                return sum(self._totals.values())
            return self._totals[category]

    @property
    def peak(self) -> int:
        return self._peak

    @property
    def peak_breakdown(self) -> dict:
        return dict(self._peak_breakdown)

    def timeline(self) -> MemoryTimeline:
        with self._lock:
            return MemoryTimeline(
                rank=self.rank,
                categories=CATEGORIES,
                times=list(self._times),
                bytes={c: list(v) for c, v in self._bytes.items()},
                phases=list(self._phase_at),
                markers=list(self._markers),
                peak=self._peak,
                peak_index=self._peak_index,
                peak_breakdown=dict(self._peak_breakdown),
                cuda=list(self._cuda),
            )

    # ------------------------------------------------------------------ internals
    def _push_phase(self, name):
        self._phases.append(str(name))
        self._marker(str(name), "start")

    def _pop_phase(self):
        if self._phases:
            name = self._phases.pop()
            self._marker(name, "end")

    def _marker(self, name, kind):
        with self._lock:
            self._event()
            self._markers.append((len(self._times) - 1, name, kind))
        self._sample_cuda(f"{name}:{kind}")

    def _sample_cuda(self, label):
        if not getattr(self, "_cuda_on", False):
            return
        import torch

        self._cuda.append(
            {
                "label": label,
                "index": len(self._times) - 1,
                "allocated": int(torch.cuda.memory_allocated()),
                "max_allocated": int(torch.cuda.max_memory_allocated()),
            }
        )

    def _event(self):
        # caller holds the lock or is single-threaded
        self._times.append(time.perf_counter() - self._t0)
        for c in CATEGORIES:
            self._bytes[c].append(self._totals[c])
        self._phase_at.append(self._phases[-1] if self._phases else None)
        tot = sum(self._totals.values())
        if tot > self._peak:
            self._peak = tot
            self._peak_index = len(self._times) - 1
            self._peak_breakdown = dict(self._totals)

    def _storage(self, t):
        try:
            if t.device.type == "meta":
                return None
            s = t.untyped_storage()
        except Exception:
            return None
        return s

    def _see(self, t, category, force=False, upgrade=False):
        """Track ``t``'s storage. New: add with ``category``. Known: set (force) or upgrade."""
        s = self._storage(t)
        if s is None:
            return
        key = s._cdata
        nb = int(s.nbytes())
        with self._lock:
            if self._closed:
                return
            entry = self._live.get(key)
            if entry is None:
                if nb == 0 and not force:
                    return
                fin = weakref.finalize(s, self._freed, key)
                fin.atexit = False
                self._live[key] = [category, nb, fin]
                self._totals[category] += nb
                self._event()
                return
            changed = False
            if entry[1] != nb:
                self._totals[entry[0]] += nb - entry[1]
                entry[1] = nb
                changed = True
            if entry[0] != category and (force or (upgrade and _RANK[category] > _RANK[entry[0]])):
                self._totals[entry[0]] -= entry[1]
                self._totals[category] += entry[1]
                entry[0] = category
                changed = True
            if changed:
                self._event()

    def _auto(self, t, category):
        for inner in _inner_tensors(t):
            self._see(inner, category, upgrade=True)

    def _freed(self, key):
        with self._lock:
            if self._closed:
                return
            entry = self._live.pop(key, None)
            if entry is None:
                return
            self._totals[entry[0]] -= entry[1]
            self._event()

    def _resized(self, storage):
        key = storage._cdata
        with self._lock:
            entry = self._live.get(key)
            if entry is None or self._closed:
                return
            nb = int(storage.nbytes())
            if nb != entry[1]:
                self._totals[entry[0]] += nb - entry[1]
                entry[1] = nb
                self._event()
