"""Re-execute notebooks in place, so that their stored outputs are a fresh run.

    .venv/bin/python tools/execute_notebooks.py                 # every notebook in book/ and labs/
    .venv/bin/python tools/execute_notebooks.py book/01_collectives.ipynb labs/02_ddp/lab.ipynb

``make execute`` runs the first form (``make execute NB="a.ipynb b.ipynb"`` the second).
Each notebook runs with nbclient in a kernel of *this* Python (the one running the script,
normally ``.venv/bin/python``, whatever kernelspecs are installed), with its own folder as
the working directory (labs import their module from there), a per-cell timeout, and the
widget state stored in the notebook metadata so that the built book can render the widgets
without a kernel. Execution timing metadata is not recorded (it would change every run).

Discovery: ``book/**/*.ipynb`` and ``labs/**/*.ipynb``, skipping ``_build``,
``.ipynb_checkpoints`` and ``hidden`` folders — the same set ``make nbval`` checks.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SKIP_PARTS = {"_build", ".ipynb_checkpoints", "hidden", "node_modules", ".venv"}


def discover(root: Path = ROOT) -> list[Path]:
    """All notebooks of the book and the labs, in a stable order."""
    found: list[Path] = []
    for top in ("book", "labs"):
        for path in sorted((root / top).rglob("*.ipynb")):
            if not SKIP_PARTS.intersection(path.relative_to(root).parts):
                found.append(path)
    return found


class _CurrentEnvSpecs(KernelSpecManager):
    """Every kernel name resolves to an ipykernel of the running interpreter."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return KernelSpec(
            argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (ipykernel)",
            language="python",
            resource_dir=str(ROOT),
        )


def execute(path: Path, timeout: int = 600, allow_errors: bool = False) -> float:
    """Execute one notebook in place; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name="python3", kernel_spec_manager=_CurrentEnvSpecs())
    client = NotebookClient(
        nb,
        km=km,
        timeout=timeout,
        allow_errors=allow_errors,
        store_widget_state=True,
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    start = time.perf_counter()
    client.execute(cwd=str(path.parent))
    elapsed = time.perf_counter() - start
    nbformat.write(nb, path)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Re-execute notebooks in place (stored outputs).")
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: all of book/ and labs/")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    ap.add_argument("--allow-errors", action="store_true", help="keep going past failing cells")
    args = ap.parse_args(argv)
    notebooks = [p.resolve() for p in args.notebooks] or discover()
    if not notebooks:
        print("execute_notebooks: no notebooks found")
        return 0
    failed: list[str] = []
    for path in notebooks:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"executing {name} ...", flush=True)
        try:
            seconds = execute(path, timeout=args.timeout, allow_errors=args.allow_errors)
        except Exception as exc:  # report every failing notebook, then fail
            print(f"  FAILED: {type(exc).__name__}: {str(exc)[-2000:]}", flush=True)
            failed.append(str(name))
            continue
        print(f"  done in {seconds:.1f} s", flush=True)
    if failed:
        print(f"execute_notebooks: {len(failed)} failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
