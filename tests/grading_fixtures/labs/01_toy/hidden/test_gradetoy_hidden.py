import gradetoy
from _helpers_gradetoy import approx_equal

HIDDEN_SENTINEL = "hidden-test-text-that-must-never-ship"


def test_mean_hidden():
    assert approx_equal(gradetoy.mean([2.0, 4.0]), 3.0), HIDDEN_SENTINEL


def test_chunk_last():
    assert gradetoy.chunk(list(range(9)), 3, 2) == [6, 7, 8]
