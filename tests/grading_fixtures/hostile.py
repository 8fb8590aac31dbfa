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
