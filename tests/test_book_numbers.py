"""No measured number is typed into the book's prose (the rule how_to_read.md states).

The chapters' markdown cells and the pages intro.md and how_to_read.md are the text a person
wrote. Numbers that a run measured, or that a formula computed for the chapter's example, must
reach that text from a code cell: a table a cell renders, or ``{glue:text}`` of a value a cell
glued (benchmark results come from the JSON files under ``benchmarks/results/``). This test
fails on text that *looks* measured. What it checks, outside ``$math$``, inline code and glue
or cite roles:

1. **Times**: a number (or a range) followed by ns, µs, us, ms, s, sec, seconds or minutes,
   except the stated inputs in ``ALLOWED``.
2. **Decimal percentages, ratios and factors**: a number with a decimal point followed by
   ``%``, ``×``, ``x`` or ``points``; and any *range* of percentages (``7–13 %``).
3. **Integer percentages** outside ``ALLOWED`` (stated conventions and thresholds).
4. **Decimal byte counts** (``447.1 MB``) and byte counts of five or more digits
   (``39,542,016 B``). A rate (``3.35 TB/s``, a data-sheet bandwidth) is an input.
5. **Table rows**: a markdown table row (``| ... |``) holding a decimal number.
6. **Pasted output**: a fenced block marked ``text``, ``console`` or ``output`` (or with no
   language) holding a decimal number.

A number written as a word, a count of things (8 GPUs, 32 layers), a model size (70B) and an
integer size with a unit of bytes (25 MiB buckets, 80 GB) are inputs and stay allowed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGES = [BOOK / "intro.md", BOOK / "how_to_read.md"]

# Stated inputs and conventions, not measurements: the token and why it may be typed.
ALLOWED = {
    "3 µs": "the illustrative intra-server latency α (an input of the α–β examples)",
    "10 µs": "the illustrative inter-server latency α (an input of the α–β examples)",
    "10 %": "the book's one memory reserve (a convention, planner.DEFAULT_RESERVE)",
    "90 %": "the share of device memory the reserve leaves (a convention)",
    "25 %": "the planner's default bound on the pipeline idle fraction (an option's default)",
    "7 %": "how much larger a GiB is than a GB, 2**30 / 10**9 - 1 (arithmetic, not a run)",
    "50 %": "half (chapter 7: a statement about a share, not a measured value)",
}

NUM = r"\d[\d,]*(?:\.\d+)?"
RANGE = rf"{NUM}(?:\s*(?:[–-]|to|and)\s*{NUM})?"
TIME_UNIT = r"(?:ns|µs|μs|us|ms|s|sec|secs|seconds|minutes|min)\b"
RULES = {
    "time": re.compile(rf"(?<![\w.]){RANGE}\s?{TIME_UNIT}"),
    "decimal ratio": re.compile(r"(?<![\w.])\d+\.\d+\s?(?:%|×|x\b|points\b)"),
    "percent range": re.compile(rf"(?<![\w.]){NUM}\s*[–-]\s*{NUM}\s?%"),
    "integer percent": re.compile(r"(?<![\w.,])\d+\s?%"),
    "decimal bytes": re.compile(
        r"(?<![\w.])\d+\.\d+\s?(?:B|kB|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\b(?!/)"
    ),
    "long byte count": re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3}){1,}\s?B\b|(?<![\w.,])\d{5,}\s?B\b"),
}
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+")
FENCE = re.compile(r"^(```+|~~~+)\s*\{?([\w-]*)\}?(.*)$")
STRIP = [
    re.compile(r"\$\$.*?\$\$", re.S),  # display math
    re.compile(r"(?<!\\)\$[^$\n]+\$"),  # inline math
    re.compile(r"\{(?:glue|glue:text|glue:md|glue:any|cite|cite:t|cite:p|doc|ref|numref)\}`[^`]*`"),
    re.compile(r"``[^`]+``|`[^`\n]+`"),  # inline code
    re.compile(r"\]\([^)]*\)"),  # link targets
    re.compile(r"<!--.*?-->", re.S),  # comments
]


def _texts() -> list[tuple[str, str]]:
    """(where, markdown text) for every chapter's markdown cell and the two pages."""
    out = []
    for path in sorted(BOOK.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "markdown":
                out.append((f"{path.name} cell {i}", "".join(cell["source"])))
    out += [(p.name, p.read_text()) for p in PAGES]
    return out


def violations(text: str) -> list[tuple[str, str]]:
    """(rule, offending text) for every measured-looking number in one piece of markdown."""
    found: list[tuple[str, str]] = []
    prose: list[str] = []
    fence, lang = None, ""
    for line in text.split("\n"):
        m = FENCE.match(line.strip())
        if fence is None and m:
            fence, lang = m.group(1), m.group(2).lower()
            if lang in ("admonition", "note", "warning", "tip", "important", "dropdown"):
                fence = fence + "prose"  # a directive's body is prose
            continue
        if (
            fence is not None
            and line.strip().startswith(fence.removesuffix("prose"))
            and not (m and m.group(2))
        ):
            fence = None
            continue
        if fence is not None and not fence.endswith("prose"):
            if lang in ("", "text", "console", "output"):
                found += [("pasted output", d) for d in DECIMAL.findall(line)]
            continue
        prose.append(line)
    body = "\n".join(prose)
    for pat in STRIP:
        body = pat.sub(" ", body)
    for line in body.split("\n"):
        if line.lstrip().startswith("|") and not set(line.strip()) <= set("|-: "):
            found += [("table row", d) for d in DECIMAL.findall(line)]
    for rule, pat in RULES.items():
        for m in pat.finditer(body):
            token = re.sub(r"\s+", " ", m.group(0)).replace("μs", "µs")
            if token in ALLOWED or token.replace(" ", "") in {a.replace(" ", "") for a in ALLOWED}:
                continue
            found.append((rule, token))
    return found


@pytest.mark.parametrize("where,text", _texts(), ids=[w for w, _ in _texts()])
def test_no_measured_number_is_typed(where, text):
    bad = violations(text)
    assert not bad, (
        f"{where} types measured-looking numbers {bad}: render them from a code cell (a table, "
        "or {glue:text} of a glued value; benchmark results from benchmarks/results/*.json), "
        "or, if one is a stated input, add it to ALLOWED with the reason"
    )


@pytest.mark.parametrize(
    "text,rule",
    [
        ("ours saved in 0.16× DCP's time", "decimal ratio"),
        ("gave 13.0, 13.3 and 13.8 % for GPipe", "decimal ratio"),
        ("the cores were idle 7–13 % of a step", "percent range"),
        ("a scheduler time slice, 6–7 ms, for the core", "time"),
        ("PyTorch: 0.50–0.56 s", "time"),
        ("within 2 % of the prediction", "integer percent"),
        ("447.1 MB against", "decimal bytes"),
        ("(241,135,836 B per rank", "long byte count"),
        ("| 0.86 M | 2 | DDP | 0.967 |", "table row"),
        ("```text\nsave at D=4 (ms)   60.8   371.8\n```", "pasted output"),
    ],
)
def test_the_rule_catches_typed_measurements(text, rule):
    assert rule in {r for r, _ in violations(text)}


@pytest.mark.parametrize(
    "text",
    [
        "a reserve of 10 % and α = 10 µs, β = 50 GB/s",
        "the value {glue:text}`ch03_bench_ratio` of the table",
        "$V = 2.5\\,qN$ and `alpha_beta_time(1.5)`",
        "eight GPUs, 80 GB each, 25 MiB buckets, a 70B model",
        "```python\nx = 0.5 * y\n```",
        "| layout | formula |\n|---|---|\n| DDP | $2mU$ |",
    ],
)
def test_the_rule_allows_inputs_math_code_and_glue(text):
    assert violations(text) == []


def test_benchmark_results_carry_their_provenance():
    results = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert results, "benchmarks/results/ holds the measured data the book renders"
    for path in results:
        data = json.loads(path.read_text())
        if "machine" not in data:  # a file another tool writes with its own schema
            continue
        for key in ("machine", "date", "torch", "load"):
            assert key in data, f"{path.name} lacks {key!r}"
