"""Number fields and reader-facing error sentences for the calculators (:func:`build_calculator`).

ipywidgets' ``IntText`` drops the ``e`` and ``.`` keystrokes in the browser (``1e9`` typed into
it becomes ``19``, silently) while a ``Text`` field accepts ``7e9``. :class:`NumberField` is a
text box on the page whose Python ``value`` stays a number, so every field accepts the same
notations (``8``, ``1e9``, ``7_000_000_000``, ``2,048``); text that is not a number, or a
fraction in a whole-number field, is refused with a sentence naming the field as the reader
sees it. It recomputes on Enter or when the field loses focus, never on every keystroke.

:func:`as_number_fields` swaps a calculator's ``IntText``/``FloatText`` controls for number
fields (same description, value and layout, widened so the value shows in full);
:func:`name_fields` rewrites the internal argument names of an error sentence (``dp=0``,
``group_size=0``, ``costs['F']=-1``) into the field labels (``D (data-parallel ranks) = 0``).
"""

from __future__ import annotations

import re
from typing import Any

import ipywidgets as w
import traitlets

from ._format import parse_number, rename_products, rename_values

# pixels per character of a description (13 px sans-serif) and the room the value needs
_CHAR_PX = 7.2
_VALUE_PX = 96


def _to_text(value: Any, _widget: Any = None) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.12g}"


def _from_text(text: Any, _widget: Any = None) -> Any:
    """What the reader typed: a number when it parses, else the text itself (refused later)."""
    try:
        return parse_number("value", text)
    except ValueError:
        return text


class NumberField(w.Text):
    """A text box whose ``value`` is a number in Python (the raw text when it does not parse)."""

    value = traitlets.Any(0).tag(sync=True, to_json=_to_text, from_json=_from_text)
    integer = traitlets.Bool(False)  # Python only: a whole number is required

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("continuous_update", False)
        super().__init__(**kwargs)


def field_width(description: str, current: str | None = None) -> str:
    """A width that shows the whole description and a value of about ten characters."""
    need = round(len(description) * _CHAR_PX + _VALUE_PX)
    m = re.fullmatch(r"(\d+)px", current or "")
    return f"{max(need, int(m.group(1))) if m else need}px"


def as_number_fields(controls: dict[str, Any]) -> None:
    """Replace every ``IntText``/``FloatText`` of ``controls`` by a :class:`NumberField`, in
    place; widen text fields whose value would be cut off."""
    for name, c in list(controls.items()):
        if isinstance(c, w.IntText | w.FloatText):
            field = NumberField(
                value=c.value,
                description=c.description,
                integer=isinstance(c, w.IntText),
                layout=w.Layout(width=field_width(c.description, c.layout.width)),
            )
            c.close()
            controls[name] = field
        elif isinstance(c, w.Text):
            c.continuous_update = False  # recompute on Enter or blur, not per keystroke
            c.layout.width = field_width(c.description, c.layout.width)


def read_number(label: str, field: NumberField) -> int | float:
    """The field's number, or a ValueError sentence naming the field by its label."""
    value = field.value
    try:
        x = parse_number(label, value)
    except ValueError:
        raise ValueError(f"{label}: {str(value)!r} is not a number") from None
    if field.integer and not float(x).is_integer():
        raise ValueError(f"{label}: {value!r} is not a whole number")
    return x


def name_fields(message: str, labels: dict[str, str]) -> str:
    """``message`` with each ``name=value`` of an internal name in ``labels`` written as
    ``label = value``; names are matched whole (``dp`` does not match ``dpx``). The value is
    the field's own: a calculator that converts units checks a field before converting it
    (:func:`~._format.unit_number`), so the number shown is the one typed. A product of
    names (``ep*etp = 3*1``) is written with the labels too (``ep (expert) × etp (expert
    tensor) = 3 × 1``)."""
    message = rename_products(message, labels, labels.__getitem__)
    return rename_values(message, labels, lambda name, value: f"{labels[name]} = {value}")
