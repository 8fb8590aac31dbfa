"""Supervise the running ranks of one launch: wait, stop, collect, and report failures.

:func:`_supervise` polls the ranks until all finished, one failed (plus a short grace period
for the others' reports) or the timeout passed; it then kills every process
(:func:`_kill_tree`: the ranks, their process groups, all descendants), prints the captured
output and returns the results or raises :class:`RankError`. On a timeout, :func:`_timeout`
asks every rank for its Python stacks (``faulthandler`` on SIGUSR1) before killing them and
raises :class:`LaunchTimeout` with the stacks.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import time

from shardlab.runtime._errors import LaunchTimeout, RankError
from shardlab.runtime._output import _print_outputs, _Progress, _read_output


def _kill_tree(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every rank, its process group and all descendants, then reap the ranks."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        psutil = None
    descendants = []
    if psutil is not None:
        for p in procs:
            try:
                descendants.extend(psutil.Process(p.pid).children(recursive=True))
            except psutil.Error:
                pass
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.kill()
            except ProcessLookupError:
                pass
        else:
            # the rank is gone but its group may still hold children
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for d in descendants:
        try:
            d.kill()
        except Exception:
            pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
    if psutil is not None:
        psutil.wait_procs(descendants, timeout=5)


def _load(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _supervise(procs, run_dir, nprocs, timeout, progress, quiet, outputs, progress_files):
    start = time.monotonic()
    deadline = start + timeout
    bar = _Progress(nprocs, timeout, progress_files) if progress else None
    first_failure_at = None
    grace = 1.0  # seconds to let other failing ranks write their reports
    interrupted = False
    try:
        while True:
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            if bar is not None:
                bar.draw(now - start, sum(c == 0 for c in codes))
            failed = [c is not None and c != 0 for c in codes]
            if any(failed) and first_failure_at is None:
                first_failure_at = now
            if all(c is not None for c in codes):
                break
            if first_failure_at is not None and now - first_failure_at > grace:
                break
            if now > deadline:
                return _timeout(procs, run_dir, nprocs, timeout, quiet, outputs)
            time.sleep(0.02)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        if bar is not None and not interrupted:
            bar.draw(time.monotonic() - start, sum(p.poll() == 0 for p in procs), final=True)
    stopped = {r for r, p in enumerate(procs) if p.poll() is None}
    _kill_tree(procs)
    outputs[:] = [_read_output(run_dir, r) for r in range(nprocs)]
    if not quiet:
        _print_outputs(outputs)
    codes = [p.returncode for p in procs]
    if all(c == 0 for c in codes):
        results = []
        for r in range(nprocs):
            path = os.path.join(run_dir, f"rank{r}.result")
            if not os.path.exists(path):
                raise RankError(
                    f"rank {r} exited normally but left no result (did the function call "
                    "sys.exit or os._exit(0)?).",
                    r,
                    {r: "exited without a result"},
                    outputs=outputs,
                )
            results.append(_load(path))
        return results
    return _raise_failure(run_dir, codes, stopped, outputs)


def _raise_failure(run_dir, codes, stopped, outputs):
    failures: dict[int, str] = {}
    info: dict[int, dict] = {}
    for r, code in enumerate(codes):
        err_path = os.path.join(run_dir, f"rank{r}.error")
        if os.path.exists(err_path):
            try:
                err = _load(err_path)
            except Exception:
                err = {"type": "Error", "message": "(unreadable report)", "traceback": ""}
                err.update(time=0.0, comm=False)
            info[r] = err
            failures[r] = f"raised {err['type']}: {err['message']}".strip()
        elif r in stopped or code == 0:
            continue  # still running when we stopped the run, or finished normally
        elif code < 0:
            info[r] = {"type": "signal", "comm": False, "time": 0.0, "traceback": ""}
            failures[r] = f"was killed by signal {_signal_name(code)}"
        elif code != 0:
            info[r] = {"type": "exit", "comm": False, "time": 0.0, "traceback": ""}
            failures[r] = (
                f"exited with code {code} without raising a Python exception "
                "(os._exit, sys.exit in native code, or a crash)"
            )
    if not failures:  # pragma: no cover - defensive
        failures = {r: f"exit code {c}" for r, c in enumerate(codes) if c}
        info = {r: {"comm": False, "traceback": ""} for r in failures}
    # primary: lowest rank among failures that are not consequences of a vanished peer
    order = sorted(failures, key=lambda r: (bool(info[r].get("comm")), r))
    primary = order[0]
    lines = [f"rank {primary} {failures[primary]}"]
    others = [r for r in order[1:]]
    if others:
        lines.append(
            "other ranks that failed: "
            + "; ".join(
                f"rank {r} {failures[r]}"
                + (" (likely because a peer stopped)" if info[r].get("comm") else "")
                for r in others
            )
        )
    tb = info[primary].get("traceback", "")
    if tb:
        lines.append(f"--- traceback of rank {primary} ---\n{tb.rstrip()}")
    raise RankError("\n".join(lines), primary, failures, tb, outputs)


def _timeout(procs, run_dir, nprocs, timeout, quiet, outputs):
    for p in procs:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    t_end = time.monotonic() + 3.0
    alive = [r for r, p in enumerate(procs) if p.poll() is None]
    while time.monotonic() < t_end:
        sizes = [_size(os.path.join(run_dir, f"rank{r}.stack")) for r in alive]
        if all(sizes):
            time.sleep(0.2)  # let the dump finish
            break
        time.sleep(0.05)
    stacks = {}
    for r in range(nprocs):
        try:
            with open(os.path.join(run_dir, f"rank{r}.stack"), errors="replace") as f:
                stacks[r] = _clean_stack(f.read())
        except OSError:
            stacks[r] = ""
    _kill_tree(procs)
    outputs[:] = [_read_output(run_dir, r) for r in range(nprocs)]
    if not quiet:
        _print_outputs(outputs)
    parts = [f"the run exceeded its timeout of {timeout:g} s; stacks of every rank at that moment:"]
    for r in range(nprocs):
        state = "" if stacks[r] else " (no stack: the rank had already exited or had not started)"
        parts.append(f"--- rank {r}{state} ---")
        if stacks[r]:
            parts.append(stacks[r])
    raise LaunchTimeout("\n".join(parts), stacks, outputs)


def _clean_stack(text: str) -> str:
    """Drop the launcher's own watchdog thread from a faulthandler dump."""
    blocks = [b for b in text.strip().split("\n\n") if "in _watch_parent" not in b]
    return "\n\n".join(blocks).strip()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
