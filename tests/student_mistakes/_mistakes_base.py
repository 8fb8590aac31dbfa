"""Load lab 01's reference ``collectives.py`` by path (under another name), so each mistake
module below can keep the reference functions and replace one with a student's mistake."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

LAB01 = pathlib.Path(__file__).resolve().parents[2] / "labs" / "01_collectives"


def reference():
    """Lab 01's ``collectives.py`` (the reference solution), imported once as
    ``_lab01_reference_collectives``."""
    name = "_lab01_reference_collectives"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, LAB01 / "collectives.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
