"""The bubblewrap command line of one grading sandbox.

What the sandbox sees (everything else of the machine is absent, not just unwritable):

* read-only: ``/usr`` (and ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as on the host), a few
  files of ``/etc`` that programs need to start (loader cache, passwd/group, hosts), the
  Python interpreter's folders, the virtual environment, and at ``/grade/pkg`` the copy of
  the ``shardlab`` package the grader took at start (not the live source tree);
* ``/grade/work``: a size-capped tmpfs holding, each mounted read-only, the instructor's
  files of *this* lab (public tests, ``hidden/`` tests, helpers) and the student's
  ``submit`` files (in-memory copies handed over as descriptors, ``--ro-bind-data``); new
  files can be written next to them, up to the cap;
* ``/grade/pytest.ini`` (read-only), private size-capped ``/tmp`` and ``/dev/shm``, a new
  ``/proc`` mounted read-only as a whole (no ``/proc/sys`` or ``/proc/sysrq-trigger`` write,
  whoever the sandbox maps to) and a minimal ``/dev``.

Who: a grader running as root starts bubblewrap as ``nobody`` (:func:`sandbox_identity`), so
the sandbox never maps to host uid 0 where that user can read the environment.

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
import pwd
import shutil
import sys
import threading
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


def _python_binds(ident: tuple[int, int] | None = None) -> list[str]:
    """Binds of the interpreter and the environment; for a sandbox user ``ident`` that cannot
    reach one of them (an interpreter under /root), a link farm of it (:mod:`._envfarm`)."""
    from ._envfarm import farm, reachable

    roots = [Path(sys.prefix), Path(sys.base_prefix), *environment_roots()]
    roots.append(Path(os.path.realpath(sys.executable)).parent)
    args: list[str] = []
    farmed: dict[str, str] = {}
    for root in map(str, dict.fromkeys(roots)):
        if root.startswith("/usr/") or root == "/usr":
            continue
        source = root
        if ident is not None and not reachable(root, *ident):
            outer = next((r for r in farmed if root.startswith(r + "/")), None)
            if outer is not None:
                source = farmed[outer] + root[len(outer) :]
            elif (made := farm(root)) is not None:
                source = farmed[root] = made
        args += ["--ro-bind-try", source, root]
    return args


def bwrap_argv(
    bwrap: str,
    work_fds: dict[str, int],
    ini_fd: int,
    package: Path,
    *,
    tmp_bytes: int,
    cuda: bool,
    info_fd: int | None = None,
    ident: tuple[int, int] | None = None,
) -> list[str]:
    """The ``bwrap ...`` prefix.

    ``work_fds`` maps a name in /grade/work to a file descriptor (a memfd) holding its
    content; bubblewrap copies each into the sandbox and mounts it read-only
    (``--ro-bind-data``), so no host path of the job folder has to be reachable by the
    sandbox's user. ``info_fd``: bubblewrap writes ``{"child-pid": N}`` there (the host pid
    of the sandbox's PID 1).
    """
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
    if info_fd is not None:
        args += ["--info-fd", str(info_fd)]
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL"]
    args += _system_binds()
    # a new /proc, then read-only as a whole: /proc/sys, /proc/sysrq-trigger, /proc/irq, ...
    # cannot change a host setting even where the sandbox's uid would be allowed to
    args += ["--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
    if cuda:
        for dev in sorted(glob.glob("/dev/nvidia*")):
            args += ["--dev-bind", dev, dev]
        args += ["--ro-bind", "/sys", "/sys"]
    size = str(int(tmp_bytes))
    args += ["--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm"]
    # After the private /tmp: an environment that lives under /tmp (a CI checkout, say) is
    # bound on top of the empty tmpfs instead of being hidden by it.
    args += _python_binds(ident)
    args += ["--size", size, "--tmpfs", "/grade", "--dir", WORK]
    for name, fd in sorted(work_fds.items()):
        parent = os.path.dirname(name)
        if parent:
            args += ["--dir", f"{WORK}/{parent}"]
        args += ["--perms", "0444", "--ro-bind-data", str(fd), f"{WORK}/{name}"]
    args += ["--perms", "0444", "--ro-bind-data", str(ini_fd), INI]
    args += ["--ro-bind", str(package), f"{PKG}/shardlab"]
    args += ["--chdir", WORK]
    return args


_identity_cache: dict[tuple[str, str], tuple[int, int] | None] = {}
_identity_lock = threading.Lock()
_warned: set[str] = set()


def sandbox_identity(bwrap: str, package: Path) -> tuple[int, int] | None:
    """(uid, gid) the sandbox runs as on the host, or None: as the grader's own user.

    A grader running as root starts bubblewrap as the unprivileged user ``nobody``, so the
    sandbox maps to that host uid, never to uid 0 (a sysctl write is allowed by euid 0 and the
    file mode, not by capabilities). That user must be able to read the interpreter, the
    virtual environment and the package copy (the default permissions, 755/644, allow it; a
    folder it cannot reach, such as an interpreter under /root, is bound from a link farm,
    :mod:`._envfarm`); checked once per environment by starting a sandbox as that user. If
    it cannot, the sandbox stays mapped to uid 0 (with ``/proc`` read-only) and the grader
    says why, once.
    """
    if os.geteuid() != 0:
        return None
    key = (bwrap, str(package))
    with _identity_lock:
        if key in _identity_cache:
            return _identity_cache[key]
        try:
            entry = pwd.getpwnam(os.environ.get("SHARDLAB_SANDBOX_USER", "nobody"))
            ident: tuple[int, int] | None = (entry.pw_uid, entry.pw_gid)
        except KeyError:
            ident = None
        problem = "there is no user 'nobody'" if ident is None else _probe(bwrap, package, ident)
        if problem:
            ident = None
            if "warned" not in _warned:
                _warned.add("warned")
                print(
                    "WARNING shardlab grade runs as root and cannot start the sandbox as an "
                    f"unprivileged user ({problem}); it stays mapped to host uid 0 with /proc "
                    "read-only. Make the interpreter, the virtual environment and every "
                    "folder above them readable by 'nobody' (chmod o+rX) to fix this.",
                    file=sys.stderr,
                    flush=True,
                )
        _identity_cache[key] = ident
        return ident


def _probe(bwrap: str, package: Path, ident: tuple[int, int]) -> str:
    """'' when a sandbox started as ``ident`` imports pytest and the package; else why not."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile() as ini:
        prefix = bwrap_argv(
            bwrap, {}, ini.fileno(), package, tmp_bytes=2**20, cuda=False, ident=ident
        )
        code = "import pytest, shardlab.grading._runner"
        env = {"PYTHONPATH": PKG, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        try:
            proc = subprocess.run(
                [*prefix, "--", sys.executable, "-P", "-c", code],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
                pass_fds=(ini.fileno(),),
                user=ident[0],
                group=ident[1],
                extra_groups=[],
                cwd="/",
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return str(exc)[:200]
    if proc.returncode == 0:
        return ""
    said = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
    return said[:300]
