"""Numbers in and out: parse what a person types, format bytes, times and fractions, refuse
a value derived from several fields that leaves a float's range (:func:`computable`), and
write accounting's ``name=value`` and ``ep*etp`` in a sentence as the reader knows them
(:func:`rename_values`, :func:`rename_products`).

Nothing here computes a byte count; it only reads and prints numbers that
``shardlab.accounting`` computed.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from shardlab.accounting._validate import MAX_REAL, number

EXACT = 2**53  # a float holds every integer up to here, and about 16 digits beyond


def parse_number(name: str, value: Any) -> int | float:
    """Parse ``7e9``, ``7_000_000_000`` or ``1.5e9`` into an int when integral, else a float.

    Typed text that is a whole number (``123456789012345678``, ``1.5e3``) becomes that exact
    ``int``; a Python float does when integral and at most 2^53 (where every integer is
    exact), else it stays a ``float``.

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
            exact = decimal.Decimal(text)
        except decimal.InvalidOperation:
            raise ValueError(f"{name}={value!r} is not a number") from None
        # a whole number is read exactly, digits as typed (1.23456789012345678e17 is
        # 123,456,789,012,345,678, not the float's ...680); past MAX_REAL every input is
        # refused as too large anyway, so its digits are not spelled out
        if exact.is_finite() and abs(exact) <= MAX_REAL and exact == exact.to_integral_value():
            return int(exact)
        x = float(text)
        if exact.is_finite() and not math.isfinite(x):  # 1e400: typed finite, past a float
            raise ValueError(f"{name}={text} is too large to compute with")
    if not math.isfinite(x):
        raise ValueError(f"{name}={value!r} is not a finite number")
    # a float past 2^53 no longer holds the digits it came from: it stays a float, so a
    # sentence shows it as a float, not with invented digits
    if x.is_integer() and abs(x) <= EXACT:
        return int(x)
    return x


def unit_number(name: str, value: Any, scale: float, *, allow_zero: bool = False) -> int | float:
    """``value`` as typed in a unit ``scale`` times accounting's (µs: 1e-6 s, GB/s: 1e9 bytes/s),
    checked under ``name`` before it is converted: bounded so that ``value * scale`` stays
    within accounting's bound, a bad value is refused as the reader typed it (``1e300`` µs),
    not as the converted number (``1e+294`` s). Returns the value in the typed unit."""
    x = parse_number(name, value)
    return number(name, x, allow_zero=allow_zero, maximum=MAX_REAL / max(scale, 1.0))


def value_text(x: Any) -> str:
    """A value as a sentence writes it after ``name=`` (``7,000,000,000``, ``1e-300``), so that
    :func:`rename_values` finds it and the command line can put the text typed in its place.
    A whole number past 2^53 came from a float (``1e19`` typed): it is written as that float,
    not with the digits ``int`` gives it (``1.152921504606847e+18``, not ``…846,976``)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}" if abs(x) <= EXACT else repr(float(x))
    return repr(x)


def computable(
    what: str, value: float, fields: dict[str, Any], maximum: float = MAX_REAL, unit: str = ""
) -> float:
    """``value``, a quantity a calculator derives from the typed ``fields`` (name -> value), when
    it is finite and at most ``maximum``; else a ValueError that names those fields. Each input
    is bounded on its own, but a product or quotient of bounded inputs can still overflow
    (``1e30`` bytes over ``1e-291`` bytes/s): the sentence then says which fields make it too
    large, in the reader's names (``T (tokens per rank per step) = 1e+18``), rather than
    showing ``inf`` or naming an intermediate the reader never typed (``flops=1.18e+30``)."""
    if math.isfinite(value) and abs(value) <= maximum:
        return value
    pairs = [f"{name}={value_text(x)}" for name, x in fields.items()]
    said = ", ".join(pairs[:-1]) + f" and {pairs[-1]}" if len(pairs) > 1 else pairs[0]
    size = f" {value:.3g}{unit}," if math.isfinite(value) else ""
    bound = f"2^53 = {EXACT:,}" if maximum == EXACT else f"{maximum:g}"
    raise ValueError(f"{what} from {said} would be{size} more than {bound}{unit}: too "
                     "large to compute with")


def fmt_int(x: float) -> str:
    """Bytes or counts with thousands separators; non-integers keep one decimal. A float from
    2^53 on holds only about 16 significant digits: it is shown in scientific notation rather
    than with digits it does not have."""
    if isinstance(x, float) and abs(x) >= EXACT:
        return f"{x:.6e}" if math.isfinite(x) else str(x)
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.1f}"


def fmt_round(x: float) -> str:
    """``x`` rounded to a whole number (tokens, parameters), as :func:`fmt_int`: ``round`` of a
    float from 2^53 on is an int whose last digits the float never held, so it is shown as
    the float (``2.000000e+27``, not ``2,000,000,000,000,000,013,…``)."""
    return fmt_int(round(x)) if math.isfinite(x) and abs(x) < EXACT else fmt_int(float(x))


def fmt_fixed(x: float, decimals: int) -> str:
    """``x`` with thousands separators and ``decimals`` decimals (a GB, GiB or MiB column), or,
    where those digits would reach past 2^53, the same seven significant digits as
    :func:`fmt_int`: ``9.000000e+19``, not ``90,000,000,126,000,016.00``."""
    if not math.isfinite(x) or abs(x) * 10**decimals >= EXACT:
        return f"{x:.6e}" if math.isfinite(x) else str(x)
    return f"{x:,.{decimals}f}"


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
    """``x`` as a percentage with one decimal; past the digits a float holds (a bubble of
    (p - 1) / m with p = 2^53), in scientific notation, as :func:`fmt_fixed`."""
    pct = 100.0 * x
    if math.isfinite(pct) and abs(pct) * 10 >= EXACT:
        return f"{pct:.3e} %"
    return f"{pct:.1f} %"


def fmt_time(seconds: float) -> str:
    """Seconds shown in the unit that reads best (µs, ms, s)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    if seconds * 1e3 >= EXACT:  # past the digits a float holds, as fmt_fixed
        return f"{seconds:.6e} s" if math.isfinite(seconds) else f"{seconds} s"
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


# a value as accounting writes it after ``name=``: a number (``-7000000000``, ``1,024``,
# ``1e+308``, ``inf``) or a quoted string (``'1f1b'``)
_VALUE = (
    r"(?P<value>'[^']*'|\"[^\"]*\"|[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|[-+]?inf|nan)?"
)


def rename_values(message: str, names: Iterable[str], render: Callable[[str, str], str]) -> str:
    """``message`` with each ``name=value`` of a name in ``names`` replaced by ``render(name,
    value)`` (``value`` is "" where no value follows): the one rewriting behind both surfaces,
    a widget writes the field's label, the command line the flag. Names are matched whole
    (``dp`` neither in ``dpx`` nor in ``tp*dp = 8``), longest first, in one pass, so a label
    just written is never rewritten again."""
    names = sorted(names, key=len, reverse=True)
    if not names:
        return message
    alternatives = "|".join(map(re.escape, names))
    # not after "-": a flag already written (--pp of :func:`rename_products`' --tp × --pp = 3)
    pattern = rf"(?<![\w'\[*-])(?P<name>{alternatives})(?![\w'\]*])\s*=(?!=)\s*{_VALUE}"
    return re.sub(pattern, lambda m: render(m.group("name"), m.group("value") or ""), message)


def rename_products(message: str, names: Iterable[str], label: Callable[[str], str]) -> str:
    """``message`` with each product of names as accounting writes it, ``ep*etp = 3*1``,
    written ``label(ep) × label(etp) = 3 × 1`` (``ep (expert) × etp (expert tensor)`` on a
    widget, ``--ep × --etp`` on the command line). A product is rewritten only where every
    factor is a name in ``names``, so a sentence a Python caller reads keeps its meaning
    wherever the reader's name of a factor is not known."""
    names = sorted(names, key=len, reverse=True)
    if not names:
        return message
    one = "|".join(map(re.escape, names))
    pattern = (rf"(?<![\w'\[*])(?P<names>(?:{one})(?:\*(?:{one}))+)(?![\w'\]*])"
               r"(?:(?P<eq>\s*=\s*)(?P<values>\d[\d,]*(?:\*\d[\d,]*)+))?")

    def render(m: re.Match[str]) -> str:
        out = " × ".join(label(n) for n in m.group("names").split("*"))
        if m.group("values"):
            out += m.group("eq") + " × ".join(m.group("values").split("*"))
        return out

    return re.sub(pattern, render, message)
