"""Lab 01's student ring on gloo: the payload on the wire is the ring model, exactly.

Control bytes (``accounting.wire.GLOO_PREAMBLE_BYTES`` = 48 each): every ``irecv`` writes one
"ready to receive" notification; every ``isend`` writes the chunk behind a 48-byte preamble,
plus a "ready to send" notification when the peer's receive was not posted yet, which depends
on timing. So wire - payload is a multiple of 48 between ``48 (sends + recvs)`` and
``48 (2 sends + recvs)``: at most 288 B wide here, while a missing or extra chunk would move
the wire by >= 2 KB (12,000 fp32 elements / D). Inside that band, the payload equals
``accounting.comm.ring_sent_bytes`` when D divides the element count, and the trace's own count
of the bytes handed to the transport for uneven chunks. Compare tests/test_wire_collectives.py:
gloo's own reduce-scatter sends twice this.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import _wire_workers as w  # noqa: E402
from shardlab import accounting as acc  # noqa: E402
from shardlab.accounting.wire import GLOO_PREAMBLE_BYTES, gloo_p2p_control_bytes  # noqa: E402
from shardlab.runtime import launch  # noqa: E402

SIZES = [12_000, 1001]  # divisible by 2, 3 and 4; and not


# D = 2 in make test; the odd and the larger ring (3, 4) in make test-slow
@pytest.mark.parametrize(
    "d", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)]
)
def test_student_ring_wire_bytes_equal_ring_model(d):
    res = launch(w.student_ring, d, SIZES, timeout=240, quiet=True)
    for per_rank in res:  # control band: accounting.wire.gloo_p2p_control_bytes
        for case in per_rank:
            assert case["ops"] == ["recv", "send"]  # point-to-point only
            s, r = case["sends"], case["recvs"]
            if case["numel"] % d == 0:
                assert case["sent"] == acc.ring_sent_bytes(case["op"], 4 * case["numel"], d)
                steps = 2 * (d - 1) if case["op"] == "all_reduce" else d - 1
                assert s == r == steps
            control = case["wire"] - case["sent"]
            least, most = gloo_p2p_control_bytes(s, r)
            assert control % GLOO_PREAMBLE_BYTES == 0 and least <= control <= most, case
