"""Shared input checks for ``shardlab.accounting``.

Every public accounting function funnels its arguments through these helpers so that a bad
input always produces a ``ValueError`` whose message names the offending value(s), e.g.
``"dp=3 does not divide G=16"``. Booleans are rejected wherever a number is expected
(``True`` is an ``int`` in Python, but ``dp=True`` is always a mistake). Integral floats such
as ``7e9`` are accepted for integer quantities and converted to ``int``, because widgets and
command lines often deliver numbers as floats.

Every input is also bounded, so that no answer overflows a float or prints invented digits:
a count (ranks, parameters, layers, tokens) is at most :data:`MAX_COUNT` = 2^53, the largest
range in which every integer is exact as a float; a real number (bytes per element, costs,
latencies, bandwidths) at most :data:`MAX_REAL` in size. The products the formulas form of
such inputs stay far below the float limit (about 1.8e308).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real

MAX_COUNT = 2**53  # 9,007,199,254,740,992: integers up to here are exact as floats
MAX_REAL = 1e30  # any physical input here is far smaller (1e30 bytes, seconds, FLOP/s)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def integer(name: str, value: object, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """Return ``value`` as an ``int`` in [``minimum``, ``maximum``] or raise ``ValueError``."""
    if type(value) is int and minimum <= value <= maximum:  # the common case, answered at once
        return value
    if _is_bool(value):
        raise ValueError(f"{name}={value!r} must be an integer, not a bool")
    if isinstance(value, Integral):
        out = int(value)
    elif isinstance(value, Real) and math.isfinite(float(value)) and float(value).is_integer():
        out = int(value)
    else:
        raise ValueError(f"{name}={value!r} must be an integer")
    if out < minimum:
        if minimum == 1:
            raise ValueError(f"{name}={out} must be a positive integer (>= 1)")
        raise ValueError(f"{name}={out} must be an integer >= {minimum}")
    if out > maximum:
        shown = f"{out:,}" if isinstance(value, Integral) else repr(value)
        if maximum == MAX_COUNT:
            raise ValueError(
                f"{name}={shown} is larger than 2^53 = {MAX_COUNT:,}, the largest count "
                "shardlab computes exactly"
            )
        raise ValueError(f"{name}={shown} must be at most {maximum:,}")
    return out


def positive_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` >= 1."""
    return integer(name, value, minimum=1)


def nonneg_int(name: str, value: object) -> int:
    """Return ``value`` as an ``int`` >= 0."""
    return integer(name, value, minimum=0)


def number(
    name: str,
    value: object,
    *,
    positive: bool = True,
    allow_zero: bool = False,
    maximum: float = MAX_REAL,
) -> float:
    """Return ``value`` as a finite real number (``int`` kept as ``int``).

    ``positive=True`` requires > 0 (or >= 0 with ``allow_zero``); ``positive=False`` accepts any
    finite real. ``maximum`` bounds the size: a caller that converts units afterwards (µs to
    s, GB/s to bytes/s) passes ``MAX_REAL`` in its own unit, so that a value too large is
    refused as the reader typed it, not as the converted number accounting would see.
    """
    kind = type(value)  # the common cases (a plain float or int in range), answered at once
    if (kind is float or kind is int) and -maximum <= value <= maximum and (
        not positive or value > 0 or (allow_zero and value == 0)
    ):
        return float(value) if kind is float else value
    if _is_bool(value):
        raise ValueError(f"{name}={value!r} must be a number, not a bool")
    too_large = f"{name}={value!r} is larger than {maximum:g}, too large to compute with"
    if isinstance(value, Integral) and abs(value) > maximum:
        raise ValueError(too_large)
    if not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if abs(float(value)) > maximum:
        raise ValueError(too_large)
    if positive:
        if allow_zero and value < 0:
            raise ValueError(f"{name}={value!r} must be >= 0")
        if not allow_zero and value <= 0:
            raise ValueError(f"{name}={value!r} must be > 0")
    return int(value) if isinstance(value, Integral) else float(value)


def nonneg_number(name: str, value: object, maximum: float = MAX_REAL) -> float:
    """Return ``value`` as a finite real >= 0."""
    return number(name, value, allow_zero=True, maximum=maximum)


def flag(name: str, value: object) -> bool:
    """Require a real ``bool`` (so ``sp=1`` or ``sp="no"`` is caught)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be True or False")
    return value


def choice(name: str, value: object, options: Iterable[str]) -> str:
    """Require ``value`` to be one of ``options``."""
    opts = tuple(options)
    if not isinstance(value, str) or value not in opts:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(map(repr, opts))}")
    return value


def divides(div_name: str, div: int, total_name: str, total: int) -> None:
    """Require ``div`` to divide ``total`` exactly."""
    if total % div != 0:
        raise ValueError(f"{div_name}={div} does not divide {total_name}={total}")
