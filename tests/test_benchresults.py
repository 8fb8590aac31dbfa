"""Benchmark results as data: the file's schema, its summary and its rendering."""

import json

import pytest
from shardlab import benchresults as br


def _write(tmp_path, per_launch, load_before=(0.5, 0.5, 0.5)):
    return br.write_results(
        "demo_bench_2ranks", per_launch, benchmark="demo", config={"ranks": 2},
        load_before=list(load_before), command="demo --save", directory=tmp_path,
    )


def test_file_has_the_schema_and_the_summary_of_every_numeric_leaf(tmp_path):
    rows = [{"ratio": {"a": {"step": x}}, "seconds": {"a": 10 * x}, "note": "s"}
            for x in (1.2, 0.9, 1.0)]
    data = json.loads(_write(tmp_path, rows).read_text())
    assert br.is_results(data)
    assert {"benchmark", "command", "config", "machine", "date", "torch", "load", "idle",
            "per_launch", "summary"} <= set(data)
    assert data["per_launch"] == rows
    assert data["summary"]["ratio.a.step"] == {"median": 1.0, "min": 0.9, "max": 1.2, "n": 3}
    assert data["summary"]["seconds.a"]["median"] == 10.0
    assert "note" not in data["summary"]  # strings are not summarised
    assert data["machine"]["cores"] >= 1 and data["load"]["cores"] == data["machine"]["cores"]


def test_idle_needs_the_load_below_the_cores_before_and_after(tmp_path):
    busy = json.loads(_write(tmp_path, [{"x": 1}], load_before=(1e6, 0, 0)).read_text())
    assert busy["idle"] is False


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden"])
def test_bad_names_and_empty_runs_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match="plain file name"):
        br.write_results(name, [{"x": 1}], benchmark="b", config={}, load_before=[],
                         directory=tmp_path)
    with pytest.raises(ValueError, match="nothing was measured"):
        br.write_results("ok", [], benchmark="b", config={}, load_before=[], directory=tmp_path)


def test_markdown_names_the_run_and_lists_the_keys_under_a_prefix(tmp_path):
    rows = [{"ratio": {"zero1": {"step": x}}, "floor": {"zero1": 2 * x}} for x in (1.0, 1.5)]
    data = json.loads(_write(tmp_path, rows, load_before=(9.0, 9, 9)).read_text())
    text = br.markdown(data, "ratio")
    assert text.splitlines()[0].startswith("demo: `demo --save`, 2 launches")
    assert "NOT idle" in text
    assert "| zero1.step | 1.250 [1.000–1.500] | 2 |" in text
    assert "floor" not in text.split("\n", 1)[1]
    assert br.summary_rows(data, prefix="floor") == [["zero1", "2.500 [2.000–3.000]", 2]]


def test_shared_options_refuse_a_count_below_one_in_one_sentence(capsys):
    import argparse

    ap = argparse.ArgumentParser(prog="bench")
    br.add_arguments(ap, "--launches", default=2)
    a = ap.parse_args(["--save", "--results-dir", "/tmp/x"])
    assert (a.launches, a.save, a.results_dir) == (2, True, "/tmp/x")
    for bad, words in (("0", "0 must be at least 1"), ("2.5", "'2.5' is not a whole number")):
        with pytest.raises(SystemExit) as exit_:
            ap.parse_args(["--launches", bad])
        assert exit_.value.code == 2
        assert f"argument --launches: {words}" in capsys.readouterr().err
