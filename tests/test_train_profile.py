"""``shardlab train --profile DIR``: a 2-rank run writes one ``torch.profiler`` trace per rank
(Chrome/Perfetto JSON) whose events name the recorded steps and the collectives, and
``shardlab.runtime.trace_timeline`` finds communication on every rank, exposed no more than
total (and possibly none: overlap depends on the machine's scheduling); bad ``--profile`` input is one sentence before any rank starts.

One 2-rank launch (lab 02's DDP, tiny model, 4 steps: 2 traced for bytes and memory, 1
profiler warm-up, 1 recorded; 4 KB buckets, so the gradients go in several all-reduces)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shardlab.cli import main
from shardlab.runtime import launch
from shardlab.runtime.trace_timeline import analyze, load_events
from shardlab.train.spec import TrainSpec, resolve_modules

ROOT = Path(__file__).resolve().parents[1]


def test_two_ranks_write_one_trace_each_with_steps_and_collectives(tmp_path):
    modules, source, labs = resolve_modules("ddp", labs=str(ROOT / "labs"))
    spec = TrainSpec("ddp", steps=4, threads=1, bucket_mb=0.004, modules=modules,
                     module_source=source, labs_dir=str(labs), profile=str(tmp_path / "p"))
    rows = launch("_train_ranks:run_specs", 2, [spec], quiet=True, timeout=240)
    traces = sorted((tmp_path / "p").glob("*.json"))
    assert [t.name for t in traces] == ["rank0.pt.trace.json", "rank1.pt.trace.json"]
    assert [r[0]["profile_trace"] for r in rows] == [str(t) for t in traces]
    for rank, path in enumerate(traces):
        trace = json.loads(path.read_text())
        assert trace["distributedInfo"]["rank"] == rank
        names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
        assert {n for n in names if n.startswith("ProfilerStep#")} == {"ProfilerStep#3"}
        assert "gloo:all_reduce" in names and "c10d::allreduce_" in names
        t = analyze(load_events(trace))[rank]
        assert t.steps == 1 and t.compute_us > 0 and t.comm_us > 0
        # exposed can be 0: a clean clone's run had rank 1's every all-reduce inside its
        # compute (comm 15.0 ms, exposed 0); trace_timeline promises 0 <= exposed <= comm
        assert 0 <= t.exposed_us <= t.comm_us < t.step_us


def test_bad_profile_folder_is_one_sentence(capsys, tmp_path):
    afile = tmp_path / "f"
    afile.write_text("")
    for argv, words in (
        (["--profile", str(afile)], [str(afile), "is a file"]),
        (["--profile", str(afile / "sub")], [str(afile / "sub"), "not a folder"]),
        (["--profile", str(tmp_path), "--steps", "3"], ["at least 4 steps", "--steps 3"]),
    ):
        assert main(["train", "--layout", "ddp", *argv]) == 2
        out = capsys.readouterr()
        assert out.out == "" and out.err.count("\n") == 1 and "Traceback" not in out.err
        for w in words:
            assert w in out.err, (w, out.err)


@pytest.mark.parametrize("steps,want", [(4, (2, 1, 1)), (5, (2, 1, 2)), (10, (6, 1, 3))])
def test_schedule_records_the_last_steps(steps, want):
    from shardlab.runtime.profile import profile_schedule

    assert profile_schedule(steps, skip=2) == want
