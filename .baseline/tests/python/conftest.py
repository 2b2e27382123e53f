"""Shared pytest configuration for normjit's Python tests.

Tests marked ``cuda`` (or using the ``cuda`` fixture) are skipped with a clear message when no
NVIDIA GPU is visible. Test modules call pytest.importorskip("torch") so that a machine without
torch skips them cleanly.
"""
import pytest

NO_GPU = "no CUDA GPU: skipped (needs an NVIDIA GPU)"


def _cuda_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU (skipped otherwise)")
    config.addinivalue_line(
        "markers", "huge: needs >2^31-element tensors on the GPU (deselect with -m 'not huge')")


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason=NO_GPU)
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cuda():
    """The CUDA device; skips the test when there is no GPU."""
    if not _cuda_available():
        pytest.skip(NO_GPU)
    import torch
    return torch.device("cuda")
