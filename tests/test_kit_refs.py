"""Released labs link the book by URL (or by title) and name only what the kit contains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shardlab.grading import _kitrefs
from shardlab.grading.kit import release_kit
from shardlab.grading.release import ReleaseError, release, released_files

ROOT = Path(__file__).resolve().parents[1]


def _nb(*markdown: str) -> str:
    cells = [{"cell_type": "markdown", "metadata": {}, "source": m} for m in markdown]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def _tree(tmp_path: Path, *markdown: str, config: str = "") -> Path:
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "01_demo.ipynb").write_text(_nb("# 1. Demo chapter\n\ntext"))
    for lab in ("01_demo", "02_other"):
        (tmp_path / "labs" / lab).mkdir(parents=True)
        (tmp_path / "labs" / lab / "lab.ipynb").write_text(_nb("# lab"))
    (tmp_path / "labs" / "01_demo" / "lab.ipynb").write_text(_nb(*markdown))
    if config:
        (tmp_path / "_config.yml").write_text(config)
    return tmp_path / "labs"


def _markdown(files: dict[str, bytes], rel: str = "01_demo/lab.ipynb") -> str:
    return "".join("".join(c["source"]) for c in json.loads(files[rel])["cells"])


def test_the_real_labs_release_without_a_dangling_reference():
    files = released_files(ROOT / "labs")  # raises ReleaseError on any dangling reference
    assert not _kitrefs.dangling(files)
    text = "".join(_markdown(files, rel) for rel in files if rel.endswith("lab.ipynb"))
    assert "{doc}" not in text and "../../book" not in text
    assert "*1. Collectives" in _markdown(files, "01_collectives/lab.ipynb")


def test_book_links_become_titles_or_urls(tmp_path):
    labs = _tree(tmp_path, "See the chapter {doc}`../../book/01_demo`, [1](../../book/01_demo.ipynb)"
                 " and {doc}`the other lab <../02_other/lab>`.")
    words = _markdown(released_files(labs))
    assert words == ("See the chapter *1. Demo chapter*, *1. Demo chapter* and "
                     "[the other lab](../02_other/lab.ipynb).")
    linked = _markdown(released_files(labs, book_url="https://example.org/book/"))
    assert linked == ("See the chapter [1. Demo chapter](https://example.org/book/01_demo.html), "
                      "[1](https://example.org/book/01_demo.html) and "
                      "[the other lab](../02_other/lab.ipynb).")


def test_the_book_url_comes_from_config(tmp_path):
    labs = _tree(tmp_path, "{doc}`x <../../book/01_demo>`",
                 config="title: t\nhtml:\n  use_issues_button: false\n  baseurl: 'https://b.example/'\n")
    assert _markdown(released_files(labs)) == "[x](https://b.example/01_demo.html)"


@pytest.mark.parametrize(
    "markdown, needle",
    [
        ("see {ref}`sec-ring`", "MyST role {ref}`"),
        ("run `tests/test_wire_collectives.py`", "names tests/test_wire_collectives.py"),
        ("[notes](../03_missing/notes.md)", "link to ../03_missing/notes.md"),
        ("{doc}`../09_gone/lab`", "link to ../09_gone/lab.ipynb"),
    ],
)
def test_a_dangling_reference_stops_the_release(tmp_path, markdown, needle):
    labs = _tree(tmp_path, markdown)
    with pytest.raises(ReleaseError, match="cannot resolve") as exc:
        release(labs, tmp_path / "out")
    assert needle in str(exc.value)
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_kit_may_name_what_it_ships(tmp_path):
    labs = _tree(tmp_path, "the launcher is `pkg/shardlab/runtime/launch.py`; [README](../../README.md)")
    release_kit(labs, tmp_path / "kit")
    with pytest.raises(ReleaseError, match="names pkg/shardlab/runtime/launch.py"):
        release(labs, tmp_path / "labs-only")  # the labs alone do not ship the package
