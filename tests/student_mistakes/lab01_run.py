"""Rank entry point of the mistake tests: lab 01's own harness over a mistaken ``collectives``.

``check(mistake, sizes)`` makes ``import collectives`` inside lab 01's ``_workers_collectives``
find ``mistake_<mistake>.py`` of this folder, then runs the harness's ``check_collectives``
exactly as lab 01's public tests do."""

from __future__ import annotations

import importlib
import sys

from _mistakes_base import LAB01


def check(mistake: str, sizes, dtype: str = "float32"):
    sys.modules["collectives"] = importlib.import_module(f"mistake_{mistake}")
    if str(LAB01) not in sys.path:
        sys.path.append(str(LAB01))
    import _workers_collectives as W

    return W.check_collectives(sizes, dtype, 0, True)
