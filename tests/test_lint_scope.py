"""`make lint` runs `ruff check .`; this checks what that command actually reads.

ruff skips folders it treats as build output (`dist`, `build`, `_build`, ...) by default, so a
package folder with such a name is silently never linted (the runtime package used to live in
`pkg/shardlab/dist/` and was skipped for that reason). Every tracked Python file of the helper
package and of the labs must be in ruff's file list.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> str:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return str(exe)
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed in this environment")
    return found


def test_ruff_reads_every_package_and_lab_file():
    tracked = subprocess.run(
        ["git", "ls-files", "pkg/*.py", "labs/*.py"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    listed = subprocess.run(
        [_ruff(), "check", "--show-files", "."], cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout
    seen = {Path(line.strip()).resolve() for line in listed.splitlines() if line.strip()}
    missing = [p for p in tracked if (ROOT / p).resolve() not in seen]
    assert not missing, f"ruff check . never reads these files: {missing}"
    assert (ROOT / "pkg/shardlab/runtime/launch.py").resolve() in seen


def test_no_package_folder_uses_a_build_output_name():
    # names ruff, setuptools and the standard Python .gitignore treat as generated
    generated = {"dist", "build", "_build", "site-packages", "node_modules"}
    offenders = [p for p in (ROOT / "pkg" / "shardlab").rglob("*") if p.is_dir()
                 and p.name in generated]
    assert not offenders, f"package folders named like build output: {offenders}"
