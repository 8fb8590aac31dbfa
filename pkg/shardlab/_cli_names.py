"""Error sentences of the command line in the reader's words: ``--ranks 1e18``, not
``group_size=1,000,000,000,000,000,000``.

``shardlab.accounting`` and the report functions name a value by their own argument
(``n_params``, ``group_size``, ``costs['F']``), which is what a Python caller passed. On the
command line the reader typed a flag and a text: :func:`flag_sentence` rewrites each
``name=value`` of a sentence into that flag and, where the value is the one typed, the text
as typed (``--params -7e9``, not ``-7000000000``). An option's destination is its own name
(``alpha_us`` is ``--alpha-us``, ``weights`` is ``--weights``); :data:`ALIASES` adds, per
command, the names accounting uses for the same value. The widgets do the same with their
field labels (:func:`shardlab.widgets._fields.name_fields`), through the same rewriting.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from shardlab.widgets._format import parse_number, rename_products, rename_values

# command -> {name in accounting's sentences: the option's destination}
ALIASES: dict[str, dict[str, str]] = {
    "memory": {"n_params": "params"},
    "activations": {"L": "layers"},
    "comm": {"group_size": "ranks", "n_params": "params", "nbytes": "bytes"},
    "bubble": {
        "p": "stages",
        "m": "microbatches",
        "v": "chunks",
        "kind": "schedule",
        **{f"costs[{k!r}]": f"cost_{k.lower()}" for k in ("F", "B", "BI", "BW")},
    },
    "mesh": {"G": "gpus"},
}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every option string of ``parser`` (``--alpha-us``) and its action."""
    return {opt: a for a in parser._actions for opt in a.option_strings}


def _flag(action: argparse.Action) -> str:
    return next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])


def typed_texts(parser: argparse.ArgumentParser, argv: Sequence[str]) -> dict[str, str]:
    """Destination -> the text typed after its option (``--x v`` or ``--x=v``; the last one
    wins, as in argparse; an unambiguous prefix such as ``--alpha`` counts, as in argparse)."""
    options, out = _options(parser), {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        opt, eq, text = token.partition("=")
        action = options.get(opt)
        if action is None:
            matches = {a for o, a in options.items() if o.startswith(opt)}
            action = matches.pop() if len(matches) == 1 else None
        if action is None or action.nargs == 0:
            continue
        if eq:
            out[action.dest] = text
        elif i + 1 < len(argv):
            out[action.dest] = argv[i + 1]
    return out


def _same(value: str, parsed: object) -> bool:
    """Whether a sentence's ``value`` text is the value argparse parsed (a derived value, such
    as the data-parallel degree of a mesh, is not)."""
    if isinstance(parsed, str):
        return value.strip("'\"") == parsed
    if isinstance(parsed, bool) or not isinstance(parsed, int | float):
        return False
    try:
        return float(parse_number("value", value)) == float(parsed)
    except (ValueError, OverflowError):
        return False


def flag_sentence(
    message: str,
    parser: argparse.ArgumentParser,
    command: str,
    args: argparse.Namespace,
    argv: Sequence[str],
) -> str:
    """``message`` with each internal ``name=value`` written as ``--flag value`` (the text
    typed where the value is the one typed); names that are no option of ``command`` stay."""
    flags = {a.dest: _flag(a) for a in parser._actions if a.option_strings}
    dests = {dest: dest for dest in flags} | ALIASES.get(command, {})
    if command == "comm" and getattr(args, "dp", None) is None:
        dests["dp"] = "ranks"  # the per-step table's D defaults to --ranks
    dests = {name: dest for name, dest in dests.items() if dest in flags and dest != "help"}
    typed = typed_texts(parser, argv)

    def render(name: str, value: str) -> str:
        dest = dests[name]
        if value and dest in typed and _same(value, getattr(args, dest, None)):
            value = typed[dest]
        elif value[:1] in "'\"" and " " not in value:
            value = value.strip("'\"")  # kind='1f1b' reads --schedule 1f1b
        return f"{flags[dest]} {value}" if value else f"{flags[dest]} = "  # ranks=dp x tp

    # a product of degrees (ep*etp = 3*1) names each factor by its flag (--ep × --etp)
    message = rename_products(message, dests, lambda name: flags[dests[name]])
    return rename_values(message, dests, render)
