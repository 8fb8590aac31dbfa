"""``shardlab`` command line: the calculators as aligned tables (default) or JSON (``--json``).

    shardlab memory --params 7e9 --dp 8 --recipe mixed-adam-16
    shardlab activations --s 2048 --b 1 --h 4096 --a 32 --t 8 --layers 32
    shardlab comm --op all_reduce --bytes 1e9 --ranks 8 --alpha-us 5 --beta-gbps 100
    shardlab comm --layout zero3 --params 7e9 --dp 8 --q 2
    shardlab bubble --stages 4 --microbatches 8 [--schedule interleaved --chunks 2]
    shardlab mesh --gpus 16384 --tp 8 --cp 1 --pp 16 --dp 128 [--rank 12345]
    shardlab plan [--preset llama3-405b-128k] [--json]
    shardlab train --layout fsdp --model tiny --ranks 2 --steps 10 [--json]

Every number comes from ``shardlab.accounting`` through the same report functions the
widgets render (``shardlab.widgets.*_report``). Bad input prints one sentence,
``shardlab <command>: <what is wrong>``, to stderr and exits with status 2; the sentence names
each value by its flag and the text typed (``--ranks 1e18``), not by accounting's name for it
(:mod:`shardlab._cli_names`). Under torchrun only rank 0 prints it, usage errors included.

The subcommands' arguments are declared in :mod:`shardlab._cli_parsers`, their handlers in
:mod:`shardlab._cli_commands`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from shardlab._cli_parsers import add_calculator_parsers, add_train_parser


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line and exit 2 (no usage dump), and which
    takes ``-7e9`` or ``-1_000`` for a (negative) value, not an option, so that the value is
    refused with its own sentence."""

    NEGATIVE = re.compile(r"^-(?:\d[\d_,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = self.NEGATIVE  # argparse's own misses -7e9

    def error(self, message: str) -> NoReturn:
        # under torchrun every rank parses the same command line: one rank says it
        said = f"{self.prog}: {message} (see {self.prog} --help)\n"
        self.exit(2, said if _first_process() else None)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="shardlab",
        description="Calculators of the shardlab textbook: model-state memory, saved "
        "activations, communication (α–β), pipeline bubbles, device meshes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    add_calculator_parsers(sub)
    add_train_parser(sub)  # shardlab train: a lab's layout on real ranks (shardlab.train)

    # --- hook: `shardlab release` / `shardlab grade` (owned by shardlab.grading) ----------
    try:
        from shardlab.grading.cli import add_parsers
    except ImportError:
        add_parsers = None
    if add_parsers is not None:
        add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; a reader that closes the pipe early (``| head``) ends it quietly."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("\nshardlab: interrupted (Ctrl-C).", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Python flushes stdout again at exit, which would raise a second time: point the
        # descriptor at /dev/null first. 141 = 128 + SIGPIPE, what a shell reports for tools
        # that die of the signal, so `set -o pipefail` scripts still see the early end.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    prog = f"shardlab {args.command}"
    try:
        result: Any = args.func(args)
    except (ValueError, TypeError, OSError, OverflowError, MemoryError) as exc:
        if _first_process():
            print(f"{prog}: {_in_flags(_sentence(exc), parser, args, argv)}", file=sys.stderr)
        return 2
    if result is None or isinstance(result, int):  # subcommands that print themselves
        return int(result or 0)
    from shardlab.widgets._common import text_report

    if getattr(args, "json", False):
        print(json.dumps(_finite(result.data), indent=2, default=_jsonable, allow_nan=False))
    else:
        sys.stdout.write(text_report(result))
    return 0


def _first_process() -> bool:
    """False on every torchrun process but rank 0: a bad input is reported once, not per rank."""
    return os.environ.get("RANK", "0") == "0" or "WORLD_SIZE" not in os.environ


def _in_flags(
    message: str, parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]
) -> str:
    """``message`` with accounting's argument names (``group_size=0``) written as the flags and
    texts the reader typed (``--ranks 0``): :mod:`shardlab._cli_names`."""
    from shardlab._cli_names import flag_sentence

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return flag_sentence(message, sub.choices[args.command], args.command, args, argv[1:])


def _sentence(exc: BaseException) -> str:
    """The error as a sentence: an OSError without its ``[Errno N]`` prefix; an overflow or
    exhausted memory as what it means for the inputs (a safety net behind the validation)."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename is not None else ""
        return f"{exc.strerror.lower()}{where}."
    if isinstance(exc, OverflowError):
        return f"the inputs are too large to compute with ({exc}); use smaller values."
    if isinstance(exc, MemoryError):
        return "the inputs need more memory than this machine has; use smaller values."
    return str(exc)


def _finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinity replaced by None, so the JSON output is valid JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, set | frozenset | tuple):
        return sorted(obj) if isinstance(obj, set | frozenset) else list(obj)
    return str(obj)


if __name__ == "__main__":
    sys.exit(main())
