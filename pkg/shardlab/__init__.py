"""shardlab: the helper package of an executable textbook on model sharding.

Subpackages:
    accounting  pure-Python formulas (the one copy of every byte count and bubble fraction)
    widgets     ipywidgets calculators over ``accounting``
    dist        launcher for N ranks, communication and memory instruments
    models      small GPT-style transformer used by labs and tests
    grading     student release and autograder
"""

__version__ = "0.1.0"
