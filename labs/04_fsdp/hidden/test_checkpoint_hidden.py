"""Hidden tests of the sharded checkpoint: 4 -> 2 -> 1 ranks, and a rank SIGKILLed mid-save.

Five launches (4, 4, 4, 2 and 1 ranks; hidden tests run in ``make test-slow``). Tolerances: as in
test_checkpoint.py (its docstring says why): restore and same-world resume bitwise, a
different world within ``SCALE_ULPS`` ulps at each tensor's scale, the attention key bias
(exactly zero gradient) within lr / 100.
"""

from __future__ import annotations

import shutil

import checkpoint as ckpt
import pytest
import torch
from _workers_checkpoint import STATES, ulp_report
from shardlab.runtime import RankError, launch
from test_checkpoint import SCALE_ULPS, ZERO_GRAD_TOL

VICTIM = 2  # the rank killed while it writes its shard of the step-3 save


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ckpt4")
    clean, killed, two = tmp / "clean", tmp / "killed", tmp / "two"
    out = {"tmp": tmp, "killed_root": killed}
    out["clean4"] = launch("_workers_checkpoint:train_and_save", 4, str(clean), (2,), quiet=True)
    with pytest.raises(RankError) as err:
        launch(
            "_workers_checkpoint:train_and_save", 4, str(killed), (2, 3), (VICTIM, 3), quiet=True
        )
    out["kill_error"] = str(err.value)
    out["killed_dir"] = sorted(p.name for p in killed.iterdir())
    out["partial"] = (killed / ".step-00000003.tmp" / ckpt.shard_name(VICTIM, 4)).stat().st_size
    out["full"] = (killed / "step-00000002" / ckpt.shard_name(VICTIM, 4)).stat().st_size
    latest = ckpt.latest_checkpoint(killed)
    out["latest"] = latest
    # resume, and save step 3 again: the stale .tmp of the crashed save is replaced
    out["resume4"] = launch(
        "_workers_checkpoint:load_and_continue", 4, str(latest), str(killed), (3,), quiet=True
    )
    out["after_resave"] = sorted(p.name for p in killed.iterdir())
    # 4 -> 2, with a checkpoint whose last file has one flipped bit (only new rank 1 reads it)
    bad = tmp / "flipped"
    shutil.copytree(clean / "step-00000002", bad)
    f = bad / ckpt.shard_name(3, 4)
    data = bytearray(f.read_bytes())
    data[8] ^= 0x80
    f.write_bytes(bytes(data))
    out["two"] = launch(
        "_workers_checkpoint:load_and_continue", 2, str(clean / "step-00000002"), str(two), (3,),
        bad=[(str(bad), {})], quiet=True,
    )
    # 2 -> 1: the checkpoint the 2 ranks saved after step 3
    out["one"] = launch("_workers_checkpoint:load_and_continue", 1, str(two / "step-00000003"),
                        quiet=True)
    return out


def test_sigkill_mid_save_leaves_previous_checkpoint(runs):
    assert f"rank {VICTIM} was killed by signal SIGKILL" in runs["kill_error"]
    assert runs["killed_dir"] == [".step-00000003.tmp", "step-00000002"]  # no commit of step 3
    assert 0 < runs["partial"] < runs["full"]  # the victim really was mid-file
    assert runs["latest"].name == "step-00000002"
    ckpt.verify_checkpoint(runs["latest"])  # every size and checksum intact


def test_resume_after_crash_is_bitwise(runs):
    """Same world size: the resumed run is the uninterrupted run, bit for bit; its save of
    step 3 replaces the crashed attempt's .tmp directory."""
    clean = runs["clean4"]
    assert runs["after_resave"] == ["step-00000002", "step-00000003"]
    ckpt.verify_checkpoint(runs["killed_root"] / "step-00000003")
    for r, rep in enumerate(runs["resume4"]):
        assert torch.equal(rep["loaded"]["rng"], clean[r][2]["rng"])  # each rank its own RNG
        assert rep["report"].files_read == [ckpt.shard_name(r, 4)]  # same layout: own file
        assert rep["report"].bytes_read == rep["predicted_read"]
    assert ulp_report(runs["resume4"][0]["final"], clean[0]["final"])["bitwise"]


def test_reshard_4_to_2(runs):
    clean, two = runs["clean4"], runs["two"]
    want = clean[0][2]
    for k in ("params", *STATES):
        assert all(torch.equal(two[0]["loaded"][k][n], want[k][n]) for n in want[k]), k
    for r, rep in enumerate(two):
        assert torch.equal(rep["loaded"]["rng"], clean[r][2]["rng"])  # old rank r's RNG
        assert rep["report"].bytes_read == rep["predicted_read"]
        assert rep["report"].bytes_read < sum(  # a new rank does not read every file
            (runs["tmp"] / "clean" / "step-00000002" / ckpt.shard_name(k, 4)).stat().st_size
            for k in range(4)
        )
    assert ulp_report(two[0]["final"], two[0]["reference"])["bitwise"]  # 2 ranks' arithmetic
    vs4 = ulp_report(two[0]["final"], clean[0]["final"])
    assert vs4["max_scale_ulps"] <= SCALE_ULPS and vs4["zero_grad_param_max_abs"] <= ZERO_GRAD_TOL


def test_bad_shard_seen_by_one_rank_stops_all(runs):
    errors = [rep["refusals"][0] for rep in runs["two"]]
    assert errors[0]["error"] == errors[1]["error"]
    assert "shard-3-of-4.bin" in errors[0]["error"] and "corrupt" in errors[0]["error"]
    assert all(e["untouched"] for e in errors)


def test_reshard_2_to_1(runs):
    two, one = runs["two"], runs["one"][0]
    assert one["report"].step == 3 and one["report"].bytes_read == one["predicted_read"]
    assert ulp_report(one["final"], one["reference"])["bitwise"]
    vs2 = ulp_report(one["final"], two[0]["final"])
    assert vs2["max_scale_ulps"] <= SCALE_ULPS and vs2["zero_grad_param_max_abs"] <= ZERO_GRAD_TOL
