"""Supervise the running ranks of one launch: wait, stop, collect, and report failures.

:func:`_supervise` polls the ranks until all finished, one failed (plus a short grace period
for the others' reports) or the timeout passed; it then kills every process
(:func:`_kill_tree`: the ranks, their process groups, all descendants), prints the captured
output and returns the results or raises :class:`RankError`. On a timeout, :func:`_timeout`
asks every rank for its Python stacks (``faulthandler`` on SIGUSR1) before killing them and
raises :class:`LaunchTimeout` with the stacks. While waiting, a :class:`~._hang.HangWatch`
reads what the ranks are blocked in; when all of them are stuck it ends the run the same way
with :class:`LaunchDeadlock`, whose first line says what each rank waits for and why.

A rank killed by a signal is reported with the backend's own reason, taken from its output
(gloo's ``what(): ... Received data size doesn't match expected size``), and where its main
thread was (the ``faulthandler`` dump at the abort).
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import time

from shardlab.runtime._errors import LaunchDeadlock, LaunchTimeout, RankError
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


def _supervise(
    procs, run_dir, nprocs, timeout, progress, quiet, outputs, progress_files, hang=None
):
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
            if hang is not None and first_failure_at is None:
                summary = hang.check([r for r, c in enumerate(codes) if c is None])
                if summary:
                    return _timeout(procs, run_dir, nprocs, timeout, quiet, outputs, summary)
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
            reason = _native_reason(outputs[r] if r < len(outputs) else "")
            if reason:
                failures[r] += f": {reason}"
            where = _main_thread_at(run_dir, r)
            if where:
                info[r]["traceback"] = f"Python stack of its main thread at the signal:\n{where}"
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
                f"rank {r} {_short(failures[r])}"
                + (" (likely because a peer stopped)" if info[r].get("comm") else "")
                for r in others
            )
        )
    tb = info[primary].get("traceback", "")
    if tb:
        lines.append(f"--- traceback of rank {primary} ---\n{tb.rstrip()}")
    raise RankError("\n".join(lines), primary, failures, tb, outputs)


def _timeout(procs, run_dir, nprocs, timeout, quiet, outputs, summary=""):
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
    if summary:
        parts = [summary, "stopped; stacks of every rank at that moment:"]
    else:
        parts = [
            f"the run exceeded its timeout of {timeout:g} s; stacks of every rank at that moment:"
        ]
    for r in range(nprocs):
        state = "" if stacks[r] else " (no stack: the rank had already exited or had not started)"
        parts.append(f"--- rank {r}{state} ---")
        if stacks[r]:
            parts.append(stacks[r])
    if summary:
        raise LaunchDeadlock("\n".join(parts), stacks, outputs, summary)
    raise LaunchTimeout("\n".join(parts), stacks, outputs)


def _clean_stack(text: str) -> str:
    """Drop the launcher's own threads (parent watchdog, communication watcher) from a
    ``faulthandler`` dump: a block whose innermost frame is one of theirs."""

    def ours(block: str) -> bool:
        frames = [ln for ln in block.splitlines() if ln.strip().startswith("File ")]
        return bool(frames) and ("in _watch_parent" in frames[0] or "_commwatch.py" in frames[0])

    blocks = [b for b in text.strip().split("\n\n") if not ours(b)]
    return "\n\n".join(blocks).strip()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


_WHAT = re.compile(r"what\(\):\s*(?:\[[^\]]*\]\s*)?(.+)")


def _native_reason(output: str) -> str:
    """The backend's own words for a native abort (the ``what():`` of a C++ exception),
    without its source location: ``op.preamble.length <= op.nbytes. 28 vs 24. Received data
    size doesn't match expected size. ...``."""
    for line in output.splitlines():
        m = _WHAT.search(line)
        if m:
            return m.group(1).strip()
    return ""


def _main_thread_at(run_dir: str, rank: int) -> str:
    """The main thread's frames from a ``faulthandler`` dump at a fatal signal, innermost
    first, without the launcher's own frames (empty when there is no dump)."""
    try:
        with open(os.path.join(run_dir, f"rank{rank}.stack"), errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    if "Fatal Python error" not in text:
        return ""
    for block in text.split("\n\n"):
        if "_child.py" in block and " in main" in block:  # the rank's main thread
            lines = [ln for ln in block.splitlines() if ln.strip().startswith("File ")]
            lines = [ln for ln in lines if "shardlab/runtime/" not in ln and "<frozen" not in ln]
            if lines:
                return "\n".join(lines[:6])
    return ""


def _short(reason: str, limit: int = 160) -> str:
    """A secondary rank's reason, cut to its first sentence or two."""
    reason = reason.split(" This is typically caused")[0]
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"
