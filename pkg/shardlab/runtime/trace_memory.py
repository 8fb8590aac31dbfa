"""MemoryTrace: per-rank timeline of live tensor bytes by category, with phases and the peak.

Usage (inside a rank)::

    from shardlab.runtime import MemoryTrace, phase
    with MemoryTrace() as mt:
        mt.watch(model, optimizer)          # parameters, gradients, optimizer state
        with phase("forward"):
            loss = model(x, y)[1]
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            optimizer.step()
    tl = mt.timeline()                      # picklable MemoryTimeline, return it from the rank
    tl.peak, tl.peak_breakdown

Categories: ``parameters``, ``gradients``, ``optimizer``, ``activations`` (saved for backward),
``communication`` (buffers produced by collectives), ``other``.

How it counts (exact on CPU)
    The unit is the tensor *storage*: views share one storage and are counted once. A
    ``TorchDispatchMode`` sees every operator's inputs and outputs; the first time a storage is
    seen it is added to the live set with ``weakref.finalize`` on the ``UntypedStorage`` object
    (PyTorch keeps that Python object alive exactly as long as the storage), so the bytes leave
    the live set the moment the storage is freed. ``UntypedStorage.resize_`` is wrapped while a
    trace is active (FSDP2 frees and re-allocates all-gathered parameters that way).
    Storages that existed before the ``with`` block count from the first time an operator
    touches them, or from :meth:`MemoryTrace.tag` / :meth:`MemoryTrace.watch`.

How categories are assigned
    * ``tag(tensors, category)``: explicit, overrides anything (a tensor, a list, a module's
      parameters, a dict of tensors);
    * ``watch(model, optimizer)``: parameters now; each ``.grad`` when autograd accumulates it
      (post-accumulate-grad hooks); allocations during ``optimizer.step()`` and the optimizer's
      state tensors afterwards;
    * tensors saved for backward (``torch.autograd.graph.saved_tensors_hooks``) become
      ``activations``, outputs of ``c10d`` / functional collectives become ``communication``,
      and ``with mt.category(name):`` assigns every new storage created in the block;
    * everything else is ``other``. Automatic upgrades never demote: parameters > gradients >
      optimizer > communication > activations > other.

Limits
    Only storages seen by the mode or tagged are counted: memory held by C++ code that never
    passes through an operator on this thread (gloo's internal buffers, the CUDA caching
    allocator's slack, NCCL buffers, cuBLAS workspaces) is not. Tensors saved for backward
    under another ``saved_tensors_hooks`` context (non-reentrant activation checkpointing) are
    not relabelled. On CUDA the trace also records ``torch.cuda.memory_allocated`` and
    ``max_memory_allocated`` at every phase marker (which include the allocator's rounding) and
    can export a snapshot for https://pytorch.org/memory_viz (``cuda_snapshot="file.pickle"``).

    Measured blind spot (CPU, gloo, torch 2.13): tensors that ProcessGroupGloo allocates on its
    own worker threads are invisible to the thread-local mode (probably the temporaries of
    ``reduce_scatter_tensor`` / ``all_gather_into_tensor``; the gap appears only where those
    run, while ``all_reduce`` and ``broadcast`` work in place). At a peak that overlaps such a
    collective they are missing: in the lab benchmarks, compared with the CPU allocator's own
    count (``torch.profiler`` with ``profile_memory=True`` around model construction and two
    steps, whole-run peaks), 0.1-0.4 MB for
    FSDP (ours and FSDP2 alike) and 0-2 MB for the from-scratch ZeRO-1/2, none for DDP or
    PyTorch's DDP + ZeroRedundancyOptimizer (2 ranks; the amount depends on timing).
    Storages created before the ``with`` block are missed until first touched: start the trace
    before building/wrapping the model when buffers made at wrap time must count from the start.

Overhead
    Per operator (a Python call and a storage lookup for every input and output), so a step
    of many small operators slows down most and one of large operators hardly at all:
    ``OVERHEAD`` holds the ratio for a tiny and a medium GPT step.
"""

from __future__ import annotations

import contextlib
import threading
import time

from shardlab.runtime import _phase
from shardlab.runtime._memory_timeline import (
    CATEGORIES,
    MemoryTimeline,
    _inner_tensors,
    _LiveStorages,
)
from shardlab.runtime._phase import PhaseLabels, phase

__all__ = ["MemoryTrace", "MemoryTimeline", "CATEGORIES", "phase", "OVERHEAD"]

# Median step time with the trace over the time without, per model, in the setup of
# trace_comm.OVERHEAD (2 gloo ranks on a shared 2-core CPU, one DDP step of
# shardlab.models.GPT with n_layer=2); the comment is the range over repeated runs.
OVERHEAD: dict[str, float] = {
    "tiny d_model=64 seq_len=32 batch=8 (step ~24 ms)": 5.0,  # 4.6-10: load on shared cores
    "medium d_model=256 seq_len=128 batch=8 (step ~0.43 s)": 1.0,  # 0.98-1.00
}


def _iter_tensors(x):
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, torch.nn.Module):
        yield from x.parameters()
    elif isinstance(x, dict):
        for v in x.values():
            yield from _iter_tensors(v)
    elif isinstance(x, (list, tuple, set)) or hasattr(x, "__next__"):
        for v in x:
            yield from _iter_tensors(v)


_resize_lock = threading.Lock()
_resize_users: list = []
_orig_resize = None


def _patched_resize(self, size):
    out = _orig_resize(self, size)
    for tr in list(_resize_users):
        tr._resized(self)
    return out


class MemoryTrace(_LiveStorages, PhaseLabels):
    """Per-rank live-storage accounting; see the module docstring (the bookkeeping itself is
    in :mod:`shardlab.runtime._memory_timeline`)."""

    def __init__(self, cuda_snapshot: str | None = None, track_inputs: bool = True):
        super().__init__()
        self.cuda_snapshot = cuda_snapshot
        self.track_inputs = track_inputs
        self._cats: list[str] = []
        self._handles: list = []
        self._mode = None
        self._saved = None

    # ------------------------------------------------------------------ public API
    def tag(self, tensors, category: str) -> None:
        """Assign ``category`` to the storages of ``tensors`` (tensor, iterable, module, dict)."""
        if category not in CATEGORIES:
            raise ValueError(f"category={category!r} is not one of {', '.join(CATEGORIES)}.")
        for t in _iter_tensors(tensors):
            for inner in _inner_tensors(t):
                self._see(inner, category, force=True)

    def watch(self, model=None, optimizer=None) -> None:
        """Tag ``model``'s parameters now, its gradients when accumulated, and ``optimizer``'s
        allocations during ``step()`` and its state afterwards."""
        if model is not None:
            params = list(model.parameters()) if hasattr(model, "parameters") else list(model)
            self.tag(params, "parameters")
            for p in params:
                if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                    self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook))
                if p.grad is not None:
                    self._auto(p.grad, "gradients")
        if optimizer is not None:
            self._handles.append(optimizer.register_step_pre_hook(self._opt_pre))
            self._handles.append(optimizer.register_step_post_hook(self._opt_post))
            self._tag_opt_state(optimizer)

    @contextlib.contextmanager
    def category(self, name: str):
        """New storages created inside the block get category ``name``."""
        if name not in CATEGORIES:
            raise ValueError(f"category={name!r} is not one of {', '.join(CATEGORIES)}.")
        self._cats.append(name)
        try:
            yield self
        finally:
            self._cats.pop()

    # ------------------------------------------------------------------ context
    def __enter__(self):
        global _orig_resize
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        try:
            import torch.distributed as dist

            self.rank = dist.get_rank() if dist.is_initialized() else 0
        except Exception:
            self.rank = 0
        trace = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                trace._on_op(func, args, kwargs, out)
                return out

        self._t0 = time.perf_counter()
        self._closed = False
        self._cuda_on = False
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._cuda_on = True
            if self.cuda_snapshot:
                torch.cuda.memory._record_memory_history(max_entries=100_000)
        with _resize_lock:
            if _orig_resize is None:
                _orig_resize = torch.UntypedStorage.resize_
                torch.UntypedStorage.resize_ = _patched_resize
            _resize_users.append(self)
        self._saved = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)
        self._saved.__enter__()
        self._mode = _Mode()
        self._mode.__enter__()
        _phase.register(self)
        self._event()  # initial point
        return self

    def __exit__(self, *exc):
        global _orig_resize
        import torch

        _phase.unregister(self)
        self._mode.__exit__(*exc)
        self._saved.__exit__(*exc)
        self._mode = self._saved = None
        with _resize_lock:
            if self in _resize_users:
                _resize_users.remove(self)
            if not _resize_users and _orig_resize is not None:
                torch.UntypedStorage.resize_ = _orig_resize
                _orig_resize = None
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._sample_cuda("exit")
        if self._cuda_on and self.cuda_snapshot:
            try:
                torch.cuda.memory._dump_snapshot(self.cuda_snapshot)
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
        with self._lock:
            self._closed = True
            for entry in self._live.values():
                entry[2].detach()
        return False

    def __getstate__(self):
        raise TypeError("return mt.timeline() (a MemoryTimeline) from a rank, not the MemoryTrace")

    def _on_op(self, func, args, kwargs, out):
        import torch

        ns = func.namespace
        comm = ns == "c10d" or ns == "_c10d_functional"
        if self._cats:
            cat = self._cats[-1]
        else:
            cat = "communication" if comm else "other"
        if self.track_inputs or comm:
            for a in _walk(args):
                if isinstance(a, torch.Tensor):
                    for inner in _inner_tensors(a):
                        self._see(inner, "communication" if comm else "other", upgrade=comm)
        for o in _walk(out):
            if isinstance(o, torch.Tensor):
                for inner in _inner_tensors(o):
                    self._see(inner, cat, upgrade=True)

    def _pack(self, t):
        self._auto(t, "activations")
        # A detached alias (same storage and version counter, so counted the same): returning
        # ``t`` itself would, for a tensor an op saves from its own output (softmax, log-softmax,
        # attention), close a cycle node -> tensor -> grad_fn -> node that Python's collector
        # cannot see; backward without ``retain_graph`` breaks it, but a retained graph (the
        # zero-bubble BI/BW split of lab 05) would keep those activations alive for good.
        return t.detach()

    def _grad_hook(self, p):
        if p.grad is not None:
            self._auto(p.grad, "gradients")

    def _opt_pre(self, opt, args, kwargs):
        self._cats.append("optimizer")

    def _opt_post(self, opt, args, kwargs):
        if self._cats and self._cats[-1] == "optimizer":
            self._cats.pop()
        self._tag_opt_state(opt)

    def _tag_opt_state(self, opt):
        for st in opt.state.values():
            for v in st.values() if isinstance(st, dict) else ():
                if hasattr(v, "untyped_storage"):
                    self._auto(v, "optimizer")


def _walk(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _walk(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _walk(y)
    else:
        yield x
