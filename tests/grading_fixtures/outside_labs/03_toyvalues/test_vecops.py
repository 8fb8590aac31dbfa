import pytest
import torch
import vecops
from _helpers_vecops import same
from shardlab.grading.outside import record


@pytest.mark.parametrize("n", [3, 8])
def test_double(n):
    x = torch.arange(n, dtype=torch.float32) + 0.25
    got = vecops.double(x)
    record("double", got)
    assert torch.equal(got, x * 2)


def test_halves():
    got = vecops.halves([1.0, 3.0, 0.1])
    record("halves", got)
    assert same(got, [0.5, 1.5, 0.05])


def test_nbytes():
    got = vecops.nbytes(torch.zeros(5, dtype=torch.float64))
    record("nbytes", got)
    assert got == 40


def test_halves_not_outside():
    assert vecops.halves([2.0]) == [1.0]
