"""The ``shardlab`` command line: tables, JSON equal to accounting, help with units, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from shardlab import cli
from shardlab.accounting import activations as act
from shardlab.accounting import comm, memory, mesh, pipeline


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardlab", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def run_json(*args: str) -> dict:
    proc = run(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------- subprocess


def test_memory_table_and_json():
    args = ("memory", "--params", "7e9", "--dp", "8", "--recipe", "mixed-adam-16")
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    for layout in memory.LAYOUTS:
        assert layout in proc.stdout
    # the lecture's totals appear in the table (GB column)
    for gb in ("112.00", "38.50", "26.25", "14.00"):
        assert gb in proc.stdout
    assert "GiB" in proc.stdout and "moment1" in proc.stdout
    data = run_json(*args)
    for s in memory.state_table(7_000_000_000, 8, "mixed-adam-16"):
        got = data["layouts"][s.layout]
        assert got["total_bytes"] == s.total
        assert got["total_gib"] == pytest.approx(s.total_gib)
        assert got["per_object_bytes"] == s.per_object


def test_activations_table_and_json():
    args = ("activations", "--s", "2048", "--b", "1", "--h", "4096", "--a", "32", "--t", "8",
            "--layers", "32")
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    for mib in ("912", "184", "114", "34"):
        assert mib in proc.stdout
    data = run_json(*args)
    for row in data["modes"]:
        assert row["bytes_per_layer"] == act.activation_bytes_per_layer(
            2048, 1, 4096, 32, 8, row["mode"]
        )
        assert row["total_bytes"] == act.activation_bytes(32, 2048, 1, 4096, 32, 8, row["mode"])


def test_comm_op_table_and_json():
    args = ("comm", "--op", "all_reduce", "--bytes", "1e9", "--ranks", "8", "--alpha-us", "5",
            "--beta-gbps", "100")
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    assert "all_reduce" in proc.stdout and "1,750,000,000" in proc.stdout
    data = run_json(*args)
    for op in comm.COLLECTIVES:
        for algo in comm.ALGOS:
            got = data["collectives"][op][algo]
            assert got["seconds"] == comm.alpha_beta_time(op, 1e9, 8, 5e-6, 100e9, algo)
            assert got["rounds"] == comm.rounds(op, 8, algo)
    assert data["selected"]["sent_bytes"] == comm.ring_sent_bytes("all_reduce", 1e9, 8)


def test_comm_layout_table_and_json():
    args = ("comm", "--layout", "zero3", "--params", "7e9", "--dp", "8", "--q", "2")
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    assert "zero3" in proc.stdout and "36,750,000,000" in proc.stdout
    data = run_json(*args)
    for layout in comm.STEP_LAYOUTS:
        assert data["bytes_per_rank"][layout] == comm.step_volume(layout, 7_000_000_000, 8, 2)
    assert data["bytes_per_rank"]["zero3 (no reshard)"] == comm.step_volume(
        "zero3", 7_000_000_000, 8, 2, reshard_after_forward=False
    )


def test_bubble_table_and_json():
    proc = run("bubble", "--stages", "4", "--microbatches", "8")
    assert proc.returncode == 0, proc.stderr
    for pct in ("37.5 %", "27.3 %", "72.7 %"):
        assert pct in proc.stdout
    data = run_json("bubble", "--stages", "4", "--microbatches", "8", "--schedule",
                    "interleaved", "--chunks", "2")
    assert data["schedule"] == "interleaved"
    assert data["closed_form"]["bubble_ratio"] == pipeline.bubble_ratio(4, 8, 2)
    sim = pipeline.simulate(pipeline.schedule("interleaved", 4, 8, 2), 4)
    assert data["simulated"]["makespan"] == sim.makespan
    assert data["simulated"]["peak_inflight"] == list(sim.peak_inflight)


def test_mesh_table_and_json():
    args = ("mesh", "--gpus", "16384", "--tp", "8", "--cp", "1", "--pp", "16", "--dp", "128",
            "--rank", "12345")
    proc = run(*args)
    assert proc.returncode == 0, proc.stderr
    assert "12344, 12345" in proc.stdout
    data = run_json(*args)
    m = mesh.Mesh(16384, 128, 8, 16, 1)
    assert data["coords"] == m.rank_to_coords(12345).as_dict()
    for axis in mesh.AXES:
        assert data["axes"][axis]["rank_group"] == m.group_of(12345, axis)


def test_bad_input_one_sentence_exit_2():
    proc = run("memory", "--params", "7e9", "--dp", "0")
    assert proc.returncode == 2
    assert proc.stderr.startswith("shardlab memory: ")
    assert "--dp 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1
    proc = run("mesh", "--gpus", "16384", "--tp", "8", "--pp", "16", "--dp", "100")
    assert proc.returncode == 2
    assert proc.stderr == "shardlab mesh: --dp 100 does not divide --gpus 16384\n"


# --------------------------------------------------------------------------- in-process


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["memory", "--params", "7e9", "--dp", "8", "--recipe", "nope"], "invalid choice"),
        (["memory", "--params", "x"], "is not a number"),
        (["activations", "--a", "30", "--t", "8"], "--a 30"),
        (["comm", "--bytes", "-1"], "--bytes -1"),
        (["comm", "--beta-gbps", "0"], "--beta-gbps 0 must be > 0"),
        (
            [
                "bubble",
                "--stages",
                "4",
                "--microbatches",
                "6",
                "--schedule",
                "interleaved",
                "--chunks",
                "2",
            ],
            "--microbatches 6",
        ),
        (["bubble", "--stages", "0", "--microbatches", "8"], "--stages 0"),
        # the accounting's sentence, as the lab's PipeConfig gives it: 1f1b is not interleaved
        (
            ["bubble", "--stages", "4", "--microbatches", "8", "--chunks", "2"],
            "--chunks 2 chunks need --schedule interleaved, not --schedule 1f1b",
        ),
        (["bubble", "--stages", "4", "--microbatches", "8", "--schedule", "2f2b"], "--schedule 2f2b is not one of"),
        (["mesh", "--gpus", "16", "--tp", "2", "--pp", "2", "--rank", "16"], "--rank 16"),
        (["mesh", "--gpus", "16", "--tp", "3"], "--tp × --cp × --pp = 3 × 1 × 1"),
        (["mesh", "--gpus", "16", "--tp", "2", "--pp", "2", "--ep", "3"], "--ep × --etp"),
    ],
)
def test_bad_inputs_in_process(capsys, argv, needle):
    assert main_rc(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"shardlab {argv[0]}: ")
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def main_rc(argv: list[str]) -> int:
    """cli.main's return code, or the code of the SystemExit argparse raises."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code)


UNITS = {
    "memory": ["bytes per parameter", "GB", "GiB", "count"],
    "activations": ["tokens", "MiB", "elements"],
    "comm": ["bytes", "microseconds", "GB/s", "ranks"],
    "bubble": ["time units", "count"],
    "mesh": ["ranks", "count"],
}


@pytest.mark.parametrize("command", sorted(UNITS))
def test_help_documents_units(capsys, command):
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for unit in UNITS[command]:
        assert unit in out, (command, unit)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        assert action.help, f"{command} {action.option_strings} has no help"


def test_memory_custom_recipe_in_process(capsys):
    assert cli.main(["memory", "--params", "1e9", "--dp", "4", "--moment1", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rec = memory.Recipe("custom", 2, 2, 4, 2, 4)
    assert (
        data["layouts"]["zero1"]["total_bytes"]
        == memory.model_state(1_000_000_000, 4, "zero1", rec).total
    )


def test_mesh_moe_fold_in_process(capsys):
    argv = ["mesh", "--gpus", "16", "--tp", "2", "--cp", "2", "--pp", "2", "--rank", "5",
            "--ep", "4", "--etp", "2", "--json"]
    assert cli.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    fold = mesh.moe_fold(mesh.Mesh(16, 2, 2, 2, 2), 4, 2)
    assert data["moe_fold"]["edp"] == fold.edp
    assert data["moe_fold"]["expert_coords"] == fold.expert_coords(5)
    assert data["moe_fold"]["groups"]["ep"] == fold.groups("ep")


def test_closed_pipe_ends_quietly():
    """`shardlab ... | head`: the reader leaves after one line; no BrokenPipeError traceback."""
    # 16 stages x 400 microbatches of zb-h1 is 19,200 actions: a JSON far above a pipe's 64 KiB
    argv = ["bubble", "--stages", "16", "--microbatches", "400", "--schedule", "zb-h1", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardlab", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout.readline().strip() == b"{"
    proc.stdout.close()  # like `head -1` exiting
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""


@pytest.mark.parametrize("kind,v", [("1f1b", 1), ("zb-h1", 1), ("interleaved", 4), ("gpipe", 1)])
def test_huge_pipeline_answers_with_closed_forms(kind, v):
    """100,000 stages x 100,000 microbatches: no simulation, the closed forms still printed."""
    from shardlab.widgets.pipeline import MAX_SIMULATED_ACTIONS, pipeline_report

    rep = pipeline_report(kind, 100_000, 100_000, v)  # returns at once, nothing is walked
    assert rep.data["simulated"] is None
    assert "not simulated" in rep.data["not_simulated"].lower()
    assert str(f"{MAX_SIMULATED_ACTIONS:,}") in rep.data["not_simulated"]
    v_closed = v if kind == "interleaved" else 1
    assert rep.data["closed_form"]["idle_fraction"] == pipeline.idle_fraction(
        100_000, 100_000, v_closed
    )
    proc = run("bubble", "--stages", "100000", "--microbatches", "100000", "--schedule", kind,
               "--chunks", str(v))
    assert proc.returncode == 0, proc.stderr
    assert "not simulated" in proc.stdout


def test_schedule_size_matches_schedule_and_bounds_simulation():
    for kind, p, m, v in [("gpipe", 3, 5, 1), ("1f1b", 4, 8, 1), ("zb-h1", 4, 6, 1),
                          ("interleaved", 4, 8, 3)]:
        sched = pipeline.schedule(kind, p, m, v)
        assert pipeline.schedule_size(kind, p, m, v) == sum(len(a) for a in sched)
    with pytest.raises(ValueError, match="m=6, p=4"):
        pipeline.schedule_size("interleaved", 4, 6, 2)
    from shardlab.widgets.pipeline import MAX_SIMULATED_ACTIONS, pipeline_report

    # just under the bound is still simulated
    rep = pipeline_report("1f1b", 10, MAX_SIMULATED_ACTIONS // 20)
    assert rep.data["simulated"] is not None
