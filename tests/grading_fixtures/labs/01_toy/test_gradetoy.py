import gradetoy
import pytest
from _helpers_gradetoy import approx_equal


@pytest.mark.parametrize("a,b", [(1, 2), (0, 0), (-3, 5), (2.5, 0.5)])
def test_add(a, b):
    assert gradetoy.add(a, b) == a + b


def test_chunk():
    assert gradetoy.chunk(list(range(8)), 4, 1) == [2, 3]


def test_mean():
    assert approx_equal(gradetoy.mean([1, 2, 3, 6]), 3.0)


def test_scale():
    assert gradetoy.scale([1, 2], 3) == [3, 6]


@pytest.mark.gpu
def test_cuda_only():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs GPU")
    assert gradetoy.add(1, 1) == 2
