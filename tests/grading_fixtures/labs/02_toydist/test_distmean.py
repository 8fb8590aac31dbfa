import _workers_distmean
import pytest
from shardlab.runtime import launch


def test_mean_two_ranks():
    out = launch(_workers_distmean.mean_worker, 2, 3, timeout=90, quiet=True)
    assert out == [[0.5, 1.5, 2.5], [0.5, 1.5, 2.5]]


@pytest.mark.gpu
def test_mean_on_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs GPU")
    out = launch(_workers_distmean.mean_worker, 1, 2, timeout=90, quiet=True)
    assert out == [[0.0, 1.0]]
