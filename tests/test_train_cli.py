"""``shardlab train``: every layout on real ranks sends exactly the bytes ``shardlab.accounting``
predicts; bad input is one sentence (exit 2, no traceback); ``--json`` parses; two ``torchrun``
agents meeting through a c10d rendezvous on localhost (a two-node job on one machine) give
the launcher's result.

Fast share (``make test``): one 2-rank launch runs ddp, zero1, zero2, fsdp, tp and pp for 2
steps each (tiny model), one 4-rank launch runs fsdp+tp, one CLI run with ``--json``, and the
bad-input sentences (no rank starts). Slow: every layout through the CLI, a student's module,
the two torchrun agents.

Bytes are compared with ``==``: the trace applies ``accounting.comm.ring_sent_bytes`` to each
collective and the prediction is the layout's formula for the whole step; both are sums of
the same dyadic fractions (sizes times (D-1)/D with D = 2) and equal exactly. The slow CLI test
also bounds the peak ratio per layout (:data:`PEAK_BAND`); measured ratios on 2 ranks (4 for
fsdp+tp), tiny model, 25 MB buckets: ddp 1.0001, zero1 1.0001, zero2 0.989, fsdp 1.024,
tp 0.940, pp 1.0001 / 1.0013 (first / last stage; 1f1b, gpipe 1.0001 / 1.0001), fsdp+tp 1.036-1.058.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from shardlab.cli import main
from shardlab.runtime import launch
from shardlab.train.spec import LAYOUTS, TrainSpec, resolve_modules

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TWO_RANK = ["ddp", "zero1", "zero2", "fsdp", "tp", "pp"]


def _spec(layout: str, **kw) -> TrainSpec:
    modules, source, labs = resolve_modules(layout, labs=str(ROOT / "labs"))
    kw = {"steps": 2, "threads": 1, **kw}
    return TrainSpec(layout, modules=modules, module_source=source, labs_dir=str(labs), **kw)


def _assert_exact(layout: str, rows: list[dict]) -> None:
    for r in rows:
        want = r["bytes_predicted"]
        assert set(want) == set(LAYOUTS[layout].axes), (layout, want)
        assert r["bytes_measured"] == want, (layout, r["rank"], r["bytes_measured"], want)
        assert all(v > 0 for v in want.values())
        assert r["peak_measured"] > 0 and r["peak_predicted"] > 0


def test_every_two_rank_layout_sends_exactly_the_predicted_bytes():
    res = launch("_train_ranks:run_specs", 2, [_spec(x) for x in TWO_RANK], quiet=True,
                 timeout=240)
    for k, layout in enumerate(TWO_RANK):
        _assert_exact(layout, [res[r][k] for r in range(2)])
    # the pipeline's first and last stage send the same here (activations vs gradients)
    assert [res[r][TWO_RANK.index("pp")]["bytes_measured"]["pp"] for r in range(2)] == [16384] * 2


def test_fsdp_tp_on_four_ranks_sends_exactly_the_predicted_bytes_per_axis():
    rows = launch("_train_ranks:run_specs", 4, [_spec("fsdp+tp", ranks=4)], quiet=True,
                  timeout=240)
    _assert_exact("fsdp+tp", [r[0] for r in rows])
    assert [r[0]["coords"]["dp"] for r in rows] == [0, 0, 1, 1]  # tp innermost


def _cli(*args: str, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardlab", "train", *args], cwd=cwd, capture_output=True,
        text=True, timeout=300, env=env,
    )


def test_json_report_parses_and_progress_is_plain_text_off_a_terminal():
    p = _cli("--layout", "ddp", "--steps", "3", "--threads", "1", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["layout"] == "ddp" and rep["ranks"] == 2 and rep["started_by"].endswith("launch")
    assert rep["module_source"] == "reference"
    assert rep["modules"] == {"ddp.py": str(ROOT / "labs" / "02_ddp" / "ddp.py")}
    for row in rep["rows"]:
        assert row["bytes"]["dp"]["measured"] == row["bytes"]["dp"]["predicted"] > 0
        assert row["bytes"]["dp"]["ratio"] == 1.0
        assert row["peak"]["source"] == "MemoryTrace" and row["peak"]["measured"] > 0
        assert row["step_time_s"]["steps_timed"] == 1  # steps 2+: the untraced ones
        assert 0 < row["mfu"]["measured"] < 1 and row["tokens_per_s"]["measured"] > 0
        assert len(row["losses"]) == 3
    assert rep["assumptions"]["peak_tflops_per_rank"] == 0.1  # the stated CPU default
    assert rep["assumptions"]["peak_source"].startswith("default for CPU")
    # one plain line per step (stderr is a pipe here): no carriage-return redraws
    steps = [ln for ln in p.stderr.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == ["1/3", "2/3", "3/3"] and "\r" not in p.stderr


BAD = [
    (["--layout", "ddpp"], ["--layout ddpp", "ddp, zero1"]),
    (["--layout", "ddp", "--ranks", "3"], ["--batch 8", "3 data-parallel ranks", "--ranks 3"]),
    (["--layout", "fsdp", "--ranks", "4", "--batch", "6"], ["--batch 6", "4 data-parallel"]),
    (["--layout", "tp", "--ranks", "3"], ["heads=4", "t=3"]),
    (["--layout", "fsdp+tp", "--tp", "3", "--ranks", "6"], ["heads=4", "t=3"]),
    (["--layout", "fsdp+tp", "--tp", "4", "--ranks", "6"], ["--tp 4", "--ranks 6"]),
    (["--layout", "pp", "--ranks", "4"], ["layers=2", "p=4"]),
    (["--layout", "pp", "--microbatches", "3"], ["--batch 8", "--microbatches 3"]),
    (["--layout", "ddp", "--model", "huge"], ["--model huge", "tiny, small"]),
    (["--layout", "ddp", "--steps", "1"], ["--steps 1"]),
    (["--layout", "ddp", "--module", "/no/such/file.py"], ["/no/such/file.py"]),
]


@pytest.mark.parametrize("argv,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_sentence_exit_2(capsys, argv, words):
    assert main(["train", *argv]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "Traceback" not in out.err
    assert out.err.startswith("shardlab train: ")
    for w in words:
        assert w in out.err, (w, out.err)


def test_module_missing_a_function_names_the_file_and_the_names(capsys, tmp_path):
    mod = tmp_path / "my_zero2.py"
    mod.write_text("import torch\n\n\ndef ZeRO3():\n    pass\n")
    assert main(["train", "--layout", "zero2", "--module", str(mod)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(mod) in err and "ZeRO2" in err and "zero2" in err


def test_current_folder_module_is_used_when_present(tmp_path, monkeypatch):
    ref = ROOT / "labs" / "04_fsdp" / "fsdp.py"
    (tmp_path / "fsdp.py").write_text(ref.read_text())
    monkeypatch.chdir(tmp_path)
    mods, source, _ = resolve_modules("fsdp", labs=str(ROOT / "labs"))
    assert source == "student" and mods["fsdp.py"] == str(tmp_path / "fsdp.py")
    assert mods["fsdp_units.py"] == str(ROOT / "labs" / "04_fsdp" / "fsdp_units.py")
    monkeypatch.chdir(ROOT / "labs" / "04_fsdp")  # the lab folder itself: its reference
    assert resolve_modules("fsdp", labs=str(ROOT / "labs"))[1] == "reference"


# ----------------------------------------------------------------- slow: end to end


# measured peak / predicted peak, per layout, and why the band is what it is
PEAK_BAND = {
    "ddp": (0.99, 1.01),  # every term a formula but the saved activations (as lab 02)
    "zero1": (0.99, 1.01),  # as lab 03
    "zero2": (0.95, 1.05),  # lab 03's band: gloo may free a reduce-scatter bucket late
    "fsdp": (0.95, 1.05),  # lab 04's band: temporaries inside a unit's backward not modelled
    # lab 09's reason, plus: which gathered buffer is alive at the peak moment depends on when
    # gloo's threads finish, so the peak moves by one activation-sized tensor between runs
    # (seen 1.036 and 1.058 on 4 ranks)
    "fsdp+tp": (0.95, 1.08),
    # the prediction keeps every gradient in the persistent term (as ddp does), but at the
    # peak (early in backward) only part of them exist yet: over by at most 4 N_local bytes
    "tp": (0.90, 1.01),
    # accounting.stage_peak (as lab 09): every term a formula but the saved activations,
    # autograd's block-backward temporaries included; deterministic on reruns, the last
    # stage is over by 580 bytes (0.13 %) of small tensors the walk does not name
    "pp": (0.99, 1.01),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_through_the_cli(layout):
    ranks = "4" if layout == "fsdp+tp" else "2"
    p = _cli("--layout", layout, "--ranks", ranks, "--steps", "2", "--threads", "1", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    for row in rep["rows"]:
        for axis, b in row["bytes"].items():
            assert b["measured"] == b["predicted"] > 0, (layout, row["rank"], axis)
        lo, hi = PEAK_BAND[layout]
        assert lo <= row["peak"]["ratio"] <= hi, (layout, row["rank"], row["peak"])


@pytest.mark.slow
def test_a_students_module_of_another_name_is_trained(tmp_path):
    mine = tmp_path / "my_ddp.py"
    mine.write_text((ROOT / "labs" / "02_ddp" / "ddp.py").read_text())
    p = _cli("--layout", "ddp", "--module", str(mine), "--steps", "2", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["module_source"] == "student" and rep["modules"]["ddp.py"] == str(mine)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_agents_c10d_rendezvous_match_the_launcher():
    """Two nodes of one process each, emulated on this machine: both agents exit 0, and the
    job's report (printed by whichever process became rank 0) equals a launcher run's in
    bytes and losses (one thread per rank in both, so the arithmetic is the same)."""
    args = ["--layout", "ddp", "--steps", "3", "--threads", "1", "--json"]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [str(BIN / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
           "-m", "shardlab", "train", *args]
    agents = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [a.communicate(timeout=300) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], [e[-2000:] for _, e in outs]
    reports = [json.loads(o) for o, _ in outs if o.strip()]
    assert len(reports) == 1  # rank 0 prints, on one of the two "nodes"
    job = reports[0]
    assert job["started_by"].startswith("torchrun") and job["ranks"] == 2
    p = _cli(*args)
    assert p.returncode == 0, p.stderr
    local = json.loads(p.stdout)
    for a, b in zip(job["rows"], local["rows"]):
        assert a["bytes"] == b["bytes"] and a["bytes"]["dp"]["ratio"] == 1.0
        assert a["losses"] == b["losses"]
        assert a["peak"]["measured"] == b["peak"]["measured"]
