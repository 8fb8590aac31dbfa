"""Property-based test of the calculators' command line (issue 30): whatever the arguments,
``shardlab memory / activations / comm / bubble / mesh / train`` answers within a time bound
either with a result (exit 0; with ``--json``, valid JSON: no NaN or Infinity) or with one
sentence ``shardlab <command>: ...`` on stderr (exit 2) — never a traceback, a hang, or the
command line's overflow / out-of-memory safety net (the inputs are validated before that);
the sentence names a value by its flag (``--ranks 0``), never by accounting's name for it
(``group_size=0``).

The options and their choices are read from the parser itself, so a new option is covered
without editing this file. Values mix valid numbers, every notation (``7e9``, ``7_000``),
huge and tiny magnitudes, negatives, ``nan``/``inf`` and non-numbers. ``shardlab train`` runs
its validation only: ``shardlab.train.main.run`` is replaced by a stub, so no rank starts.
``plan`` is left to the planner's own tests; ``release`` and ``grade``, which write files, are
covered in scratch folders by test_cli_inputs_property_instructor.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import signal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from shardlab import cli
from shardlab._cli_commands import _number
from shardlab._cli_names import ALIASES

COMMANDS = ("memory", "activations", "comm", "bubble", "mesh", "train")
SKIP_OPTIONS = {"--help", "--module", "--labs", "--from-cwd"}  # paths: not this test's topic
SECONDS = 3.0  # per case; every answer is due within 1 s on an idle machine
NUMBERS = (
    "0", "1", "2", "3", "4", "8", "16", "-1", "8.5", "0.5", "1e4", "1e6", "1e9", "1e18", "1e100",
    "1e200", "1e306", "1e308", "-7e9", "nan", "inf", "-inf", "1e-300", "7_000_000_000", "1,024",
    "x", "", "2**62", "4611686018427387904", "9007199254740993",
)


def _sub(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _number_text() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NUMBERS),
        st.integers(-(10**3), 10**20).map(str),
        st.builds(lambda m, e: f"{m}e{e}", st.integers(-9, 9), st.integers(-320, 320)),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )


def _value(action: argparse.Action) -> st.SearchStrategy[list[str]]:
    flag = action.option_strings[0]
    if action.nargs == 0:  # store_true and friends
        return st.just([flag])
    if action.choices:
        return st.sampled_from([*map(str, action.choices), "bogus"]).map(lambda v: [flag, v])
    if action.type is _number:
        return _number_text().map(lambda v: [flag, v])
    return st.sampled_from(["tiny", "small", "ddp", "fsdp+tp", "x"]).map(lambda v: [flag, v])


@st.composite
def argv(draw, command: str) -> list[str]:
    out = [command]
    for action in _sub(command)._actions:
        if not action.option_strings or set(action.option_strings) & SKIP_OPTIONS:
            continue
        if draw(st.floats(0, 1)) < (0.9 if action.required else 0.35):
            out += draw(_value(action))
    return out


class _TooSlow(Exception):
    pass


def _alarm(signum, frame):  # shared with test_cli_inputs_property_instructor (its own bound)
    raise _TooSlow("no answer within the per-case bound (SECONDS of the test module)")


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(args)
            except SystemExit as exc:  # argparse's usage errors (our _Parser: one line)
                rc = exc.code
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return rc, out.getvalue(), err.getvalue()


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _check(args: list[str]) -> None:
    rc, out, err = _run(args)
    command = args[0]
    if rc == 0:
        assert out.strip() and not err.strip(), (args, err)
        if "--json" in args and command != "train":
            _strict_json(out)
        return
    assert rc == 2, (args, rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, (args, err)
    assert lines[0].startswith(f"shardlab {command}: ") or lines[0].startswith("shardlab: "), (
        args,
        err,
    )
    assert "Traceback" not in err
    assert "too large to compute with (" not in err and "more memory than" not in err, (args, err)
    leaked = _internal_name.get(command) and _internal_name[command].search(err)
    assert not leaked, (args, err)  # the flag, not accounting's name (``group_size=0``)


def _internal_names(command: str) -> re.Pattern[str]:
    """``name=`` of an option's destination or of a name accounting uses for it, written as
    accounting writes it (not inside a product such as ``tp*cp*pp = 8``)."""
    names = [a.dest for a in _sub(command)._actions if a.option_strings]
    names += list(ALIASES.get(command, {}))
    alternatives = "|".join(map(re.escape, sorted(names, key=len, reverse=True)))
    return re.compile(rf"(?<![\w'\[*-])(?:{alternatives})(?![\w'\]*])\s*=(?!=)")


_internal_name = {c: _internal_names(c) for c in COMMANDS}


@pytest.fixture(autouse=True)
def _no_ranks(monkeypatch):
    """``shardlab train``'s validation only: a spec that passes it prints a line, no rank."""
    import shardlab.train.main as train_main

    def fake_run(spec, as_json=False, timeout=900.0):
        assert spec.batch * spec.shape.seq_len <= 2**24 and timeout > 0
        print(f"would train {spec.layout} on {spec.ranks} ranks")
        return 0

    monkeypatch.setattr(train_main, "run", fake_run)


SETTINGS = settings(
    max_examples=50,
    deadline=None,  # the per-case bound is SECONDS, enforced with an alarm
    derandomize=True,  # the same cases on every run: CI stays deterministic
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(args=argv("memory"))
@example(args=["memory", "--params", "1", "--dp", "1e4", "--layout", "zero3"])
@example(args=["memory", "--params", "1", "--dp", "1e18"])
@example(args=["memory", "--params", "1e308", "--weights", "1e10"])
@example(args=["memory", "--params", "-7e9"])
@example(args=["memory", "--params", "1e100", "--dp", "1", "--json"])
def test_memory(args):
    _check(args)


@SETTINGS
@given(args=argv("activations"))
@example(args=["activations", "--h", "1e306", "--a", "1"])
@example(args=["activations", "--s", "1e200", "--b", "1e200"])
def test_activations(args):
    _check(args)


@SETTINGS
@given(args=argv("comm"))
@example(args=["comm", "--params", "1e308", "--q", "1e10"])
@example(args=["comm", "--alpha-us", "1e308", "--ranks", "1e18"])
@example(args=["comm", "--alpha-us", "1e29", "--ranks", "9e15", "--bytes", "1e29"])
@example(args=["comm", "--no-sync"])
def test_comm(args):
    _check(args)


@SETTINGS
@given(args=argv("bubble"))
@example(args=["bubble", "--stages", "4", "--microbatches", "8", "--cost-f", "1e308",
               "--cost-b", "1e308", "--json"])
@example(args=["bubble", "--stages", "4", "--microbatches", "8", "--cost-f", "1e30",
               "--cost-b", "1e30", "--json"])
@example(args=["bubble", "--stages", "9e15", "--microbatches", "9e15", "--json"])
def test_bubble(args):
    _check(args)


@SETTINGS
@given(args=argv("mesh"))
@example(args=["mesh", "--gpus", "1e9"])
@example(args=["mesh", "--gpus", "9e15", "--rank", "12345", "--ep", "8", "--json"])
@example(args=["mesh", "--gpus", "8.5"])
def test_mesh(args):
    _check(args)


@SETTINGS
@given(args=argv("train"))
@example(args=["train", "--layout", "ddp", "--batch", "1e18"])
@example(args=["train", "--layout", "ddp", "--seq", "1e9"])
@example(args=["train", "--layout", "ddp", "--threads", "1e9"])
@example(args=["train", "--layout", "ddp", "--schedule", "gpipe"])
def test_train_validation(args):
    _check(args)


def test_the_issues_inputs_get_their_own_sentences():
    """The answers the property only bounds, pinned for the cases issue 30 names."""
    cases = {
        ("memory", "--params", "-7e9"): "--params -7e9 must be a positive integer",
        ("mesh", "--gpus", "8.5"): "--gpus 8.5 must be an integer",
        ("mesh", "--gpus", "8", "--etp", "2"): "--etp 2 applies to MoE folding only",
        ("comm", "--dp", "4"): "--dp applies to the per-step volume",
        ("comm", "--params", "7e9", "--bytes", "1e9"): "--bytes applies to the collective table",
        ("bubble", "--stages", "4", "--microbatches", "8", "--cost-bi", "3"):
            "--cost-bi applies to no action of schedule 1f1b",
        ("memory", "--params", "1e100"): "larger than 2^53",
        ("train", "--layout", "ddp", "--schedule", "gpipe"): "applies to layout pp only",
    }
    for args, words in cases.items():
        rc, _, err = _run(list(args))
        assert rc == 2 and words in err, (args, err)
    rc, out, _ = _run(["memory", "--params", "1", "--dp", "1e4", "--layout", "zero3", "--json"])
    assert rc == 0 and _strict_json(out)["dp"] == 10_000
