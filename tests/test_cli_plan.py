"""``shardlab plan``: the ranked table, JSON equal to accounting.planner, units, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from shardlab import cli
from shardlab.accounting import compute as C
from shardlab.accounting import planner as P


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardlab", "plan", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def main_rc(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_table_marks_llama3_mesh():
    proc = run("--top", "3")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Feasible layouts ranked by predicted step time" in out
    assert "Per-rank peak memory by term" in out
    assert "Communication per step per axis" in out
    assert "Rejected layouts by reason" in out
    assert "Marked t=8, c=1, p=16, D=128: t8 c1 p16 D128" in out
    for reason in P.REASONS:
        assert reason in out


@pytest.mark.parametrize("preset, key", [("llama3-405b-8k", "8k"), ("llama3-405b-128k", "128k")])
def test_json_equals_accounting(capsys, preset, key):
    assert main_rc(["plan", "--preset", preset, "--top", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cfg = P.LLAMA3_CONFIGS[key]
    model = C.ModelShape(**{**C.LLAMA3_405B, "seq_len": cfg["seq_len"]})
    pl = P.plan(model, P.Cluster(**P.LLAMA3_CLUSTER), cfg["global_batch"])
    assert data["n_feasible"] == len(pl.feasible)
    assert data["n_rejected"] == len(pl.rejected)
    assert data["rejected_counts"] == pl.rejected_counts()
    assert data["model"]["n_params"] == model.n_params
    first = data["feasible"][0]
    assert first["rank"] == 1
    assert first["step_time"] == pl.feasible[0].step_time
    assert first["mfu"] == pl.feasible[0].mfu
    assert first["memory"] == pl.feasible[0].memory
    assert first["peak_bytes"] == pl.feasible[0].peak
    (marked,) = data["marked"]
    best = pl.find(**cfg["layout"])[0]
    assert marked["rank"] == pl.rank_of(best)
    assert marked["best"]["layout"] == best.layout.as_dict()
    assert marked["explanation"] == pl.explain(best)
    assert {a: r["comm_time"] for a, r in marked["best"]["comm"].items()} == {
        a: r.comm_time for a, r in best.comm.items()
    }


def test_overrides_and_custom_model(capsys):
    argv = ["plan", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
            "--ffn", "14336", "--vocab", "128256", "--seq-len", "8192", "--global-batch", "512",
            "--gpus", "64", "--gpu-memory-gb", "80", "--mark", "t=8,p=1", "--json"]
    assert main_rc(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cluster"]["gpus"] == 64 and data["model"]["layers"] == 32
    assert data["n_feasible"] > 0
    assert data["marked"][0]["fields"] == {"t": 8, "p": 1}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["plan", "--gpus", "0"], "--gpus 0"),
        (["plan", "--efficiency", "2"], "--efficiency 2"),
        (["plan", "--heads", "100"], "--hidden 16384 is not divisible by --heads 100"),
        (["plan", "--mark", "t=8,x=1"], "mark 'x=1'"),
        (["plan", "--global-batch", "x"], "is not a number"),
        (["plan", "--top", "0"], "--top 0"),
    ],
)
def test_bad_input_one_sentence(capsys, argv, needle):
    assert main_rc(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardlab plan: ")
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_help_documents_units(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["plan", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for unit in ("GB, 10^9 bytes", "microseconds", "GB/s", "TFLOP/s", "tokens", "sequences",
                 "count", "elements"):
        assert unit in out, unit
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["plan"]
    for action in sub._actions:
        assert action.help, f"plan {action.option_strings} has no help"


def test_calculator_renders_static_html_and_error_sentence():
    pytest.importorskip("ipywidgets")
    from shardlab.widgets.planner import planner_calculator

    box = planner_calculator(top=3)
    html = box.output.value
    assert box.output.get_state()["value"] == html  # rendered at construction
    assert "<table" in html and "<svg" in html and "shardlab-error" not in html
    assert "t8 c1 p16 D128" in html
    box.controls["gpus"].value = 0
    assert "shardlab-error" in box.output.value and "G (GPUs) = 0" in box.output.value
    assert "Traceback" not in box.output.value


def test_global_batch_in_tokens(capsys):
    """--global-batch-tokens T is T / s sequences: Llama 3's 16,777,216 tokens per step are
    2,048 sequences at 8K and 128 at 128K, one ranking each."""
    for preset, seqs in (("llama3-405b-8k", 2048), ("llama3-405b-128k", 128)):
        assert main_rc(["plan", "--preset", preset, "--global-batch-tokens", "16777216",
                        "--top", "1", "--json"]) == 0
        by_tokens = json.loads(capsys.readouterr().out)
        assert main_rc(["plan", "--preset", preset, "--global-batch", str(seqs), "--top", "1",
                        "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == by_tokens
    assert main_rc(["plan", "--global-batch-tokens", "1000"]) == 2
    assert "not a whole number of sequences of s=8,192" in capsys.readouterr().err
    assert main_rc(["plan", "--global-batch-tokens", "8192", "--global-batch", "1"]) == 2
    assert "choose one" in capsys.readouterr().err
