"""Child side of the grading sandbox (started by :mod:`shardlab.grading.sandbox`).

``python -P .../shardlab/grading/_runner.py supervise``
    reads the job's JSON configuration from stdin, applies the resource limits to itself
    (``resource.setrlimit``; children inherit them), starts the pytest process below and
    waits for it, then writes ``{"exit": code, "survivors": n}`` to the *status* file
    descriptor it was handed. Inside bubblewrap it is PID 1 of the sandbox's PID namespace
    (``--as-pid-1``): no process of the submission can kill it (the kernel ignores SIGKILL
    sent to a namespace's init from inside), every orphan is re-parented to it, and when it
    exits the kernel kills whatever is left. Before exiting it kills the survivors itself and
    counts them. It is not dumpable, so no sandbox process can open its file descriptors
    through ``/proc``.
    Without bubblewrap (``--unsafe-no-sandbox``) it is a child subreaper in its own session
    and kills its session as soon as the grader (its parent) is gone, so it never outlives it.

``python -P .../shardlab/grading/_runner.py pytest``
    reads the same configuration from stdin and runs ``pytest.main`` with the JUnit report
    written to a file descriptor inherited from the grader (opened as ``/proc/self/fd/N``)
    and the progress log sent through a pipe to the supervisor, which appends it to the
    grader's file: neither report has a path inside the sandbox, and the progress log cannot
    be rewritten after the fact. The values the tests record for the grader
    (``shardlab.grading.outside``) go to a third inherited descriptor, named to this process
    only by ``SHARDLAB_OUTSIDE`` (``pid:fd``).

Only the standard library and pytest are imported here, and the file runs as a script
(``-P``: its folder is not put on ``sys.path``), so the grader's package is not imported.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time

NEEDS_GPU_REASON = "needs GPU (shardlab grader: no CUDA device on this machine)"


def _set_limits(limits: dict) -> None:
    for name, value in limits.items():
        if value is None:
            continue
        which = getattr(resource, name)
        soft = int(value)
        hard = soft + 5 if name == "RLIMIT_CPU" else soft
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _others() -> list[int]:
    """Pids of the namespace other than this process (we are its init: /proc shows only it)."""
    me = os.getpid()
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    if fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z":
                        pids.append(int(name))
            except OSError:
                continue
    return pids


def _kill_namespace() -> int:
    """As PID 1: SIGKILL every other process of the namespace; how many were alive."""
    survivors: set[int] = set()
    for _ in range(200):
        left = _others()
        if not left:
            break
        survivors.update(left)
        try:
            os.kill(-1, signal.SIGKILL)  # from init: every process of the namespace but us
        except ProcessLookupError:
            pass
        _reap()
        time.sleep(0.01)
    return len(survivors)


def supervise() -> int:
    raw = sys.stdin.read()
    config = json.loads(raw)
    status = os.fdopen(config["status_fd"], "w", buffering=1)
    _prctl(4, 0)  # PR_SET_DUMPABLE 0: /proc/<this>/fd is closed to the sandbox
    _set_limits(config["limits"])
    as_init = os.getpid() == 1
    if not as_init:
        _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: double-forked daemons come back here
    grader = os.getppid()
    # The progress log is written by this process, which never imports the submission:
    # pytest gets the write end of a pipe, and every byte it sends is appended to the log as
    # it arrives, so no record can be truncated or rewritten later (at exit, say).
    read_end, write_end = os.pipe()
    copier = threading.Thread(target=_copy, args=(read_end, config["progress_fd"]), daemon=True)
    copier.start()
    proc = subprocess.Popen(
        [sys.executable, "-P", os.path.abspath(__file__), "pytest"],
        stdin=subprocess.PIPE,
        cwd=config["workdir"],
        pass_fds=(config["junit_fd"], config["values_fd"], write_end),
    )
    os.close(config["junit_fd"])
    os.close(config["values_fd"])
    os.close(write_end)
    status.write(json.dumps({"pytest_pid": proc.pid}) + "\n")
    proc.stdin.write(json.dumps(dict(config, progress_fd=write_end)).encode())
    proc.stdin.close()
    while proc.poll() is None:
        if not as_init and os.getppid() != grader:
            os.killpg(0, signal.SIGKILL)  # the grader died: take the whole session with us
        if as_init:
            _reap_others(proc.pid)
        time.sleep(0.05)
    code = proc.returncode
    code = code if code >= 0 else 128 - code
    survivors = _kill_namespace() if as_init else 0
    copier.join(timeout=5 if as_init else 2)  # the pipe ends when its last writer is gone
    status.write(json.dumps({"exit": code, "survivors": survivors}) + "\n")
    status.close()
    if as_init:
        return code
    # Unsafe mode: stay alive (as subreaper, reaping orphans) until the grader has frozen and
    # killed the tree, or is gone; a daemon still double-forking would otherwise reach init.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and os.getppid() == grader:
        _reap()
        time.sleep(0.05)
    if os.getppid() != grader:
        os.killpg(0, signal.SIGKILL)
    return code


def _copy(src: int, dst: int) -> None:
    """Append everything read from ``src`` to ``dst`` until EOF; keep draining on a write
    error (a full disk or ``RLIMIT_FSIZE``), so the writer never blocks on a full pipe."""
    ok = True
    try:
        while chunk := os.read(src, 65536):
            while ok and chunk:
                try:
                    chunk = chunk[os.write(dst, chunk) :]
                except OSError:
                    ok = False
    except OSError:
        pass
    finally:
        os.close(src)


def _reap_others(keep: int) -> None:
    """Reap zombies re-parented to us, leaving pytest's own exit status for Popen."""
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (keep, os.getpid()):
            try:
                os.waitpid(int(name), os.WNOHANG)
            except (ChildProcessError, OSError):
                continue


class _ProgressLog:
    """pytest plugin: append one JSON line per collection/test event to a private file.

    Used only when pytest dies before writing its JUnit report (timeout, crash, ``os._exit``):
    it tells the grader which tests finished and which one was running.
    """

    def __init__(self, fd: int, cuda: bool):
        self._fh = os.fdopen(fd, "a", buffering=1, encoding="utf-8")
        self._cuda = cuda

    def _write(self, **record) -> None:
        try:
            self._fh.write(json.dumps(record) + "\n")
            self._fh.flush()
        except Exception:  # noqa: BLE001 - never let logging break the run
            pass

    def pytest_collectstart(self, collector):
        self._write(event="collect", path=str(getattr(collector, "path", "")))

    def pytest_collection_modifyitems(self, config, items):
        if self._cuda:
            return
        import pytest

        for item in items:
            if item.get_closest_marker("gpu") is not None:
                item.add_marker(pytest.mark.skip(reason=NEEDS_GPU_REASON))

    def pytest_collectreport(self, report):
        if report.failed:
            self._write(event="collecterror", nodeid=report.nodeid, message=_message(report)[:2000])

    def pytest_runtest_logstart(self, nodeid, location):
        self._write(event="start", nodeid=nodeid)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            self._write(
                event="result",
                nodeid=report.nodeid,
                when=report.when,
                outcome=report.outcome,
                message=_message(report)[:2000],
            )


def _message(report) -> str:
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # skip: (path, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    return str(longrepr).strip().splitlines()[-1] if str(longrepr).strip() else ""


def run_pytest() -> int:
    config = json.loads(sys.stdin.read())
    sys.stdin = open(os.devnull)  # noqa: SIM115
    import pytest

    args = [
        "-c",
        config["ini"],
        "--rootdir",
        config["workdir"],
        "-p",
        "no:cacheprovider",
        "-o",
        "junit_family=xunit2",
        "-o",
        "junit_logging=no",
        "--tb=short",
        "-q",
        f"--junitxml=/proc/self/fd/{config['junit_fd']}",
        *config["pytest_args"],
        config["workdir"],
    ]
    os.set_inheritable(config["junit_fd"], False)  # the submission's children do not get them
    os.set_inheritable(config["progress_fd"], False)
    os.set_inheritable(config["values_fd"], False)
    # shardlab.grading.outside.record writes here, from this process only (not the ranks)
    os.environ["SHARDLAB_OUTSIDE"] = f"{os.getpid()}:{config['values_fd']}"
    plugin = _ProgressLog(config["progress_fd"], bool(config["cuda"]))
    del config
    return int(pytest.main(args, plugins=[plugin]))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "supervise":
        sys.exit(supervise())
    if mode == "pytest":
        sys.exit(run_pytest())
    sys.exit("usage: python -P _runner.py supervise|pytest")
