"""Run a function on N ranks from a notebook, a script or a test, and get every rank's result.

``launch(fn, nprocs, *args, **kwargs)`` starts ``nprocs`` fresh Python processes
(``python -m shardlab.dist._child``; never ``fork``), gives each the environment ``torchrun``
would give (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), initialises the default process group in each, calls ``fn(*args, **kwargs)``
there and returns the list of return values in rank order.

Why the function must live in a module
    Each rank is a new interpreter, so it has to *import* the function by name. A function
    typed into a notebook cell or defined in a script run as ``__main__`` has no importable
    name; put it in a ``.py`` file next to the notebook (the file's folder and the caller's
    working directory are put on the ranks' ``sys.path``) and pass the function object or the
    string ``"module:function"``.

Rendezvous
    The caller hosts a ``torch.distributed.TCPStore`` bound to port 0 (the OS picks a free
    port) for the whole launch; the ranks connect to it as clients and ``MASTER_PORT`` holds
    that port. Two launches at the same time therefore never share a port. Gloo connects its
    pairs on OS-chosen ports as well.

Backend and devices
    ``backend=None`` picks ``gloo`` on CPU and ``nccl`` (one GPU per rank,
    ``cuda:LOCAL_RANK``) when CUDA is available and ``nprocs`` is at most the device count.
    :func:`device` returns the rank's device. Each rank sets
    ``torch.set_num_threads(max(1, cores // nprocs))`` and ``OMP_NUM_THREADS`` accordingly.

Failures (no process survives any of them)
    * a rank raises: the others are stopped and :class:`RankError` names the rank that failed
      first (ranks that only failed because a peer vanished are listed as secondary) with its
      remote traceback;
    * the run exceeds ``timeout`` seconds: every rank's Python stack is dumped with
      ``faulthandler`` (SIGUSR1), then all are killed and :class:`LaunchTimeout` (a
      ``TimeoutError``) shows the stacks;
    * a rank dies from a signal or exits without raising (``os._exit``, a crash in native
      code): :class:`RankError` says so, e.g. "rank 1 was killed by signal SIGKILL".
    Each rank runs in its own session (process group); stopping a launch kills the group and
    every descendant found with ``psutil``. Ranks also exit by themselves if the caller dies.

Output
    Each rank's stdout and stderr (file-descriptor level, so C++ output too) go to a file;
    after the run they are printed with ``print`` in rank order, each line prefixed
    ``[rank r] ``. This keeps notebook output deterministic and visible under nbval (which
    does not capture a child's file descriptors). ``quiet=True`` suppresses it.
    ``progress=True`` draws a text progress bar on stderr; ranks may report their own
    progress with :func:`report_progress`.

Under ``torchrun``
    ``python -m shardlab.run module:function`` (see :mod:`shardlab.run`) calls the same
    function either through :func:`launch` or, when ``torchrun`` already set the environment,
    directly after :func:`init_from_env`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from typing import Any

__all__ = [
    "launch",
    "device",
    "RankError",
    "LaunchTimeout",
    "LaunchError",
    "report_progress",
    "init_from_env",
]

_PREFIX_RANK = "[rank {r}] "
_NOISE = ("[Gloo] Rank",)  # gloo's connection chatter at init; not part of the user's output


class LaunchError(RuntimeError):
    """Base class of launch failures."""


class RankError(LaunchError):
    """One or more ranks failed. ``rank`` is the rank reported first, ``failures`` maps every
    failed rank to a one-line reason, ``remote_traceback`` is the first rank's traceback text
    (empty when it died from a signal), ``outputs`` is every rank's captured output."""

    def __init__(self, message, rank, failures, remote_traceback="", outputs=None):
        super().__init__(message)
        self.rank = rank
        self.failures = failures
        self.remote_traceback = remote_traceback
        self.outputs = outputs or []


class LaunchTimeout(LaunchError, TimeoutError):
    """The run exceeded its timeout. ``stacks`` maps rank to the dumped Python stack text."""

    def __init__(self, message, stacks, outputs=None):
        super().__init__(message)
        self.stacks = stacks
        self.outputs = outputs or []


# ---------------------------------------------------------------------------- helpers (child side)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        return os.cpu_count() or 1


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def init_from_env(backend: str | None = None, timeout: float = 1800.0) -> None:
    """Initialise the default process group from torchrun-style environment variables.

    Used by ranks started by :func:`launch` (they join the caller's TCPStore) and by
    ``python -m shardlab.run`` under ``torchrun`` (plain ``env://``). Sets the thread count
    and, for nccl, the rank's CUDA device. Does nothing if a group already exists."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, _cores() // max(1, local_world)))
    if backend is None:
        backend = _auto_backend(local_world)
    os.environ["SHARDLAB_BACKEND"] = backend
    kwargs: dict[str, Any] = {"timeout": timedelta(seconds=timeout)}
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    if os.environ.get("SHARDLAB_STORE") == "client":
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world,
            is_master=False,
            timeout=timedelta(seconds=timeout),
        )
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, **kwargs)
    else:
        dist.init_process_group(
            backend, init_method="env://", rank=rank, world_size=world, **kwargs
        )


_init_process_group_from_env = init_from_env


def device():
    """This rank's ``torch.device``: ``cuda:LOCAL_RANK`` under nccl, else ``cpu``."""
    import torch

    backend = os.environ.get("SHARDLAB_BACKEND")
    if backend is None:
        try:
            import torch.distributed as dist

            backend = dist.get_backend() if dist.is_initialized() else "gloo"
        except Exception:
            backend = "gloo"
    if "nccl" in str(backend):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def report_progress(done: float, total: float = 1.0) -> None:
    """Tell the caller's progress bar how far this rank is (call from a rank; cheap no-op
    outside a ``launch(..., progress=True)``)."""
    path = os.environ.get("SHARDLAB_PROGRESS_FILE")
    if not path:
        return
    frac = 0.0 if total <= 0 else max(0.0, min(1.0, float(done) / float(total)))
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{frac:.6f}")
    os.replace(tmp, path)


def _auto_backend(nprocs: int) -> str:
    try:
        import torch

        if torch.cuda.is_available() and nprocs <= torch.cuda.device_count():
            return "nccl"
    except Exception:
        pass
    return "gloo"


# ---------------------------------------------------------------------------- caller side


def _locate(fn) -> tuple[str, str, str | None]:
    """Return (module, qualname, folder of the module file) for ``fn``."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(
                f"fn={fn!r} is not of the form 'module:function' (for example "
                "'collectives:worker'); pass the string with a colon or the function object."
            )
        module, qualname = fn.split(":", 1)
        if not module or not qualname:
            raise ValueError(f"fn={fn!r} needs both a module and a function name around ':'.")
        folder = None
        try:
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin and os.path.isfile(spec.origin):
                folder = os.path.dirname(os.path.abspath(spec.origin))
        except (ImportError, ValueError):
            pass
        return module, qualname, folder
    if not callable(fn):
        raise TypeError(f"fn must be a 'module:function' string or a function, got {fn!r}.")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", None))
    name = getattr(fn, "__name__", repr(fn))
    if module in (None, "__main__", "__mp_main__") or (module or "").startswith("__ipython"):
        raise ValueError(
            f"Function {name!r} is defined in __main__ (a notebook cell or the script being run), "
            "so the rank processes, which are fresh Python interpreters, cannot import it. "
            "Move it into a .py file next to the notebook (for example workers.py) and pass "
            f"workers.{name} or the string 'workers:{name}'."
        )
    if qualname is None or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"Function {name!r} (qualname {qualname!r}) is a lambda or is defined inside another "
            "function, so the rank processes cannot import it by name; define it at the top "
            f"level of module {module!r}."
        )
    folder = None
    mod = sys.modules.get(module)
    mfile = getattr(mod, "__file__", None) if mod is not None else None
    if mfile:
        folder = os.path.dirname(os.path.abspath(mfile))
        # a top-level module file: its folder must be on sys.path; a package: the folder above
        # the package root
        depth = module.count(".")
        for _ in range(depth):
            folder = os.path.dirname(folder)
    return module, qualname, folder


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


def _read_output(run_dir: str, rank: int) -> str:
    try:
        with open(os.path.join(run_dir, f"rank{rank}.out"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _print_outputs(outputs: list[str]) -> None:
    for r, text in enumerate(outputs):
        for line in text.splitlines():
            if line.startswith(_NOISE):
                continue
            print(_PREFIX_RANK.format(r=r) + line)
    sys.stdout.flush()


def _load(path: str):
    with open(path, "rb") as f:
        return pickle.load(f)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class _Progress:
    def __init__(self, nprocs: int, timeout: float, files: list[str]):
        self.nprocs, self.timeout, self.files = nprocs, timeout, files
        self.last = 0.0
        self.width = 30

    def draw(self, elapsed: float, finished: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < 0.5:
            return
        self.last = now
        fracs = []
        for f in self.files:
            try:
                with open(f) as fh:
                    fracs.append(float(fh.read() or 0.0))
            except (OSError, ValueError):
                fracs.append(0.0)
        frac = 1.0 if final else sum(fracs) / len(fracs)
        fill = int(round(frac * self.width))
        bar = "#" * fill + "-" * (self.width - fill)
        msg = f"\r[{bar}] {frac * 100:5.1f}%  ranks done {finished}/{self.nprocs}  {elapsed:6.1f}s"
        sys.stderr.write(msg + ("\n" if final else ""))
        sys.stderr.flush()


def launch(
    fn,
    nprocs: int,
    *args,
    backend: str | None = None,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
    progress: bool = False,
    quiet: bool = False,
    **kwargs,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` ranks and return the results in rank order.

    Parameters
    ----------
    fn: ``"module:function"`` or a top-level function of an importable module.
    nprocs: number of ranks (processes), at least 1.
    backend: ``"gloo"``, ``"nccl"`` or ``None`` (auto: nccl when CUDA is available and
        ``nprocs`` <= GPU count, else gloo).
    timeout: seconds for the whole run, startup included; on expiry the stacks are dumped
        and :class:`LaunchTimeout` is raised.
    env: extra environment variables for the ranks.
    progress: draw a text progress bar on stderr (ranks may call :func:`report_progress`).
    quiet: do not print the ranks' captured output.

    Keyword names ``backend``, ``timeout``, ``env``, ``progress`` and ``quiet`` belong to the
    launcher; pass an argument of the same name to ``fn`` positionally.
    """
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} must be a positive integer number of ranks.")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds.")
    if backend is not None and backend not in ("gloo", "nccl", "mpi", "ucc"):
        raise ValueError(f"backend={backend!r} is not one of 'gloo', 'nccl' (or None for auto).")
    module, qualname, folder = _locate(fn)
    try:
        blob = pickle.dumps((args, kwargs))
    except Exception as exc:
        raise TypeError(
            f"The arguments for {module}:{qualname} cannot be pickled to send them to the ranks "
            f"({exc}). Pass plain data, tensors, or objects of classes defined in a module."
        ) from None
    if backend is None:
        backend = _auto_backend(nprocs)

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, nprocs, is_master=True, wait_for_workers=False)
    port = store.port
    run_dir = tempfile.mkdtemp(prefix="shardlab-launch-")
    launch_id = uuid.uuid4().hex
    procs: list[subprocess.Popen] = []
    outputs: list[str] = []
    try:
        with open(os.path.join(run_dir, "payload.pkl"), "wb") as f:
            pickle.dump(
                {
                    "module": module,
                    "qualname": qualname,
                    "args": blob,
                    "backend": backend,
                    "pg_timeout": max(float(timeout), 30.0),
                },
                f,
            )
        cwd = os.getcwd()
        path_parts = [p for p in (folder, cwd) if p]
        old_pp = os.environ.get("PYTHONPATH")
        if old_pp:
            path_parts.append(old_pp)
        threads = max(1, _cores() // nprocs)
        progress_files = [os.path.join(run_dir, f"rank{r}.progress") for r in range(nprocs)]
        for r in range(nprocs):
            child_env = dict(os.environ)
            child_env.update(
                {
                    "RANK": str(r),
                    "WORLD_SIZE": str(nprocs),
                    "LOCAL_RANK": str(r),
                    "LOCAL_WORLD_SIZE": str(nprocs),
                    "GROUP_RANK": "0",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "OMP_NUM_THREADS": str(threads),
                    "PYTHONPATH": os.pathsep.join(dict.fromkeys(path_parts)),
                    "PYTHONUNBUFFERED": "1",
                    "SHARDLAB_STORE": "client",
                    "SHARDLAB_BACKEND": backend,
                    "SHARDLAB_LAUNCH_ID": launch_id,
                    "SHARDLAB_PARENT_PID": str(os.getpid()),
                    "SHARDLAB_PROGRESS_FILE": progress_files[r],
                }
            )
            child_env.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform == "linux" else "lo0")
            # keep the ranks quiet about the parent's pytest/nbval session
            child_env.pop("PYTEST_CURRENT_TEST", None)
            if env:
                child_env.update({str(k): str(v) for k, v in env.items()})
            out = open(os.path.join(run_dir, f"rank{r}.out"), "wb")  # noqa: SIM115
            try:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "shardlab.dist._child", run_dir, str(r)],
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=child_env,
                        cwd=cwd,
                        start_new_session=True,
                    )
                )
            finally:
                out.close()
        return _supervise(procs, run_dir, nprocs, timeout, progress, quiet, outputs, progress_files)
    finally:
        _kill_tree(procs)
        del store
        shutil.rmtree(run_dir, ignore_errors=True)


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
