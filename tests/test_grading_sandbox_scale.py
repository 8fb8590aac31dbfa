"""Issue 24, class scale: the expected total at start and a live estimate while grading."""

from __future__ import annotations

import io

from grading_fixtures.helpers import FIXTURE_LABS, write_tree
from shardlab.grading import Limits, grade
from shardlab.grading._progress import FIRST_GUESS_S, Estimate


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_first_guess_and_live_estimate():
    out = io.StringIO()
    eta = Estimate(100, 4, out, students=50, labs=2)
    eta.begin()
    first = out.getvalue()
    assert first.startswith("100 jobs (50 students x 2 labs), 4 at a time; ≈ ")
    assert f"{100 * FIRST_GUESS_S / 4 / 60:.1f} min" in first  # 100 x 20 s / 4 = 8.3 min
    eta.start -= 60.0  # as if one minute had passed
    for _ in range(10):
        eta.clear()
        eta.finished_one()
    # 10 jobs in 60 s: 90 left at that rate = 9 min
    assert abs(eta.remaining() - 540) < 5
    lines = out.getvalue().splitlines()
    assert (
        lines[-1].startswith("10/100 jobs, ") and "≈ 9.0 min left at the current rate" in lines[-1]
    )
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()  # plain lines off a TTY
    eta.end()
    assert out.getvalue().splitlines()[-1].startswith("10/100 jobs in ")


def test_plain_lines_are_few():
    out = io.StringIO()
    eta = Estimate(200, 2, out)
    eta.begin()
    for _ in range(200):
        eta.finished_one()
    eta.end()
    assert len(out.getvalue().splitlines()) <= 12  # start, one per 10 %, end


def test_progress_bar_on_a_terminal():
    out = _Tty()
    eta = Estimate(4, 2, out)
    eta.begin()
    eta.finished_one()
    eta.clear()  # before the caller's own result line
    text = out.getvalue()
    assert "\r\x1b[K[" + "#" * 6 + "." * 18 + "] 1/4 jobs" in text
    assert text.endswith("\r\x1b[K")


def test_grading_prints_the_estimate(tmp_path, capfd):
    ref = (FIXTURE_LABS / "01_toy" / "gradetoy.py").read_text()
    for name in ("alice", "bob"):
        write_tree(tmp_path / "subs" / name, {"gradetoy.py": ref})
    printed = []
    results = grade(
        FIXTURE_LABS,
        tmp_path / "subs",
        None,
        labs=["01_toy"],
        workers=1,
        limits=Limits(timeout=120, tmp_mb=64),
        cuda=False,
        progress=printed.append,
    )
    err = capfd.readouterr().err
    assert len(results) == 2 == len(printed)
    assert "2 jobs (2 students x 1 labs), 1 at a time; ≈ 40 s at ~20 s per job" in err
    assert "2/2 jobs in " in err
