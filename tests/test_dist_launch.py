"""Happy-path tests of shardlab.runtime.launch (2-4 gloo ranks on CPU)."""

from __future__ import annotations

import sys
import threading
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _dist_workers as w  # noqa: E402
from _dist_util import assert_no_survivors  # noqa: E402
from shardlab.runtime import launch  # noqa: E402


@pytest.mark.parametrize("n", [2, 3, 4])
def test_results_in_rank_order_and_env(n, capsys):
    marker = uuid.uuid4().hex
    res = launch(w.env_report, n, "t", scale=2, env={"SHARDLAB_TEST_MARKER": marker})
    assert [r["rank"] for r in res] == list(range(n))
    expected = 2 * n * (n + 1) / 2
    for r, d in enumerate(res):
        assert d["world"] == n and d["tag"] == "t" and d["marker"] == marker
        assert d["env"]["RANK"] == str(r) and d["env"]["LOCAL_RANK"] == str(r)
        assert d["env"]["WORLD_SIZE"] == str(n) and d["env"]["LOCAL_WORLD_SIZE"] == str(n)
        assert d["env"]["MASTER_ADDR"] == "127.0.0.1" and int(d["env"]["MASTER_PORT"]) > 0
        assert d["sum"] == [expected] * 3
        assert d["device"] == "cpu" and d["backend"] == "gloo"
        assert d["threads"] >= 1 and d["omp"] == str(d["threads"])
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if "hello" in line] == [
        f"[rank {r}] hello from {r} tag=t" for r in range(n)
    ]
    assert_no_survivors(marker)


def test_string_fn_quiet_and_progress(capsys):
    res = launch("_dist_workers:slow", 2, 0.4, steps=2, quiet=True, progress=True)
    assert res == ["done", "done"]
    cap = capsys.readouterr()
    assert "[rank" not in cap.out
    assert "100.0%" in cap.err and "ranks done 2/2" in cap.err


def test_concurrent_launches_do_not_collide():
    marker = uuid.uuid4().hex
    results, errors = {}, []

    def go(i):
        try:
            results[i] = launch(
                w.env_report, 2, f"c{i}", quiet=True, env={"SHARDLAB_TEST_MARKER": marker}
            )
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    ports = {results[i][0]["env"]["MASTER_PORT"] for i in range(3)}
    assert len(ports) == 3
    for i in range(3):
        assert [d["tag"] for d in results[i]] == [f"c{i}"] * 2
    assert_no_survivors(marker)


def _local_fn():
    return 1


def test_rejects_main_and_local_functions():
    def inner():
        return 1

    with pytest.raises(ValueError, match="inside another function"):
        launch(inner, 2)
    _local_fn.__module__ = "__main__"
    with pytest.raises(ValueError, match="cannot import it"):
        launch(_local_fn, 2)
    with pytest.raises(ValueError, match="module:function"):
        launch("nocolon", 2)
    with pytest.raises(ValueError, match="nprocs=0"):
        launch(w.env_report, 0)


def test_run_module_parses_and_launches(capsys):
    from shardlab.run import main, parse_values

    assert parse_values(["1", "x", "steps=10", "name=[1, 2]"]) == (
        [1, "x"],
        {"steps": 10, "name": [1, 2]},
    )
    with pytest.raises(ValueError, match="follows keyword"):
        parse_values(["a=1", "2"])
    assert main(["_dist_workers:slow", "0.2", "steps=2", "--nproc", "2"]) == 0
    out = capsys.readouterr().out
    assert "[rank 0] result: 'done'" in out and "[rank 1] result: 'done'" in out
