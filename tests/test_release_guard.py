"""``release --force`` never removes what it did not write (issue 30).

Every test runs inside pytest's ``tmp_path``: the current directory is moved there (with
sentinel files) before any release is attempted, so a regression deletes only scratch files,
and the sentinels say whether it did.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from shardlab.grading.kit import release_kit
from shardlab.grading.release import MARKER, ReleaseError, release

FIXTURE_LABS = Path(__file__).parent / "grading_fixtures" / "labs"


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A scratch current directory holding sentinel files and a copy-free labs reference."""
    work = tmp_path / "work"
    (work / "notes").mkdir(parents=True)
    (work / "keep.txt").write_text("mine")
    (work / "notes" / "thesis.tex").write_text("years of work")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return work


def _sentinels_intact(work: Path) -> bool:
    return (work / "keep.txt").read_text() == "mine" and (
        work / "notes" / "thesis.tex"
    ).read_text() == "years of work"


@pytest.mark.parametrize("out", ["", ".", "..", "notes/.."])
@pytest.mark.parametrize("writer", [release, release_kit])
def test_current_folder_and_above_are_refused(scratch, out, writer):
    with pytest.raises(ReleaseError, match="current folder or one above it"):
        writer(FIXTURE_LABS, Path(out), force=True)
    assert _sentinels_intact(scratch)
    assert not (scratch / "01_toy").exists() and not (scratch / "labs").exists()


def test_home_folder_is_refused(scratch, tmp_path):
    home = tmp_path / "home"
    (home / ".bashrc").write_text("x")
    with pytest.raises(ReleaseError, match="home folder"):
        release(FIXTURE_LABS, home, force=True)
    assert (home / ".bashrc").read_text() == "x"


def test_force_refuses_a_folder_that_holds_no_release(scratch):
    with pytest.raises(ReleaseError, match=r"no shardlab release wrote \(first: \(no readable"):
        release(FIXTURE_LABS, scratch / "notes", force=True)
    assert _sentinels_intact(scratch)


@pytest.mark.parametrize("writer", [release, release_kit])
def test_force_replaces_a_previous_release_but_not_added_files(scratch, writer):
    out = scratch / "student"
    first = writer(FIXTURE_LABS, out)
    assert (out / MARKER).is_file()
    # a student's run leaves caches: they go with the release
    (out / "__pycache__").mkdir()
    (out / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert writer(FIXTURE_LABS, out, force=True) == first
    # a file the release did not write stops --force before anything is removed
    added = next(p for p in sorted(out.rglob("*.py")) if p.is_file()).parent / "my_work.py"
    added.write_text("# mine")
    kept = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ReleaseError, match=r"holds 1 entry that no shardlab release wrote"):
        writer(FIXTURE_LABS, out, force=True)
    assert added.read_text() == "# mine"
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == kept


def test_out_inside_or_holding_the_labs_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    labs = tmp_path / "repo" / "labs"
    (labs / "01_toy").mkdir(parents=True)
    (labs / "01_toy" / "toy.py").write_text("x = 1\n")
    with pytest.raises(ReleaseError, match="inside the labs folder"):
        release(labs, labs / "student")
    with pytest.raises(ReleaseError, match="contains the labs folder"):
        release(labs, tmp_path / "repo", force=True)
    assert not (labs / "student").exists() and (labs / "01_toy" / "toy.py").is_file()


def test_labs_folder_without_labs_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("not a lab")
    for writer in (release, release_kit):
        with pytest.raises(ReleaseError, match="holds no lab folder"):
            writer(tmp_path / "empty", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("out", ["", "."])
def test_cli_refuses_empty_out_with_one_sentence(scratch, out):
    cmd = [sys.executable, "-m", "shardlab", "release", "--labs", str(FIXTURE_LABS)]
    proc = subprocess.run(
        [*cmd, "--out", out, "--force", "--labs-only"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "current folder" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert _sentinels_intact(scratch)
    assert sorted(p.name for p in scratch.iterdir()) == ["keep.txt", "notes"]


def test_kit_zip_replaces_only_a_previous_kits_zip(scratch):
    out = scratch / "student"
    release_kit(FIXTURE_LABS, out, zip_kit=True)
    zipped = (scratch / "student.zip").read_bytes()
    with pytest.raises(ReleaseError, match="student.zip exists; pass --force"):
        release_kit(FIXTURE_LABS, out, zip_kit=True)
    release_kit(FIXTURE_LABS, out, zip_kit=True, force=True)
    assert (scratch / "student.zip").read_bytes() == zipped
    (scratch / "student.zip").write_text("my own archive")
    with pytest.raises(ReleaseError, match="not a zip a shardlab release wrote"):
        release_kit(FIXTURE_LABS, out, zip_kit=True, force=True)
    assert (scratch / "student.zip").read_text() == "my own archive"
