"""Child side of the grading sandbox (started by :mod:`shardlab.grading.sandbox`).

``python -m shardlab.grading._runner supervise``
    reads the job's JSON configuration from stdin, applies the resource limits to itself
    (``resource.setrlimit``; children inherit them), starts the pytest process below, writes
    its pid to the private folder and waits for it. This extra process is what a submission
    sees as ``os.getppid()``: killing it does not touch the grader.

``python -m shardlab.grading._runner pytest``
    reads the same configuration from stdin and runs ``pytest.main`` with the JUnit report
    and the progress log pointed into the private folder. Neither path appears in the
    command line or the environment.

Only the standard library and pytest are imported here: the grader's own package is not
needed in the sandbox (beyond this file).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
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


def _become_subreaper() -> None:
    """Orphans of the sandbox (double-forked daemons) are re-parented here, not to init."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass


def supervise() -> int:
    raw = sys.stdin.read()
    config = json.loads(raw)
    _set_limits(config["limits"])
    _become_subreaper()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardlab.grading._runner", "pytest"],
        stdin=subprocess.PIPE,
        cwd=config["workdir"],
    )
    with open(os.path.join(config["private"], "pytest.pid"), "w") as fh:
        fh.write(str(proc.pid))
    proc.stdin.write(raw.encode())
    proc.stdin.close()
    code = proc.wait()
    code = code if code >= 0 else 128 - code
    with open(os.path.join(config["private"], "pytest.exit"), "w") as fh:
        fh.write(str(code))
    # Stay alive (as subreaper, reaping orphans) until the grader has frozen and killed the
    # tree: if this process exited now, a daemon still double-forking would end up under init.
    grader = os.getppid()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and os.getppid() == grader:
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    return code


class _ProgressLog:
    """pytest plugin: append one JSON line per collection/test event to a private file.

    Used only when pytest dies before writing its JUnit report (timeout, crash, ``os._exit``):
    it tells the grader which tests finished and which one was running.
    """

    def __init__(self, path: str, cuda: bool):
        self._fh = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
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
        f"--junitxml={config['junit']}",
        *config["pytest_args"],
        config["workdir"],
    ]
    plugin = _ProgressLog(config["progress"], bool(config["cuda"]))
    del config
    return int(pytest.main(args, plugins=[plugin]))


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "supervise":
        sys.exit(supervise())
    if mode == "pytest":
        sys.exit(run_pytest())
    sys.exit("usage: python -m shardlab.grading._runner supervise|pytest")
