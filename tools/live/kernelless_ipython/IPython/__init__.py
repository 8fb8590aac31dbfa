"""IPython as a page without a kernel sees it: the five names ipywidgets and comm import.

The live calculators run ipywidgets in Pyodide with no IPython shell and no kernel
(``tools/live/shardlab-worker.js``; the widget messages go over a comm bridge of
``shardlab.widgets.live``). ipywidgets and comm import only ``get_ipython``,
``IPython.display.display`` / ``clear_output`` and ``IPython.core.interactiveshell
.InteractiveShell`` from IPython, to reach a shell when there is one. Outside a shell the
real IPython answers ``get_ipython() is None`` and ipywidgets then never calls the rest, so
this package gives the same answers without importing IPython's 66 modules and the eight
packages it depends on (about 0.7 s of a first visit in Pyodide, 2.6 MB of wheels). It is
built into the page's Python only (``tools/build_live.py``); notebooks and the CLI use the
real IPython. ``tests/test_live_rebuild.py`` rebuilds every stored calculator with it.
"""

__version__ = "0+kernelless"


def get_ipython():
    """No shell in this Python (what IPython itself returns outside one)."""
    return None
