"""Issue 24: a submission cannot change the host's kernel settings, whoever runs the grader.

Before the fix, a grader running as root mapped the sandbox to host uid 0 and bubblewrap left
``/proc/sys`` writable: 213 of 246 non-namespaced sysctls opened for writing. The probes here
never write: they open each file for writing and close it at once (a sysctl acts on
``write()``, not on ``open()``), so a failing check cannot change a setting of the machine.
"""

from __future__ import annotations

import os

import pytest
from grading_fixtures.sandboxed import outcomes, probe_lines, run_in_sandbox
from shardlab.grading import Limits

LIMITS = Limits(timeout=60, tmp_mb=64)

PROBE = r'''
import os

def _writable(path):
    """Whether path opens for writing; closed again at once, nothing is ever written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    return True


def _files(top):
    for root, dirs, files in os.walk(top, followlinks=False):
        for name in files:
            yield os.path.join(root, name)


def test_proc_sys_refuses_writes():
    files = list(_files("/proc/sys"))
    open_w = [p for p in files if _writable(p)]
    access_w = [p for p in files if os.access(p, os.W_OK)]
    print("PROBE sys", len(files), len(open_w), len(access_w), flush=True)
    assert len(files) > 100
    assert open_w == [] and access_w == [], (open_w + access_w)[:10]


def test_other_host_writing_proc_files_refuse_writes():
    """/proc/sysrq-trigger, /proc/irq, /proc/bus, ... (everything but the processes' folders)."""
    tops = [
        os.path.join("/proc", n)
        for n in os.listdir("/proc")
        if not n.isdigit() and n not in ("self", "thread-self", "sys")
    ]
    files = []
    for top in tops:
        if os.path.isdir(top) and not os.path.islink(top):
            files += list(_files(top))
        elif os.path.isfile(top):
            files.append(top)
    open_w = [p for p in files if _writable(p)]
    print("PROBE proc", len(files), len(open_w), flush=True)
    assert "/proc/sysrq-trigger" in files or not os.path.exists("/proc/sysrq-trigger")
    assert open_w == [], open_w[:10]


def test_not_host_root():
    """Host uid 0 is not mapped into the sandbox: host-root files show as the overflow uid.

    (The sandbox's own ``uid_map`` is relative to its parent namespace, which bubblewrap's
    ``--disable-userns`` nests, so it cannot tell the host uid; ownership of /usr can.)
    """
    with open("/proc/sys/kernel/overflowuid") as fh:
        overflow = int(fh.read())
    owner = os.stat("/usr").st_uid
    print("PROBE uid", os.getuid(), owner, overflow, flush=True)
    assert owner == overflow
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_in_sandbox(tmp_path_factory.mktemp("host"), PROBE, LIMITS)


def test_proc_sys_read_only(run):
    got = outcomes(run)
    assert got.get("test_proc_sys_refuses_writes") == "passed", (
        probe_lines(run, "PROBE"),
        run.log_tail[-3000:],
    )


def test_other_proc_files_read_only(run):
    got = outcomes(run)
    assert got.get("test_other_host_writing_proc_files_refuse_writes") == "passed", (
        probe_lines(run, "PROBE"),
        run.log_tail[-3000:],
    )


def _unprivileged_problem() -> str:
    """'' when a root grader can start sandboxes as 'nobody' here, else why it cannot."""
    from pathlib import Path

    from shardlab.grading import sandbox
    from shardlab.grading._bwrap import _probe, sandbox_identity
    from shardlab.grading._jobs import require_bwrap

    package = Path(sandbox.__file__).resolve().parents[1]
    if sandbox_identity(require_bwrap(), package) is not None:
        return ""
    return _probe(require_bwrap(), package, (65534, 65534)) or "no user nobody"


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root grader could map to host root")
def test_root_grader_runs_the_sandbox_unprivileged(run):
    problem = _unprivileged_problem()
    if problem:  # e.g. the interpreter under /root (mode 700): /proc read-only is what holds
        pytest.skip(f"'nobody' cannot reach the Python environment here: {problem}")
    got = outcomes(run)
    assert got.get("test_not_host_root") == "passed", (
        probe_lines(run, "PROBE"),
        run.log_tail[-3000:],
    )
