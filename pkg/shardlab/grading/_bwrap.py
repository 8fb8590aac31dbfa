"""The bubblewrap command line of one grading sandbox.

What the sandbox sees (everything else of the machine is absent, not just unwritable):

* read-only: ``/usr`` (and ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as on the host), a few
  files of ``/etc`` that programs need to start (loader cache, passwd/group, hosts), the
  Python interpreter's folders, the virtual environment, and at ``/grade/pkg`` the copy of
  the ``shardlab`` package the grader took at start (not the live source tree);
* ``/grade/work``: a size-capped tmpfs holding, each mounted read-only, the instructor's
  files of *this* lab (public tests, ``hidden/`` tests, helpers) and the student's
  ``submit`` files; new files can be written next to them, up to the cap;
* ``/grade/pytest.ini`` (read-only), private size-capped ``/tmp`` and ``/dev/shm``, a new
  ``/proc`` and a minimal ``/dev``.

Namespaces: ``--unshare-all`` (user, IPC, PID, network, UTS, cgroup; ``--disable-userns``:
no nested user namespace, so no capability can be regained inside): no network beyond a
loopback interface (gloo ranks talk over it), no view of the host's processes.
``--die-with-parent`` and ``--as-pid-1`` (the supervisor is the namespace's init; when it
exits or is killed the kernel kills every process of the namespace), ``--new-session``
(no terminal injection), all capabilities dropped. The reports (JUnit, progress, status)
reach the grader through inherited file descriptors, so no host path is writable inside.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from pathlib import Path

from ._integrity import environment_roots

ETC_FILES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "hosts",
    "host.conf",
    "passwd",
    "group",
    "nsswitch.conf",
    "localtime",
    "alternatives",
)
WORK = "/grade/work"
INI = "/grade/pytest.ini"
PKG = "/grade/pkg"  # the grading copy of the shardlab package (PYTHONPATH)


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create a sandbox on this machine."""


UNSAFE_WARNING = (
    "--unsafe-no-sandbox: submissions run WITHOUT bubblewrap, as your user, with your view of "
    "the file system. A submission can read the reference solutions, every hidden test and "
    "the other students' submissions, use the network, write anywhere your user can (your "
    "labs, the virtual environment, --out), kill the grader, and leave a process that "
    "survives grading. Only rlimits, process/memory polling and file hashing remain. "
    "Use it only for code you trust."
)


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC_FILES:
        if os.path.lexists(f"/etc/{name}"):
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return args


def _python_binds() -> list[str]:
    roots = [Path(sys.prefix), Path(sys.base_prefix), *environment_roots()]
    roots.append(Path(os.path.realpath(sys.executable)).parent)
    args: list[str] = []
    for root in dict.fromkeys(roots):
        if str(root).startswith("/usr/") or str(root) == "/usr":
            continue
        args += ["--ro-bind-try", str(root), str(root)]
    return args


def bwrap_argv(
    bwrap: str,
    work_files: dict[str, Path],
    ini: Path,
    package: Path,
    *,
    tmp_bytes: int,
    cuda: bool,
) -> list[str]:
    """The ``bwrap ...`` prefix; ``work_files`` maps a name in /grade/work to a host file."""
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",  # explicit (not "-try"), so nested user namespaces can be disabled:
        "--disable-userns",  # no new user namespace inside, hence no capabilities regained
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--hostname",
        "shardlab-grade",
    ]
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL"]
    args += _system_binds()
    args += ["--proc", "/proc", "--dev", "/dev"]
    if cuda:
        for dev in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", dev, dev]
        args += ["--ro-bind", "/sys", "/sys"]
    size = str(int(tmp_bytes))
    args += ["--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm"]
    # After the private /tmp: an environment that lives under /tmp (a CI checkout, say) is
    # bound on top of the empty tmpfs instead of being hidden by it.
    args += _python_binds()
    args += ["--size", size, "--tmpfs", "/grade", "--dir", WORK]
    for name, src in sorted(work_files.items()):
        args += ["--ro-bind", str(src), f"{WORK}/{name}"]
    args += ["--ro-bind", str(ini), INI, "--ro-bind", str(package), f"{PKG}/shardlab"]
    args += ["--chdir", WORK]
    return args
