"""What a student may read in ``results.json``: only messages the instructor's tests wrote.

A failure message from pytest is text the submission controls: an exception it raises can
carry anything it read inside the sandbox (the hidden tests are there, they must run). So
the student-facing feedback keeps a message only when it is

* the message of an ``assert`` (``assert x, "..."``), of ``pytest.fail/skip/xfail("...")``
  or of a ``raise SomeError("...")`` written in the instructor's test files of the lab, as
  a string literal or an f-string with at most one field, which matched one number of at
  most four characters (or True/False/None);
* the hint of a solution block of the lab's ``submit`` modules (the released stub raises
  ``NotImplementedError("<hint>")``);

and otherwise only the exception's name when it is a built-in exception (``AssertionError``,
``ValueError``, ...). pytest's assertion introspection (``assert 3 == 4``, ``where ...``) is
never passed on: it prints values the submission computed. The instructor's files
(grades.csv, summary.csv, junit.xml, logs/) keep the full messages.
"""

from __future__ import annotations

import ast
import builtins
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from ._fs import TreeError, read_regular
from .release import find_blocks
from .rubric import Rubric, sandbox_files

WITHHELD = "message not shown: it did not come from the tests"
# A field of an f-string message may show one short number: at most MAX_NUMBER_CHARS
# characters of ``0-9 . e E + -`` (or True/False/None/inf/nan), and a message at most
# MAX_FIELDS such fields. With these caps a message says at most ~16 bits beyond which of the
# tests' messages it is (see :func:`feedback_bits`), so a submission cannot pass a file it
# read in the sandbox (the hidden tests, an earlier lab's reference) to its student as digits.
MAX_NUMBER_CHARS = 4
MAX_FIELDS = 1
_NUMBER = rf"(?:[-+.0-9eE]{{1,{MAX_NUMBER_CHARS}}}|True|False|None|[-+]?inf|nan)"
_NUMBER_VALUES = 16**MAX_NUMBER_CHARS  # an upper bound of the strings _NUMBER matches
_BUILTIN_EXC = {
    name
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, BaseException)
}
_PYTEST_OUTCOMES = {"Failed", "Skipped", "XFailed"}
_MESSAGE_CALLS = {"fail", "skip", "xfail", "importorskip"}


@dataclass
class Allowed:
    literals: set[str] = field(default_factory=set)
    patterns: list[re.Pattern] = field(default_factory=list)

    def match(self, text: str) -> bool:
        text = text.strip()
        if not text:
            return False
        if text in self.literals:
            return True
        return any(p.fullmatch(text) for p in self.patterns)


def _add(node: ast.AST | None, allowed: Allowed) -> None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        for line in node.value.splitlines()[:1]:
            if line.strip():
                allowed.literals.add(line.strip())
    elif isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(re.escape(value.value))
            else:
                parts.append(_NUMBER)
        pattern = "".join(parts).split("\\\n")[0].strip()
        shown_fields = pattern.count(_NUMBER)
        if pattern and pattern != _NUMBER and shown_fields <= MAX_FIELDS:
            allowed.patterns.append(re.compile(pattern))


def _from_test_source(source: str, allowed: Allowed) -> None:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            _add(node.msg, allowed)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _MESSAGE_CALLS or name in _BUILTIN_EXC:
                for arg in node.args[:1]:
                    _add(arg, allowed)
                for kw in node.keywords:
                    if kw.arg in ("reason", "msg"):
                        _add(kw.value, allowed)


def allowed_messages(test_files: list[Path], submit_modules: list[Path]) -> Allowed:
    """Messages of the instructor's test files and hints of the reference modules."""
    allowed = Allowed()
    for path in test_files:
        try:
            _from_test_source(read_regular(path, 4 * 2**20).decode("utf-8", "replace"), allowed)
        except TreeError:
            continue
    for path in submit_modules:
        try:
            source = read_regular(path, 4 * 2**20).decode("utf-8", "replace")
            allowed.literals.update(b.hint for b in find_blocks(source, str(path)))
        except (TreeError, ValueError):
            continue
    return allowed


def safe_message(message: str, allowed: Allowed) -> str:
    """The first line of a failure message if the tests wrote it; else a neutral sentence."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[0]
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_.]*)(?::\s?(.*))?$", line, re.S)
    if m:
        name = m.group(1).rsplit(".", 1)[-1]
        rest = (m.group(2) or "").strip()
        if name in _BUILTIN_EXC or name in _PYTEST_OUTCOMES:
            if not rest:
                return name
            if allowed.match(rest):
                return f"{name}: {rest}"
            return f"{name} ({WITHHELD})"
    if allowed.match(line):
        return line
    return f"({WITHHELD})"


def feedback_bits(allowed: Allowed, cases: int) -> float:
    """Upper bound of the bits one rubric test's feedback line can carry beyond its score.

    The line is: a status (one of 13), "k/n cases passed" (k <= n: the score itself), which
    case failed first (one of ``cases``), and one message: a literal or a pattern of the
    tests (each pattern with at most MAX_FIELDS numbers of at most MAX_NUMBER_CHARS
    characters), or a built-in exception's name, alone or with "message not shown".
    """
    choices = len(allowed.literals) + len(allowed.patterns) * _NUMBER_VALUES**MAX_FIELDS
    choices += 2 * (len(_BUILTIN_EXC) + len(_PYTEST_OUTCOMES)) * (1 + choices) + 1
    return math.log2(13) + math.log2(max(cases, 1)) + math.log2(choices)


def lab_feedback(rubric: Rubric) -> Allowed:
    """Messages the lab's tests and hints may show to students (see :mod:`._feedback`)."""
    tests = [p for n, p in sandbox_files(rubric).items() if Path(n).name.startswith("test")]
    modules = [rubric.lab_dir / f for f in rubric.submit]
    return allowed_messages(tests, modules)
