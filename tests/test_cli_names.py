"""The command line's sentences in the reader's words (issue 30): a bad value is named by the
flag and the text typed (``--ranks 1e18``), never by accounting's argument name
(``group_size=``) or a converted value (``alpha=9.999999999999999e+301`` seconds); a usage
error is printed by one torchrun rank; a GB, GiB or MiB column prints no digit a float does
not hold."""

from __future__ import annotations

import json
import re

import pytest
from shardlab import cli
from shardlab.widgets._format import (
    EXACT,
    fmt_fixed,
    fmt_time,
    rename_products,
    rename_values,
)

# argv -> (what the sentence must say, internal names it must not)
CASES = {
    ("comm", "--alpha-us", "1e308", "--ranks", "8"): ("--alpha-us 1e308 is larger", ["alpha="]),
    ("bubble", "--stages", "4", "--microbatches", "8", "--cost-f", "1e308", "--cost-b", "1e308"):
        ("--cost-f 1e308 is larger", ["costs[", "'F'"]),
    ("comm", "--alpha-us", "1e308", "--ranks", "1e18"): ("--alpha-us 1e308", ["alpha=", "group_size="]),
    ("comm", "--ranks", "1e18"): ("--ranks 1e18 is larger than 2^53", ["group_size="]),
    ("memory", "--params", "-7e9"): ("--params -7e9 must be a positive integer", ["n_params="]),
    ("comm", "--params", "1e308"): ("--params 1e308 is larger than 2^53", ["n_params="]),
    ("memory", "--params", "1e308"): ("--params 1e308 is larger than 2^53", ["n_params="]),
    ("comm", "--beta-gbps", "1e308"): ("--beta-gbps 1e308 is larger than 1e+21", ["beta=", "inf"]),
    ("comm", "--alpha-us", "-1"): ("--alpha-us -1 must be >= 0", ["alpha=", "e-06"]),
    ("comm", "--bytes", "-1"): ("--bytes -1 must be >= 0", ["nbytes="]),
    ("memory", "--params", "7e9", "--weights", "-1"): ("--weights -1 must be >= 0", ["recipe"]),
    ("memory", "--params", "7e9", "--grad-accum", "1e308"): ("--grad-accum 1e308", ["grad_accum"]),
    ("mesh", "--gpus", "8.5"): ("--gpus 8.5 must be an integer", ["G="]),
    ("activations", "--layers", "0"): ("--layers 0 must be", ["L="]),
    ("bubble", "--stages", "4", "--microbatches", "8", "--chunks", "3"):
        ("--chunks 3 chunks need --schedule interleaved, not --schedule 1f1b", ["kind=", "v="]),
    # the per-step D is --ranks unless --dp is given
    ("comm", "--params", "7e9", "--ranks", "0"): ("--ranks 0 must be", ["dp=", "--dp"]),
    ("comm", "--params", "7e9", "--dp", "0"): ("--dp 0 must be", ["dp="]),
    # --flag=value and a prefix argparse accepts are the text typed too
    ("comm", "--alpha-us=1e308"): ("--alpha-us 1e308", ["alpha="]),
    ("comm", "--alpha", "1e308"): ("--alpha-us 1e308", ["alpha="]),
    ("train", "--layout", "ddp", "--batch", "0"): ("--batch 0 must be", ["batch="]),
    # each input within its bound, an answer that is not: the flags that make it, not inf
    ("comm", "--bytes", "1e30", "--beta-gbps", "1e-300"):
        ("--bytes 1e30 and --beta-gbps 1e-300 would be more than 1e+30 s", ["inf", "nbytes="]),
    ("comm", "--ranks", "9007199254740992", "--alpha-us", "1e30"):
        ("--ranks 9007199254740992 and --alpha-us 1e30 would be", ["group_size=", "alpha="]),
    ("bubble", "--stages", "4", "--microbatches", "8", "--cost-f", "0", "--cost-b", "0"):
        ("--cost-f 0, --cost-b 0: the 1f1b schedule's actions take no time", ["costs[", "Error"]),
    # a product of degrees names each factor by its flag
    ("mesh", "--gpus", "16", "--tp", "3"):
        ("--tp × --cp × --pp = 3 × 1 × 1 = 3 does not divide --gpus 16", ["tp*", "G="]),
    ("mesh", "--gpus", "16", "--tp", "2", "--pp", "2", "--ep", "3"):
        ("--ep × --etp = 3 × 1 = 3 does not divide --dp × --cp × --tp = 4 × 1 × 2 = 8",
         ["ep*etp", "dp*cp*tp"]),
    ("mesh", "--gpus", "16", "--dp", "4", "--tp", "2", "--pp", "2", "--cp", "2"):
        ("--dp × --tp × --pp × --cp = 4 × 2 × 2 × 2 = 32", ["dp*tp", "G="]),
}


def _err(capsys, argv) -> tuple[int, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(a) for a in CASES])
def test_a_bad_value_is_named_by_its_flag_and_the_text_typed(capsys, argv):
    rc, err = _err(capsys, argv)
    said, unsaid = CASES[argv]
    assert rc == 2 and err.startswith(f"shardlab {argv[0]}: ") and err.count("\n") == 1, err
    assert said in err, err
    for name in unsaid:
        assert name not in err, (name, err)


def test_a_derived_value_keeps_its_number_and_names_its_flag(capsys):
    rc, err = _err(capsys, ["mesh", "--gpus", "16384", "--tp", "8", "--pp", "16", "--dp", "100"])
    assert rc == 2 and err == "shardlab mesh: --dp 100 does not divide --gpus 16384\n"
    rc, err = _err(capsys, ["train", "--layout", "fsdp+tp", "--tp", "4", "--ranks", "6"])
    assert "--tp 4 does not divide --ranks 6" in err and "--ranks = dp x tp" in err


@pytest.mark.parametrize("rank, said", [("1", False), ("0", True)])
def test_a_usage_error_is_printed_by_one_torchrun_rank(capsys, monkeypatch, rank, said):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", rank)
    rc, err = _err(capsys, ["train", "--layout", "ddp", "--seq", "abc"])
    assert rc == 2
    assert (err == "shardlab train: argument --seq: 'abc' is not a number "
            "(see shardlab train --help)\n") if said else err == ""


def test_rename_products_writes_every_factor_or_none():
    def flag(name):
        return f"--{name}"

    names = ["ep", "etp", "dp", "cp", "tp"]
    assert rename_products("ep*etp = 3*1 = 3 does not divide dp*cp*tp = 4*1*2 = 8", names,
                           flag) == ("--ep × --etp = 3 × 1 = 3 does not divide "
                                     "--dp × --cp × --tp = 4 × 1 × 2 = 8")
    # a factor whose reader's name is not known: the product stays as accounting wrote it
    assert rename_products("ep*edp = 3*2 = 6", names, flag) == "ep*edp = 3*2 = 6"
    assert rename_products("edp = dp*cp*tp / (ep*etp)", names, flag) == (
        "edp = --dp × --cp × --tp / (--ep × --etp)")


def test_rename_values_leaves_products_quotes_and_longer_names_alone():
    def flag(name, value):
        return f"--{name} {value}"

    assert rename_values("tp*cp*pp = 3*1*1 = 3 does not divide G=16", ["tp", "G"], flag) == (
        "tp*cp*pp = 3*1*1 = 3 does not divide --G 16")
    assert rename_values("mark 'x=1' and dpx=2, dp=2.", ["x", "dp"], flag) == (
        "mark 'x=1' and dpx=2, --dp 2.")
    assert rename_values("got m=8, p=3", ["m", "p"], flag) == "got --m 8, --p 3"


# ------------------------------------------------------------------ digits a float holds

COLUMNS = {  # argv -> the columns whose numbers are sizes in GB, GiB or MiB
    ("memory", "--params", "9e15", "--weights", "1e10"): ("GB", "GiB"),
    ("activations", "--layers", "1e15", "--s", "1e6", "--b", "1e6"):
        ("MiB/layer", "GiB for L=1000000000000000"),
    ("comm", "--params", "9e15", "--q", "1e10"): ("GB",),
    ("comm", "--alpha-us", "1e29", "--bytes", "1e29"): ("ring time", "tree time"),
}


def significant_digits(cell: str) -> int:
    """Digits a number claims: ``90,000,000,126,000,016.00`` claims 19, ``9.000000e+19`` 7."""
    mantissa = re.split(r"[eE]", cell.split()[0].replace(",", ""))[0]  # "7.0e+23 s": 2
    return len(mantissa.replace(".", "").replace("-", "").lstrip("0"))


def _column_cells(text: str, header: str) -> list[str]:
    """The cells under ``header`` of the aligned text table that has it (the dashes under the
    header row give each column's span)."""
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        spans = [m.span() for m in re.finditer(r"-+", lines[i + 1])]
        if not spans or set(lines[i + 1]) > {"-", " "}:
            continue
        names = [line[a:b].strip() for a, b in spans]
        if header in names:
            a, b = spans[names.index(header)]
            rows = []
            for row in lines[i + 2:]:
                if not row.strip():  # the table ends at a blank line
                    break
                rows.append(row[a:b].strip())
            return rows
    raise AssertionError(f"no column {header!r} in\n{text}")


@pytest.mark.parametrize("argv", COLUMNS, ids=[" ".join(a) for a in COLUMNS])
def test_size_columns_print_no_invented_digits(capsys, argv):
    assert cli.main(list(argv)) == 0
    text = capsys.readouterr().out
    for header in COLUMNS[argv]:
        cells = _column_cells(text, header)
        assert cells, header
        for cell in cells:
            assert significant_digits(cell) <= 17, (header, cell)
    assert cli.main([*argv, "--json"]) == 0  # JSON stays numeric
    json.loads(capsys.readouterr().out)


def test_fmt_fixed_switches_where_the_digits_run_out():
    assert fmt_fixed(112.0, 2) == "112.00"
    assert fmt_fixed((EXACT - 1) / 100, 2) == "90,071,992,547,409.91"
    assert fmt_fixed(9e16, 2) == "9.000000e+16"
    assert fmt_fixed(157_500_000_000_000_032.0, 3) == "1.575000e+17"
    assert fmt_fixed(float("inf"), 2) == "inf"
    assert fmt_time(1234.5) == "1234.500 s" and fmt_time(7.000009e23) == "7.000009e+23 s"
