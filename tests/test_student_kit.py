"""The student kit (`shardlab release`): a folder a student sets up with its README alone.

Fast: the kit's layout, its pins, the package without solutions, determinism, refusal of a
package that holds a piece of a solution, the CLI's two layouts.
SLOW (``make test-slow``; a fresh virtual environment is minutes of pip): release -> follow
the kit's README in a new venv -> lab 01's public tests fail with the hints -> drop the
reference modules in -> they pass.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from grading_fixtures.helpers import REPO_LABS
from shardlab.grading import load_rubric, release
from shardlab.grading.kit import STUDENT_PACKAGES, _check_no_solution, release_kit
from shardlab.grading.release import ReleaseError, find_blocks

pytestmark = pytest.mark.skipif(not REPO_LABS.is_dir(), reason="no labs/ folder")
REPO = REPO_LABS.parent


def test_kit_layout_pins_and_labs(tmp_path):
    kit = tmp_path / "student"
    manifest = release_kit(REPO_LABS, kit)
    assert {p.name for p in kit.iterdir()} == {
        ".shardlab-release.json",
        "README.md",
        "labs",
        "pkg",
        "pytest.ini",
        "requirements.txt",
    }
    # the labs are exactly the plain release
    plain = release(REPO_LABS, tmp_path / "plain")
    assert {
        k.removeprefix("labs/"): v for k, v in manifest.items() if k.startswith("labs/")
    } == plain
    # the package is the running shardlab's source, with its pyproject and no build debris
    assert (kit / "pkg" / "pyproject.toml").is_file()
    assert (kit / "pkg" / "shardlab" / "accounting" / "memory.py").is_file()
    assert not list((kit / "pkg").rglob("__pycache__"))
    # every student package is pinned exactly as the repository pins it
    repo_pins = {
        ln.split("==")[0].lower(): ln.strip()
        for ln in (REPO / "requirements.txt").read_text().splitlines()
        if "==" in ln
    }
    lines = (kit / "requirements.txt").read_text().splitlines()
    assert lines[0] == "-e ./pkg"
    assert lines[1:] == [repo_pins[n] for n in STUDENT_PACKAGES]
    readme = (kit / "README.md").read_text()
    assert "pip install -r requirements.txt" in readme and "jupyter lab labs/" in readme
    assert "torchrun" in readme and "{" not in readme.replace("{first_lab}", "")


def test_kit_is_deterministic_and_refuses_a_full_folder(tmp_path):
    release_kit(REPO_LABS, tmp_path / "a", zip_kit=True)
    release_kit(REPO_LABS, tmp_path / "b" / "a", zip_kit=True)
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b" / "a.zip").read_bytes()
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        assert "a/requirements.txt" in zf.namelist()
    with pytest.raises(ReleaseError, match="not empty"):
        release_kit(REPO_LABS, tmp_path / "a")
    release_kit(REPO_LABS, tmp_path / "a", force=True)


def test_package_holding_a_solution_piece_is_refused():
    module = REPO_LABS / "01_collectives" / "collectives.py"
    text = module.read_text()
    block = find_blocks(text, str(module))[0]
    solution = "\n".join(text.splitlines()[block.begin : block.end - 1])
    with pytest.raises(ReleaseError, match=r"pkg/shardlab/leak\.py contains .* reference solution"):
        _check_no_solution({"pkg/shardlab/leak.py": solution.encode()}, REPO_LABS)
    _check_no_solution({"pkg/shardlab/fine.py": b"x = 1\n"}, REPO_LABS)


def test_cli_release_kit_and_labs_only(tmp_path):
    def cli(*args):
        cmd = [sys.executable, "-m", "shardlab", "release", "--labs", str(REPO_LABS), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    proc = cli("--out", str(tmp_path / "kit"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "kit" / "pkg" / "pyproject.toml").is_file()
    assert "README.md" in proc.stdout
    proc = cli("--out", str(tmp_path / "plain"), "--labs-only")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "plain" / "pkg").exists()
    assert (tmp_path / "plain" / "01_collectives" / "collectives.py").is_file()


@pytest.mark.slow
def test_new_student_follows_the_kit_readme(tmp_path):
    """Release, then do what the kit's README says, in a virtual environment of its own."""
    kit = tmp_path / "student"
    release_kit(REPO_LABS, kit)
    readme = (kit / "README.md").read_text()
    setup = re.search(r"^(python3 -m venv .*?)\s+#", readme, re.M).group(1)
    proc = subprocess.run(
        setup.replace("python3", sys.executable, 1),
        shell=True,
        cwd=kit,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    py = kit / ".venv" / "bin" / "python"
    where = subprocess.run(
        [py, "-c", "import shardlab; print(shardlab.__file__)"], capture_output=True, text=True
    )
    assert where.stdout.strip() == str(kit / "pkg" / "shardlab" / "__init__.py")
    lab = "01_collectives"
    tests = [str(kit / ".venv" / "bin" / "pytest"), f"labs/{lab}", "-q"]
    stub = subprocess.run(tests + ["-x"], cwd=kit, capture_output=True, text=True, timeout=900)
    assert stub.returncode == 1, stub.stdout[-3000:]  # 1: tests ran and failed
    assert "NotImplementedError: " in stub.stdout  # the hint reaches the student
    for name in load_rubric(REPO_LABS / lab).submit:  # drop the reference modules in
        shutil.copyfile(REPO_LABS / lab / name, kit / "labs" / lab / name)
    ref = subprocess.run(tests + ["-n", "2"], cwd=kit, capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stdout[-3000:]


def test_kit_readme_activates_before_bare_commands():
    """Issue 27: commands the labs print (``pytest test_collectives.py -q``) need the kit's
    environment on PATH; the README says how before its first bare ``pytest``/``jupyter``."""
    from shardlab.grading.kit import README

    lines = README.splitlines()
    activate = next(i for i, ln in enumerate(lines) if ln.startswith("source .venv/bin/activate"))
    bare = [i for i, ln in enumerate(lines) if re.match(r"^(pytest|jupyter|python) ", ln)]
    assert bare and min(bare) > activate, (activate, [lines[i] for i in bare])
