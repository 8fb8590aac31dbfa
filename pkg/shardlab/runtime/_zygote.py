"""A warm parent for ranks (internal): import torch once, fork one process per rank.

Why
    A spawned rank (``python -m shardlab.runtime._child``) pays for a new interpreter and
    ``import torch``, about 1.5 s of CPU per rank on a 2-core machine and most of a
    small launch — and a lab notebook or the test suite launches hundreds of times. On Linux,
    for gloo runs, :func:`shardlab.runtime.launch` therefore keeps one *zygote* per calling
    process: a child interpreter that imports ``torch`` and ``torch.distributed`` once and then
    ``fork()``\\ s a rank on request (what ``multiprocessing``'s forkserver with a preload does).
    A forked rank starts with torch imported, so a trivial 2-rank launch takes a fraction of
    a second instead of seconds (``tests/test_dist_zygote.py`` checks that ranks fork from it).

What a forked rank does
    It starts its own session, takes the environment, working directory, ``sys.path`` and
    output file the launcher computed for a spawned rank, forgets the zygote's import caches,
    and runs :func:`shardlab.runtime._child.main` — the same entry point, so results, errors,
    stack dumps on timeout and the parent watchdog behave the same. Its parent is the zygote;
    the zygote exits when the caller closes its pipe or dies, and the ranks' watchdog then
    sees their parent go. The zygote holds ``shardlab.runtime`` as it was when it started;
    when one of that package's files changes, the next launch starts a new zygote.

Protocol
    The caller writes length-prefixed pickled requests to the zygote's stdin; the zygote answers
    each with the rank's pid (4 bytes). The zygote reaps its children and writes each exit
    status, in ``subprocess.Popen``'s convention (negative: killed by that signal), to
    ``RUN_DIR/rank<R>.exit``; :class:`WarmRank` (a Popen look-alike for the supervisor) reads it.

Not used (every rank spawned fresh, as before): on CUDA/nccl — CUDA must never be initialised
before a fork and that path has not been exercised with one —, off Linux, when ``env`` names
a variable torch or OpenMP read at import time, and when ``SHARDLAB_WARM_START=0``.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time

# variables read when the process, glibc's allocator, torch or OpenMP start: a rank that needs
# other values than the zygote's must start fresh
IMPORT_TIME_PREFIXES = (
    "TORCH_", "PYTORCH_", "ATEN_", "OMP_", "MKL_", "KMP_", "CUDA_", "PYTHON", "LD_", "MALLOC_", "GLIBC_",
)


def usable(backend: str, env: dict | None) -> bool:
    """Whether a launch with this backend and extra ``env`` may fork its ranks from the zygote."""
    if sys.platform != "linux" or backend != "gloo":
        return False
    if os.environ.get("SHARDLAB_WARM_START", "1") == "0":
        return False
    names = [str(k) for k in env or ()]
    return not any(n.startswith(IMPORT_TIME_PREFIXES) for n in names if n != "OMP_NUM_THREADS")


# ---------------------------------------------------------------------------- caller side


class WarmRank:
    """The subset of ``subprocess.Popen`` the supervisor uses, for a rank forked by the zygote."""

    def __init__(self, pid: int, exit_path: str, zygote: subprocess.Popen):
        self.pid, self.returncode = pid, None
        self._exit_path, self._zygote = exit_path, zygote

    def poll(self):
        if self.returncode is None:
            try:
                with open(self._exit_path) as f:
                    self.returncode = int(f.read())
            except (FileNotFoundError, ValueError):
                if self._zygote.poll() is not None and not _exists(self.pid):
                    self.returncode = -signal.SIGKILL  # the zygote died before reaping it
        return self.returncode

    def wait(self, timeout: float | None = None):
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.005)
        return self.returncode

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    return True


_lock = threading.Lock()
_zygote: subprocess.Popen | None = None
_started = 0.0  # when it started (time.time())


def pid() -> int | None:
    """The running zygote's pid (it outlives every launch by design), or None."""
    z = _zygote
    return z.pid if z is not None and z.poll() is None else None


def _stale() -> bool:
    """True once a file of ``shardlab.runtime`` changed after the zygote started: the zygote
    holds these modules, so ranks would otherwise run the old code until the caller restarts."""
    folder = os.path.dirname(os.path.abspath(__file__))
    try:
        return any(
            os.stat(os.path.join(folder, f)).st_mtime > _started
            for f in os.listdir(folder)
            if f.endswith(".py")
        )
    except OSError:  # pragma: no cover
        return True


def _get() -> subprocess.Popen:
    global _zygote, _started
    if _zygote is not None and _zygote.poll() is None and _stale():
        _stop(_zygote)
    if _zygote is None or _zygote.poll() is not None:
        _started = time.time()
        _zygote = subprocess.Popen(
            [sys.executable, "-u", "-m", "shardlab.runtime._zygote", str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # a Ctrl-C in a terminal reaches the caller only
        )
    return _zygote


def start(run_dir: str, rank: int, env: dict, cwd: str, path: list[str], out: str):
    """Fork rank ``rank`` from the zygote; a :class:`WarmRank`, or None if the zygote failed
    (the caller then spawns the rank as a fresh interpreter)."""
    req = pickle.dumps(dict(run_dir=run_dir, rank=rank, env=env, cwd=cwd, path=path, out=out))
    with _lock:
        z = _get()
        try:
            z.stdin.write(struct.pack("!I", len(req)) + req)
            z.stdin.flush()
            raw = z.stdout.read(4)
        except (BrokenPipeError, OSError, ValueError):
            raw = b""
        if len(raw) != 4:
            _stop(z)
            return None
    return WarmRank(struct.unpack("!i", raw)[0], os.path.join(run_dir, f"rank{rank}.exit"), z)


def _stop(z: subprocess.Popen) -> None:
    global _zygote
    try:
        z.kill()
        z.wait(timeout=5)
    except Exception:  # pragma: no cover
        pass
    _zygote = None


# ---------------------------------------------------------------------------- zygote side


def _run_rank(req: dict, zygote_pid: int) -> None:
    """In the forked child: become the rank a spawn would have started, then run it."""
    code = 1
    try:
        os.setsid()
        fd = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(req["cwd"])
        env = dict(req["env"], SHARDLAB_PARENT_PID=str(zygote_pid))  # the watchdog's parent
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = list(dict.fromkeys([req["cwd"], *req["path"], *sys.path[1:]]))
        import importlib

        importlib.invalidate_caches()  # files written since the zygote started must be found
        sys.argv = ["shardlab.runtime._child", req["run_dir"], str(req["rank"])]
        from shardlab.runtime import _child

        code = _child.main(req["run_dir"], req["rank"])  # ends with os._exit
    except BaseException:  # noqa: BLE001 - report on the rank's output, then exit
        import traceback

        traceback.print_exc()
    os._exit(code or 1)


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        path = children.pop(pid, None)
        if path is None:
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        try:
            with open(path + ".tmp", "w") as f:
                f.write(str(code))
            os.replace(path + ".tmp", path)
        except OSError:  # the launch is over and its folder removed
            pass


def serve(caller: int) -> None:
    import torch  # noqa: F401 - the point of the zygote: every rank forks with it loaded
    import torch.distributed  # noqa: F401

    try:  # CommTrace/MemoryTrace's dispatch modes and functional collectives import it in a
        import torch._dynamo  # noqa: F401 - rank: 1.5-3.5 s of CPU each time
    except Exception:  # pragma: no cover - optional; ranks import it themselves if needed
        pass

    from shardlab.runtime import _child  # noqa: F401

    # the protocol moves off fds 0/1, so a forked rank's output can take them
    rfd, wfd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    children: dict[int, str] = {}
    buf, me = b"", os.getpid()
    while os.getppid() == caller:
        ready, _, _ = select.select([rfd], [], [], 0.01)
        _reap(children)
        if not ready:
            continue
        data = os.read(rfd, 1 << 16)
        if not data:
            break  # the caller closed the pipe
        buf += data
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack("!I", buf[:4])[0]:
            n = struct.unpack("!I", buf[:4])[0]
            req, buf = pickle.loads(buf[4 : 4 + n]), buf[4 + n :]
            pid = os.fork()
            if pid == 0:
                os.close(rfd)
                os.close(wfd)
                _run_rank(req, me)
            children[pid] = os.path.join(req["run_dir"], f"rank{req['rank']}.exit")
            os.write(wfd, struct.pack("!i", pid))
    os._exit(0)  # the ranks see their parent go and exit (their watchdog)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
