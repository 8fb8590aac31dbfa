"""A student release that stands alone: the labs, the helper package, requirements, a README.

:func:`release` writes only the lab folders; a student who receives them has no ``shardlab``
to import. :func:`release_kit` writes a folder a student can set up with two commands::

    <out>/README.md          set-up, running the labs and the tests, GPU nodes
    <out>/requirements.txt   -e ./pkg plus the pinned packages the labs need (no book tool chain)
    <out>/pkg/               the helper package (pyproject.toml + shardlab/), no build debris
    <out>/labs/              exactly what release() writes: solutions stripped, no hidden tests
    <out>/pytest.ini         the test markers the labs use (gpu, slow)
    <out>/.shardlab-release.json  what this release wrote (``--force`` replaces only that)

The package is copied from the ``shardlab`` this code is running from (the repository's
``pkg/`` in an editable install). It never holds a lab solution: :func:`release_kit` refuses
to write a package file that contains a solution marker. The pins come from the
repository's ``requirements.txt`` when the labs folder sits in a repository, else from the
versions installed in the running environment.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from importlib import metadata
from pathlib import Path

import shardlab

from .release import check_labs_dir, find_blocks, release, write_member
from .release_guard import (
    ReleaseError,
    check_out_dir,
    check_zip_target,
    clear_out_dir,
    write_marker,
)

# What a student's environment needs to run the labs, their notebooks and public tests.
STUDENT_PACKAGES = (
    "torch",
    "numpy",
    "psutil",
    "matplotlib",
    "ipywidgets",
    "ipykernel",
    "jupyterlab",
    "pytest",
    "pytest-xdist",
)
_REQ_RE = re.compile(r"^\s*(?P<name>[A-Za-z0-9_.\-]+)\s*(?P<spec>[=<>!~].*)?$")
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache"}
PYTEST_INI = """\
[pytest]
testpaths = labs
addopts = -p no:cacheprovider
filterwarnings =
    ignore::DeprecationWarning
markers =
    gpu: needs a CUDA device; skipped without one
    slow: minutes-long checks
"""

README = """\
# shardlab labs — student copy

Labs of the shardlab textbook: you implement collectives, data, pipeline, tensor, context and
expert parallelism with `torch.distributed` and compare what your code measures with what
the formulas predict. Everything runs on a laptop CPU (ranks talk over gloo); the same code
runs on GPUs with nccl.

## Two commands

With Python >= 3.10 (with `venv`):

```bash
python3 -m venv .venv && .venv/bin/pip install -r requirements.txt   # set up (once)
.venv/bin/jupyter lab labs/                                            # open the labs
```

Then activate the environment in every terminal you work in, so that `python`, `pytest` and
`jupyter` are the ones in `.venv` — the commands the lab notebooks print (`pytest
test_collectives.py -q` in a lab folder) assume it, and a JupyterLab started from an activated
terminal gives its own terminals the same `PATH`:

```bash
source .venv/bin/activate                  # Windows: .venv\\Scripts\\activate
jupyter lab labs/                          # the same as .venv/bin/jupyter lab labs/
```

Each `labs/NN_topic/` folder has `lab.ipynb` (the narrative and the experiments), the module
you write (the functions that raise `NotImplementedError` with a hint) and its public tests:

```bash
pytest labs/{first_lab} -q                 # the public tests of one lab (activated)
.venv/bin/pytest labs/{first_lab} -q       # the same without activating
```

A rank that raises ends the run with that rank's message and traceback; ranks that wait for
each other forever (a deadlock) are stopped after 10 s with what each one was waiting for.

The notebook starts several ranks that import your module by name, so your code lives in
the `.py` file, not in a notebook cell. Submit the files your instructor names (the lab's
module files).

## On a GPU node

When CUDA is available each rank takes one device and the process group uses nccl. From a
lab folder (its modules must be importable):

```bash
../../.venv/bin/python -m shardlab.run benchmark_ddp:run --nproc 4 steps=10   # any node
torchrun --nproc-per-node 4 -m shardlab.run benchmark_ddp:run steps=10       # under torchrun
```

(`labs/02_ddp` shown; every lab's `_workers_<topic>.py` functions run the same way.) On a
Slurm cluster start from the batch-script template in `pkg/shardlab/slurm/`.

## What is in this folder

- `labs/` — the labs, without their solutions;
- `pkg/` — the `shardlab` helper package (formulas, calculators, the launcher, instruments,
  small models), installed editable by `requirements.txt`;
- `requirements.txt` — the pinned packages the labs need.
"""


def _pins(repo_requirements: Path | None) -> list[str]:
    """``name==version`` lines for :data:`STUDENT_PACKAGES`, from the repository or from here."""
    found: dict[str, str] = {}
    if repo_requirements is not None and repo_requirements.is_file():
        for line in repo_requirements.read_text().splitlines():
            m = _REQ_RE.match(line.split("#", 1)[0])
            if m and m.group("name").lower() in STUDENT_PACKAGES:
                found[m.group("name").lower()] = line.strip()
    for name in STUDENT_PACKAGES:
        if name not in found:
            try:
                found[name] = f"{name}=={metadata.version(name)}"
            except metadata.PackageNotFoundError as exc:
                raise ReleaseError(
                    f"cannot pin {name!r} for the student kit: it is neither in "
                    f"{repo_requirements} nor installed here."
                ) from exc
    return ["-e ./pkg", *(found[n] for n in STUDENT_PACKAGES)]


def _package_files() -> dict[str, bytes]:
    """``pkg/...`` -> bytes of the running shardlab package (and its pyproject.toml)."""
    src = Path(shardlab.__file__).resolve().parent
    files: dict[str, bytes] = {}
    pyproject = src.parent / "pyproject.toml"
    if not pyproject.is_file():
        raise ReleaseError(
            f"cannot find the package's pyproject.toml next to {src}; the student kit needs "
            "shardlab installed from its source folder (pip install -e ./pkg)."
        )
    files["pkg/pyproject.toml"] = pyproject.read_bytes()
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if not path.is_file() or path.is_symlink() or _SKIP_DIRS & set(rel.parts):
            continue
        if path.suffix in (".pyc", ".pyo"):
            continue
        files[f"pkg/shardlab/{rel.as_posix()}"] = path.read_bytes()
    return files


def _windows(lines: list[str], n: int = 3) -> set[tuple[str, ...]]:
    code = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    return {tuple(code[k : k + n]) for k in range(len(code) - n + 1)}


def _check_no_solution(package: dict[str, bytes], labs_dir: Path) -> None:
    """Refuse a package file that holds a piece of a lab's reference solution.

    A piece is three consecutive code lines of one solution block (single generic lines such
    as ``self._handles.clear()`` also occur in honest package code).
    """
    pieces: set[tuple[str, ...]] = set()
    for module in sorted(labs_dir.glob("[0-9][0-9]_*/*.py")):
        text = module.read_text()
        lines = text.splitlines()
        for b in find_blocks(text, str(module)):
            pieces |= _windows(lines[b.begin : b.end - 1])
    for rel, data in package.items():
        if rel.endswith(".py"):
            leaked = sorted(pieces & _windows(data.decode("utf-8").splitlines()))
            if leaked:
                raise ReleaseError(
                    f"{rel} contains {len(leaked)} piece(s) of a lab's reference solution "
                    f"(first: {' / '.join(leaked[0])!r}); the helper package must hold no "
                    "solution."
                )


def release_kit(
    labs_dir: Path, out_dir: Path, *, zip_kit: bool = False, force: bool = False,
    book_url: str | None = None,
) -> dict[str, str]:
    """Write the self-contained student folder into ``out_dir``; return ``{path: sha256}``.

    ``out_dir`` must be empty or absent unless ``force`` (then it must hold a previous
    release: its marker file lists everything in it). With ``zip_kit`` the same files are also
    written as ``<out_dir>.zip`` (sorted members, fixed timestamps).
    """
    labs_dir, out_dir = Path(labs_dir), Path(out_dir)
    check_labs_dir(labs_dir)
    check_out_dir(labs_dir, out_dir)
    extra = _package_files()  # validate before touching the output folder
    _check_no_solution(extra, labs_dir)
    extra["requirements.txt"] = (
        "\n".join(_pins(labs_dir.parent / "requirements.txt")) + "\n"
    ).encode()
    labs = sorted(p.name for p in labs_dir.iterdir() if re.match(r"^\d\d_", p.name))
    first = labs[0] if labs else "01_collectives"
    extra["README.md"] = README.replace("{first_lab}", first).encode()
    extra["pytest.ini"] = PYTEST_INI.encode()
    if zip_kit:
        check_zip_target(out_dir.with_suffix(".zip"), force)
    clear_out_dir(labs_dir, out_dir, force)
    shipped = frozenset({"../" + k for k in extra} | set(extra))
    labs_out = release(labs_dir, out_dir / "labs", marker=False, book_url=book_url,
                       shipped=shipped)
    manifest = {f"labs/{k}": v for k, v in labs_out.items()}
    for rel, data in sorted(extra.items()):
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        manifest[rel] = hashlib.sha256(data).hexdigest()
    write_marker(out_dir, list(manifest))
    if zip_kit:
        with zipfile.ZipFile(out_dir.with_suffix(".zip"), "w", zipfile.ZIP_DEFLATED) as zf:
            for rel in sorted(manifest):
                write_member(zf, f"{out_dir.name}/{rel}", (out_dir / rel).read_bytes())
    return dict(sorted(manifest.items()))
