import vecops
from shardlab.grading.outside import record


def test_sent_bytes():
    got = vecops.sent_per_rank(4000, 4)
    record("sent", got)
    assert got == [6000] * 4
