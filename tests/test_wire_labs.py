"""Labs 02-04 on gloo: the wire carries gloo's algorithm for the collectives the labs issue.

The labs' "gloo algo" column must be what ``accounting.wire.gloo_sent_bytes`` predicts for the
step's collectives (DDP: an all-reduce, the ring model; ZeRO-1/2: reduce-scatter as an
all-reduce, ``2U``, plus an all-gather ``U``, so 1.5x the formula; FSDP: two all-gathers and a
reduce-scatter, ``4U``), and the measured wire must be that payload plus gloo's control
messages: a multiple of 48 bytes, at most 1 KiB per collective (measured 576 B per
collective at D = 2 for these ~1-10 KB tensors).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labs" / "02_ddp"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labs" / "03_zero"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labs" / "04_fsdp"))

import pytest  # noqa: E402
from shardlab import accounting as acc  # noqa: E402
from shardlab.accounting.wire import GLOO_PREAMBLE_BYTES  # noqa: E402
from shardlab.runtime import launch  # noqa: E402

D, Q = 2, 4
# about a minute of 2-rank runs of three labs: make test-slow
pytestmark = pytest.mark.slow

PER_COLLECTIVE = 1024  # bytes of control allowed per collective


def _control_ok(wire, payload, calls):
    control = wire - payload
    return control % GLOO_PREAMBLE_BYTES == 0 and 0 <= control <= PER_COLLECTIVE * calls


def test_ddp_and_zero_wire():
    ddp = launch("_workers_ddp:measure", D, timeout=240, quiet=True)
    zero = launch("_workers_zero:measure", D, timeout=240, quiet=True)
    for m in ddp:
        n = m["n_params"]
        assert m["step_backend"] == acc.step_volume("ddp", n, D, Q)  # gloo's all-reduce = ring
        assert _control_ok(m["step_wire"], m["step_backend"], m["step_calls"]), m
    for per_rank in zero:
        for stage in ("zero1", "zero2"):
            z = per_rank[stage]
            v = Q * z["padded_numel"]
            gloo = acc.gloo_sent_bytes("reduce_scatter", v, D) + acc.gloo_sent_bytes(
                "all_gather", v, D
            )
            assert (
                z["step_backend"] == gloo == 1.5 * acc.step_volume(stage, z["padded_numel"], D, Q)
            )
            assert _control_ok(z["step_wire"], gloo, z["step_calls"]), (stage, z)


def test_fsdp_wire():
    rows = launch("_workers_fsdp:comm_rows", D, D, timeout=240, quiet=True)
    for per_rank in rows:
        for row in per_rank:
            u = Q * row["N_padded"] * (D - 1) / D  # all-gather / ring reduce-scatter of all units
            units = row["reduce_scatters"]  # every unit's gradient is reduce-scattered once
            calls = row["all_gathers"] + units
            assert row["gloo_bytes"] == u * (row["all_gathers"] / units + 2)  # 4U or 3U
            assert _control_ok(row["wire_bytes"], row["gloo_bytes"], calls), row
