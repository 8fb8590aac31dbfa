"""How a rank finds the function to run: the caller names it, the fresh interpreter imports it.

:func:`_locate` (caller side) turns a function object or a ``"module:function"`` string into
``(module, qualname, folder)`` and rejects what a new interpreter could not import (functions
of ``__main__``, lambdas, nested functions). :func:`_resolve` (rank side) imports the module
and walks the qualname back to the function.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys


def _resolve(module: str, qualname: str):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _locate(fn) -> tuple[str, str, str | None]:
    """Return (module, qualname, folder of the module file) for ``fn``."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(
                f"fn={fn!r} is not of the form 'module:function' (for example "
                "'collectives:worker'); pass the string with a colon or the function object."
            )
        module, qualname = fn.split(":", 1)
        if not module or not qualname:
            raise ValueError(f"fn={fn!r} needs both a module and a function name around ':'.")
        folder = None
        try:
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.origin and os.path.isfile(spec.origin):
                folder = os.path.dirname(os.path.abspath(spec.origin))
        except (ImportError, ValueError):
            pass
        return module, qualname, folder
    if not callable(fn):
        raise TypeError(f"fn must be a 'module:function' string or a function, got {fn!r}.")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", None))
    name = getattr(fn, "__name__", repr(fn))
    if module in (None, "__main__", "__mp_main__") or (module or "").startswith("__ipython"):
        raise ValueError(
            f"Function {name!r} is defined in __main__ (a notebook cell or the script being run), "
            "so the rank processes, which are fresh Python interpreters, cannot import it. "
            "Move it into a .py file next to the notebook (for example workers.py) and pass "
            f"workers.{name} or the string 'workers:{name}'."
        )
    if qualname is None or "<locals>" in qualname or "<lambda>" in qualname:
        raise ValueError(
            f"Function {name!r} (qualname {qualname!r}) is a lambda or is defined inside another "
            "function, so the rank processes cannot import it by name; define it at the top "
            f"level of module {module!r}."
        )
    folder = None
    mod = sys.modules.get(module)
    mfile = getattr(mod, "__file__", None) if mod is not None else None
    if mfile:
        folder = os.path.dirname(os.path.abspath(mfile))
        # a top-level module file: its folder must be on sys.path; a package: the folder above
        # the package root
        depth = module.count(".")
        for _ in range(depth):
            folder = os.path.dirname(folder)
    return module, qualname, folder
