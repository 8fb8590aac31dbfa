"""Run a function on N ranks from a notebook, a script or a test, and get every rank's result.

``launch(fn, nprocs, *args, **kwargs)`` starts ``nprocs`` Python processes (gloo on Linux:
forked from a warm interpreter that imported torch once, see ``_zygote``; otherwise fresh
``python -m shardlab.runtime._child`` interpreters — never a fork of the caller), gives each the environment ``torchrun``
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
    * every rank is blocked in communication with nothing moving for ``hang_timeout`` s
      (gloo): :class:`LaunchDeadlock` starts with each rank's wait and the likely mistake,
      "rank 0 blocked in send to 1 (...), rank 1 blocked in send to 0 (...) for 10 s: both
      ranks send first — a deadlock" (warned on stderr before; ``_commwatch``, ``_hang``);
    * the run exceeds ``timeout`` seconds: every rank's Python stack is dumped with
      ``faulthandler`` (SIGUSR1), then all are killed and :class:`LaunchTimeout` (a
      ``TimeoutError``) shows the stacks;
    * a rank dies from a signal or exits without raising (``os._exit``, a crash in native
      code): :class:`RankError` says so with the backend's own reason, e.g. "rank 0 was
      killed by signal SIGABRT: ... Received data size doesn't match expected size. ...".
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

Where the pieces live
    This module holds :func:`launch` (and re-exports :func:`device` and :func:`init_from_env`
    from ``_rank_env``: a rank's threads, group and device); the exceptions are in ``_errors``,
    naming and importing ``fn`` in ``_importable``, captured output and the progress bar in
    ``_output``, waiting, killing and stack dumps in ``_supervise``, the warm fork parent in
    ``_zygote``, and a rank's entry point in ``_child``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import uuid

from shardlab.runtime import _scratch, _zygote
from shardlab.runtime._errors import LaunchDeadlock, LaunchError, LaunchTimeout, RankError
from shardlab.runtime._hang import HangWatch
from shardlab.runtime._importable import _locate
from shardlab.runtime._output import report_progress
from shardlab.runtime._rank_env import _auto_backend, device, init_from_env, threads_per_rank
from shardlab.runtime._rank_env import _cores as _cores  # lab 05's workers import it from here
from shardlab.runtime._supervise import _kill_tree, _supervise

__all__ = [
    "launch",
    "device",
    "RankError",
    "LaunchTimeout",
    "LaunchDeadlock",
    "LaunchError",
    "report_progress",
    "init_from_env",
]


# ---------------------------------------------------------------------------- caller side


def launch(
    fn,
    nprocs: int,
    *args,
    backend: str | None = None,
    timeout: float = 120.0,
    hang_timeout: float | None = 10.0,
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
    hang_timeout: seconds all ranks may stay blocked in communication, nothing moving, before
        :class:`LaunchDeadlock` (gloo; ``None``: only ``timeout``); warned after a third.
    env: extra environment variables for the ranks.
    progress: draw a text progress bar on stderr (ranks may call :func:`report_progress`).
    quiet: do not print the ranks' captured output.

    Keyword names ``backend``, ``timeout``, ``hang_timeout``, ``env``, ``progress`` and
    ``quiet`` belong to the launcher; pass an argument of the same name to ``fn`` positionally.
    """
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r} must be a positive integer number of ranks.")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds.")
    if hang_timeout is not None and not (
        isinstance(hang_timeout, (int, float)) and hang_timeout > 0
    ):
        raise ValueError(
            f"hang_timeout={hang_timeout!r} must be a positive number of seconds or None."
        )
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
    run_dir = _scratch.make_run_dir()  # shardlab-launch-<pid>-*: swept once we are gone
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
        threads = threads_per_rank(nprocs)
        warm = _zygote.usable(backend, env)
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
            out_path = os.path.join(run_dir, f"rank{r}.out")
            if warm:  # fork from the process that already imported torch (_zygote)
                pythonpath = child_env["PYTHONPATH"].split(os.pathsep)
                proc = _zygote.start(run_dir, r, child_env, cwd, pythonpath, out_path)
                if proc is not None:
                    procs.append(proc)
                    continue
                warm = False  # the zygote failed: spawn this rank and the rest
            out = open(out_path, "wb")  # noqa: SIM115
            try:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "shardlab.runtime._child", run_dir, str(r)],
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
        hang = None
        if hang_timeout is not None and backend == "gloo":
            hang = HangWatch(run_dir, nprocs, min(3.0, hang_timeout / 3), hang_timeout)
        return _supervise(
            procs, run_dir, nprocs, timeout, progress, quiet, outputs, progress_files, hang
        )
    finally:
        _kill_tree(procs)
        del store
        shutil.rmtree(run_dir, ignore_errors=True)
