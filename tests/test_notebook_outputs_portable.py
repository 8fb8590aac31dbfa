"""No compared notebook output shows a rounding-level number (issue 23).

nbval compares stored outputs on other machines, where PyTorch's kernels (AVX2, AVX512, ARM,
the thread count) change the last bits of results. A number such as ``max |diff| = 3.3e-16``
or ``7.3 ulps`` is therefore different on the next laptop although nothing is wrong; cells
print ``shardlab.verdict``'s verdict against their tolerance instead. This test reads the
stored outputs of every compared cell (not tagged ``nbval-ignore-output`` / ``nbval-skip``)
and fails on any number in scientific notation with an exponent of -5 or below (``2.4e-07``,
``1e-06``), the form rounding-level differences were printed in; bounds print as powers of
ten (``10⁻⁶``, ``shardlab.verdict.sci``), so a tolerance is never mistaken for a measured
magnitude. ``make test-slow`` checks the real thing: nbval again with other kernels and one
thread.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(
    p
    for p in [*ROOT.glob("book/*.ipynb"), *ROOT.glob("labs/*/*.ipynb")]
    if ".ipynb_checkpoints" not in p.parts
)
# 2.4e-07, 1.0e-16, 1e-06: any mantissa, an exponent of -5 or below
ROUNDING = re.compile(r"\b\d+(\.\d+)?e-(0[5-9]|[1-9]\d)\b")


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return "".join(output.get("text", ""))
    data = output.get("data", {})
    return "".join("".join(data.get(k, "")) for k in ("text/plain", "text/markdown", "text/html"))


def _compared_outputs(path: Path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if tags & {"nbval-ignore-output", "nbval-skip"}:
            continue
        for out in cell.get("outputs", []):
            yield i, _text(out)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_rounding_level_number_in_a_compared_output(path):
    bad = [
        f"code cell {i}: …{text[max(0, m.start() - 50) : m.end() + 10]}…"
        for i, text in _compared_outputs(path)
        for m in ROUNDING.finditer(text)
    ]
    assert not bad, (
        f"{path.relative_to(ROOT)} stores rounding-level numbers in compared outputs; print "
        "shardlab.verdict.within(value, bound) instead (the value depends on the CPU; bounds as sci()):\n"
        + "\n".join(bad[:10])
    )


def test_the_pattern_tells_rounding_from_tolerances():
    assert ROUNDING.search("max |diff| = 3.33e-16") and ROUNDING.search("gap 7.7e-07")
    assert ROUNDING.search("≤ 1e-06 ✓")  # looks like a magnitude: bounds print as 10⁻⁶
    assert not ROUNDING.search("≤ 10⁻⁶ ✓") and not ROUNDING.search("lr = 1e-2")
    assert not ROUNDING.search("3.9e-03 bf16 resolution")  # coarse values are not rounding
