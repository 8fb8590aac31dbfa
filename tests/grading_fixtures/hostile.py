"""Hostile and broken submissions of the 01_toy lab, built from its reference module.

Each entry maps a student name to a function ``(reference_source, stub_source) -> files``
where ``files`` maps a path inside the submission folder to its text. Every process these
submissions start carries ``TAG`` in its command line, so a test can look for survivors.
"""

TAG = "shardlab-hostile-fixture-tag"

HANG = """
def mean(xs):
    import time
    while True:
        time.sleep(0.5)
"""

OS_EXIT = """
import os
os._exit(3)
"""

KILL_SUPERVISOR = """
_reference_mean = mean


def mean(xs):
    import os
    import signal
    os.kill(os.getppid(), signal.SIGKILL)  # the grader's supervisor, not the grader
    return _reference_mean(xs)
"""

KILL_PYTEST = """
_reference_scale = scale


def scale(xs, factor):
    import subprocess
    import sys
    # a child process kills its parent: the pytest process
    subprocess.run([sys.executable, "-c", "import os, signal; os.kill(os.getppid(), signal.SIGKILL)"])
    return _reference_scale(xs, factor)
"""

FLOOD = """
_reference_mean = mean


def mean(xs):
    import os
    block = b"x" * (1 << 20)
    for _ in range(4096):  # 4 GB
        os.write(1, block)
    return _reference_mean(xs)
"""

DAEMONS = f"""
import os as _os
import subprocess as _sp
import sys as _sys

# a plain child in our session, a child in its own session, and a double-forked daemon
# with an empty environment; all sleep "forever"
_sp.Popen([_sys.executable, "-c", "import time; time.sleep(1000)  # {TAG} plain"])
_sp.Popen([_sys.executable, "-c", "import time; time.sleep(1000)  # {TAG} setsid"],
          start_new_session=True)
_sp.Popen([_sys.executable, "-c",
           "import os, sys, time\\nif os.fork() == 0:\\n    os.setsid()\\n"
           "    if os.fork() == 0:\\n        os.execv(sys.executable, [sys.executable, '-c',"
           " 'import time; time.sleep(1000)  # {TAG} double-fork'])\\n"
           "    os._exit(0)\\n"], env={{}})
"""

FORK_MANY = f"""
import subprocess as _sp
import sys as _sys

_children = [_sp.Popen([_sys.executable, "-c", "import time; time.sleep(1000)  # {TAG} many"])
             for _ in range(40)]
"""

TAMPER_REWRITE = """
import pathlib as _pathlib

_hidden = _pathlib.Path(__file__).with_name("test_gradetoy_hidden.py")
_hidden.write_text("def test_mean_hidden():\\n    pass\\n\\n\\ndef test_chunk_last():\\n    pass\\n")
"""

TAMPER_DELETE = """
import pathlib as _pathlib

_pathlib.Path(__file__).with_name("test_gradetoy.py").unlink()
"""

FAKE_JUNIT = """
import os as _os
import pathlib as _pathlib

_FAKE = ("<?xml version='1.0'?><testsuites><testsuite name='pytest' tests='7'>"
         + "".join(f"<testcase classname='test_gradetoy' name='{n}'/>"
                   for n in ("test_add", "test_chunk", "test_mean", "test_scale"))
         + "".join(f"<testcase classname='test_gradetoy_hidden' name='{n}'/>"
                   for n in ("test_mean_hidden", "test_chunk_last"))
         + "</testsuite></testsuites>")
_here = _pathlib.Path(__file__).parent
for _p in (_here / "junit.xml", _here / "report.xml", _here.parent / "junit.xml",
           _pathlib.Path(_os.environ.get("TMPDIR", "/tmp")) / "junit.xml"):
    try:
        _p.write_text(_FAKE)
    except OSError:
        pass
"""

FAKE_HELPERS = """
def approx_equal(a, b, tol=1e-9):
    return True
"""

FAKE_TESTS = """
def test_add():
    pass
"""


def submissions(reference: str, stub: str) -> dict[str, dict[str, str]]:
    """student -> {relative path: text}."""
    return {
        "reference": {"gradetoy.py": reference},
        "stub": {"01_toy/gradetoy.py": stub},
        "os_exit": {"gradetoy.py": reference + OS_EXIT},
        "kill_supervisor": {"gradetoy.py": reference + KILL_SUPERVISOR},
        "kill_pytest": {"gradetoy.py": reference + KILL_PYTEST},
        "flood": {"gradetoy.py": reference + FLOOD},
        "daemons": {"gradetoy.py": reference + DAEMONS},
        "fork_many": {"gradetoy.py": reference + FORK_MANY},
        "tamper_rewrite": {"gradetoy.py": stub + TAMPER_REWRITE},
        "tamper_delete": {"gradetoy.py": stub + TAMPER_DELETE},
        "fake_junit": {"gradetoy.py": stub + FAKE_JUNIT},
        "own_tests": {
            "gradetoy.py": stub,
            "_helpers_gradetoy.py": FAKE_HELPERS,
            "test_gradetoy.py": FAKE_TESTS,
            "test_gradetoy_hidden.py": FAKE_TESTS,
        },
        "missing": {"README.txt": "I forgot to attach my work.\n"},
        "syntax": {"gradetoy.py": reference.replace("def add(a, b):", "def add(a, b)")},
        "nested_zip": {"alice/01_toy/gradetoy.py": reference},  # zipped by the test
    }


# --------------------------------------------------------------------------------------------
# Issue 12: attacks on the grader itself. Each is a template; ``{PATHS}`` is replaced by a
# dict literal of real host paths (the lab copy, the submissions, --out, site-packages, the
# grader's pid), so the attacks know exactly where to strike.

KILLER = """
_reference_mean = mean


def mean(xs):
    import os
    import signal
    import socket
    P = {PATHS}
    # inside the sandbox: no network interface but loopback, no host process visible
    interfaces = sorted(name for _, name in socket.if_nameindex())
    if interfaces != ["lo"] or os.path.exists(f"/proc/{P['grader_pid']}"):
        raise AssertionError(f"KILLER sees interfaces {interfaces} or the grader")
    import ctypes

    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0:  # CLONE_NEWUSER
        raise AssertionError("KILLER made a user namespace (capabilities regained)")
    targets = {P["grader_pid"], os.getppid()}
    try:
        with open(f"/proc/{os.getppid()}/stat") as fh:
            targets.add(int(fh.read().rsplit(")", 1)[1].split()[1]))  # the grandparent
    except (OSError, ValueError, IndexError):
        pass
    for name in os.listdir("/proc"):  # anything that looks like the grader
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if name.isdigit() and int(name) != os.getpid() and b"pytest" in cmd and b"-n" in cmd:
            targets.add(int(name))
    for pid in targets:
        if pid > 1 and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return _reference_mean(xs)
"""

OVERWRITER = """
import glob as _glob
import os as _os

_P = {PATHS}
_STUB = "def add(a, b):\\n    raise NotImplementedError\\n"
_wrote = []


def _try(path, text):
    try:
        with open(path, "w") as fh:
            fh.write(text)
        _wrote.append(path)
    except OSError:
        pass


for _f in _glob.glob(_P["subs"] + "/**/gradetoy.py", recursive=True):
    _try(_f, _STUB)  # classmates' submissions
for _pattern in ("/tmp/shardlab-*/**/gradetoy.py", "/tmp/shardlab-*/**/test_*.py",
                 "/tmp/**/unpacked-*/**/gradetoy.py"):
    for _f in _glob.glob(_pattern, recursive=True):
        _try(_f, _STUB)  # concurrent students' work folders and unpacked zips
for _f in _glob.glob(_P["labs"] + "/01_toy/**/test_*.py", recursive=True):
    _try(_f, "def test_add():\\n    pass\\n")  # the instructor's tests
_try(_P["site"] + "/zz_shardlab_hostile.pth", "# shardlab-hostile-fixture-tag\\n")
try:  # --out exists on the host from the start: plant a link over an instructor file
    _os.symlink(_P["labs"] + "/01_toy/test_gradetoy.py", _P["out"] + "/junit.xml")
    _wrote.append("symlink")
except OSError:
    pass
if _wrote:  # an attack that worked fails a test, so it cannot go unnoticed

    def mean(xs):
        raise AssertionError(f"OVERWRITER wrote {_wrote[:3]}")
"""

FORGER = """
import os as _os
import subprocess as _sp
import sys as _sys

_P = {PATHS}
_CODE = f'''
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.time() + 600
        while time.time() < end:  # {TAG} forger
            for rel in ("grades.csv", "summary.csv", "forger/results.json"):
                try:
                    with open(os.path.join({_P["out"]!r}, rel), "w") as fh:
                        fh.write("forged")
                except OSError:
                    pass
            time.sleep(0.3)
    os._exit(0)
'''
_sp.Popen([_sys.executable, "-c", _CODE, "{TAG}"], env={}, start_new_session=True)
"""

LEAKER = """
import pathlib as _pathlib

_here = _pathlib.Path(__file__).parent
try:
    _HIDDEN = (_here / "test_gradetoy_hidden.py").read_text()
except OSError as _exc:
    _HIDDEN = repr(_exc)
try:
    _REFERENCE = _pathlib.Path({PATHS}["labs"] + "/01_toy/gradetoy.py").read_text()
except OSError as _exc:
    _REFERENCE = "reference unreadable: " + repr(_exc)
_LEAK = (_HIDDEN + _REFERENCE).replace("\\n", " | ")


def mean(xs):
    raise AssertionError(_LEAK)


def add(a, b):
    raise NotImplementedError(_LEAK)


def chunk(xs, n, i):
    raise ValueError(_LEAK)


def scale(xs, factor):
    class Leak(Exception):
        pass
    raise Leak(_LEAK)
"""

LEAK_IMPORT = """
import pathlib as _pathlib

raise ImportError((_pathlib.Path(__file__).parent / "test_gradetoy_hidden.py").read_text())
"""

HOG = """
_reference_mean = mean
_done = []


def _fill(folder, limit_mb):
    import os
    wrote = 0
    block = b"x" * (1 << 20)
    for i in range(limit_mb):
        try:
            with open(os.path.join(folder, f"hog-{i}"), "wb") as fh:
                fh.write(block)
            wrote += 1
        except OSError:
            break
    return wrote


def mean(xs):
    import os
    if not _done:
        _done.append(1)
        shm = _fill("/dev/shm", 4096)
        tmp = _fill(os.environ.get("TMPDIR", "/tmp"), 600)
        cap = {PATHS}["tmp_mb"]
        if not (0 < shm <= cap and 0 < tmp <= cap):  # only a capped tmpfs passes
            raise AssertionError(f"HOG shm_mb={shm} tmp_mb={tmp} cap={cap}")
    return _reference_mean(xs)
"""

DEEP_TREE = """
import os as _os

_fd = _os.open(".", _os.O_RDONLY)
for _ in range(1500):
    try:
        _os.mkdir("d", dir_fd=_fd)
    except FileExistsError:
        pass
    _nfd = _os.open("d", _os.O_RDONLY, dir_fd=_fd)
    _os.close(_fd)
    _fd = _nfd
_os.close(_fd)
"""


def attacks(reference: str, stub: str, paths: dict) -> dict[str, dict[str, str]]:
    """Issue-12 attackers that run: student -> {relative path: text}."""
    literal = repr(paths)

    def fill(template: str) -> str:
        return template.replace("{PATHS}", literal).replace("{TAG}", TAG)

    return {
        "victim": {"gradetoy.py": reference},
        "killer": {"gradetoy.py": reference + fill(KILLER)},
        "overwriter": {"gradetoy.py": reference + fill(OVERWRITER)},
        "forger": {"gradetoy.py": reference + fill(FORGER)},
        "leaker": {"gradetoy.py": stub + fill(LEAKER)},
        "leak_import": {"gradetoy.py": reference + fill(LEAK_IMPORT)},
        "hog": {"gradetoy.py": reference + fill(HOG)},
        "deep_tree": {"gradetoy.py": reference + fill(DEEP_TREE)},
        "deep_expr": {"gradetoy.py": reference + "\nX = " + "+".join(["1"] * 200_000) + "\n"},
    }


TAMPER_FIFO = """
import os as _os

_hidden = _os.path.join(_os.path.dirname(__file__), "test_gradetoy_hidden.py")
_os.unlink(_hidden)
_os.mkfifo(_hidden)  # the old grader blocked forever hashing this
"""

PLAIN_CHILD_HANG = f"""
import subprocess as _sp
import sys as _sys

_sp.Popen([_sys.executable, "-c", "import time; time.sleep(1000)  # {TAG} plain"])
"""
