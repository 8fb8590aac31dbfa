"""What ``shardlab release --force`` may remove: only a previous release, never anything else.

Every release writes a marker file (:data:`MARKER`) listing the files it wrote. Before a
release writes anything, :func:`check_out_dir` refuses an output folder whose filling or
clearing could hurt other files (the current folder, which ``--out ""`` from an unset ``$OUT``
means, and every folder above it; the home folder and those above it; the labs folder, one
holding it or one inside it); :func:`clear_out_dir` replaces a non-empty folder only with
``--force`` and only when everything in it is listed by its marker (Python caches aside).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

CACHE_SUFFIXES = (".pyc", ".pyo")

# Written by every release: the files it wrote (what a later --force may remove).
MARKER = ".shardlab-release.json"
# Caches Python and pytest leave in a release a student ran (removable with it).
CACHE_DIRS = frozenset({"__pycache__", ".pytest_cache"})


class ReleaseError(ValueError):
    """A lab cannot be released (unbalanced markers, stub that is not valid Python, an output
    folder that must not be written or cleared, ...)."""


def _refuse(out_dir: Path, why: str) -> ReleaseError:
    return ReleaseError(f"refusing to write the release into {str(out_dir) or '.'!r}: {why}")


def check_out_dir(labs_dir: Path, out_dir: Path) -> None:
    """Refuse an output folder whose clearing or filling could hurt files release did not write.

    The current folder (``--out ""`` or ``--out .``, e.g. from an unset ``$OUT``) and every
    folder above it, the home folder and those above it, the labs folder, a folder holding
    it and a folder inside it are refused whatever ``force`` says; a file in place of the
    folder or of a folder above it as well (before anything is written).
    """
    out = out_dir.resolve()
    labs = labs_dir.resolve()
    cwd = Path.cwd().resolve()
    home = Path.home().resolve()
    if out == cwd or out in cwd.parents:
        raise _refuse(out_dir, f"{out} is the current folder or one above it; name a new folder.")
    if out == home or out in home.parents:
        raise _refuse(out_dir, f"{out} is the home folder or one above it; name a new folder.")
    if out == labs or out in labs.parents:
        raise _refuse(out_dir, f"{out} contains the labs folder {labs}.")
    if labs in out.parents:
        raise _refuse(
            out_dir, f"{out} is inside the labs folder {labs} (the next release would copy it)."
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise _refuse(out_dir, f"{out} is a file, not a folder.")
    above = next((p for p in out.parents if p.exists()), None)  # what mkdir will create in
    if above is not None and not above.is_dir():
        raise _refuse(out_dir, f"{above} is a file, so no folder can be made inside it.")


def _foreign_entries(out_dir: Path) -> list[str]:
    """Entries of ``out_dir`` that its release marker does not list (caches aside)."""
    marker = out_dir / MARKER
    try:
        listed = set(json.loads(marker.read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return ["(no readable release marker " + MARKER + ")"]
    foreign = []
    for root, dirs, names in os.walk(out_dir):
        rel_root = Path(root).relative_to(out_dir)
        for d in list(dirs):
            if (Path(root) / d).is_symlink():
                foreign.append((rel_root / d).as_posix())
                dirs.remove(d)
            elif d in CACHE_DIRS:
                dirs.remove(d)
        for name in names:
            rel = (rel_root / name).as_posix()
            if rel != MARKER and rel not in listed and not name.endswith(CACHE_SUFFIXES):
                foreign.append(rel)
    return sorted(foreign)


def clear_out_dir(labs_dir: Path, out_dir: Path, force: bool) -> None:
    """Refuse a non-empty ``out_dir`` unless ``force``; with it, clear only a previous release.

    A previous release is recognised by its marker file (:data:`MARKER`, the list of files it
    wrote): a folder without one, or holding anything the marker does not list (Python caches
    aside), is refused before anything is removed.
    """
    check_out_dir(labs_dir, out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not force:
            raise ReleaseError(
                f"output folder {out_dir} is not empty; pass --force to replace its contents."
            )
        foreign = _foreign_entries(out_dir)
        if foreign:
            raise ReleaseError(
                f"refusing to clear {out_dir} with --force: it holds {len(foreign)} entr"
                f"{'y' if len(foreign) == 1 else 'ies'} that no shardlab release wrote "
                f"(first: {foreign[0]}); --force only replaces a previous release."
            )
        shutil.rmtree(out_dir)


def write_marker(out_dir: Path, files: list[str]) -> None:
    """Record what this release wrote, so that a later ``--force`` clears exactly that."""
    text = json.dumps({"shardlab_release": 1, "files": sorted(files)}, indent=1) + "\n"
    (out_dir / MARKER).write_text(text)


def check_zip_target(zip_path: Path, force: bool) -> None:
    """Refuse to overwrite ``<out>.zip`` unless ``force`` and it is a previous kit's zip (every
    member under ``<out>/``, the kit's README among them)."""
    if not zip_path.exists() and not zip_path.is_symlink():
        return
    if not force:
        raise ReleaseError(f"{zip_path} exists; pass --force to replace a previous kit's zip.")
    top = zip_path.stem
    try:
        with zipfile.ZipFile(zip_path) as zf:
            names = zf.namelist()
    except (OSError, zipfile.BadZipFile):
        names = []
    if (
        zip_path.is_symlink()
        or not names
        or f"{top}/README.md" not in names
        or any(not n.startswith(f"{top}/") for n in names)
    ):
        raise ReleaseError(
            f"refusing to replace {zip_path} with --force: it is not a zip a shardlab release "
            "wrote."
        )
