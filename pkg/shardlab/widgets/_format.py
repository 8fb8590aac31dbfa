"""Numbers in and out: parse what a person types, format bytes, times and fractions.

Nothing here computes a byte count; it only reads and prints numbers that
``shardlab.accounting`` computed.
"""

from __future__ import annotations

import math
from typing import Any


def parse_number(name: str, value: Any) -> int | float:
    """Parse ``7e9``, ``7_000_000_000`` or ``1.5e9`` into an int when integral, else a float.

    Raises ValueError with a sentence naming ``name`` and the value.
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        x = value
    else:
        text = str(value).strip().replace("_", "").replace(",", "")
        try:
            x = float(text)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{name}={value!r} is not a finite number")
    if x.is_integer() and abs(x) < 2**62:
        return int(x)
    return x


def fmt_int(x: float) -> str:
    """Bytes or counts with thousands separators; non-integers keep one decimal. A float from
    2^53 on holds only about 16 significant digits: it is shown in scientific notation rather
    than with digits it does not have."""
    if isinstance(x, float) and abs(x) >= 2**53:
        return f"{x:.6e}" if math.isfinite(x) else str(x)
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.1f}"


def fmt_num(x: float, digits: int = 4) -> str:
    """A compact number: ``0.375``, ``1.2e-05``, ``38.5``."""
    if x == 0:
        return "0"
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    ax = abs(x)
    if ax >= 1e-3 and ax < 1e7:
        return (
            f"{x:.{digits}g}" if ax < 1 else f"{x:,.{max(digits - 2, 2)}f}".rstrip("0").rstrip(".")
        )
    return f"{x:.{digits - 1}e}"


def fmt_pct(x: float) -> str:
    return f"{100.0 * x:.1f} %"


def fmt_time(seconds: float) -> str:
    """Seconds shown in the unit that reads best (µs, ms, s)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.3f} s"


def fmt_tick_time(seconds: float) -> str:
    """Axis-tick time: ``10 µs``, ``1 ms``, ``100 s`` (powers of ten)."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if seconds >= scale * (1 - 1e-9):
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.1e} s"


def fmt_size(nbytes: float) -> str:
    """Decimal units, as bandwidths and the lecture's GB figures use them."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes:.4g} B"
