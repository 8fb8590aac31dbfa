"""An environment under /tmp (a CI checkout) must stay visible inside the grading sandbox.

The sandbox mounts a private tmpfs on /tmp; the interpreter and virtual environment are bound
after it, so a `.venv` at /tmp/ci/.venv is bound on top of the empty tmpfs, not hidden by it
(seen: "bwrap: execvp /tmp/ci/.venv/bin/python: No such file or directory" for every student).
"""

from __future__ import annotations

import sys
from pathlib import Path

from shardlab.grading import _bwrap


def test_python_binds_come_after_the_private_tmp(tmp_path, monkeypatch):
    fake_venv = Path("/tmp/ci-venv-for-order-test")
    monkeypatch.setattr(sys, "prefix", str(fake_venv))
    argv = _bwrap.bwrap_argv(
        "bwrap", {}, tmp_path / "pytest.ini", tmp_path / "pkg", tmp_bytes=1 << 20, cuda=False
    )
    tmpfs_tmp = next(i for i in range(len(argv) - 1) if argv[i : i + 2] == ["--tmpfs", "/tmp"])
    venv_bind = next(
        i
        for i in range(len(argv) - 2)
        if argv[i] == "--ro-bind-try" and argv[i + 1] == str(fake_venv)
    )
    assert venv_bind > tmpfs_tmp
