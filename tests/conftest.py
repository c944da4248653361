"""Shared fixtures: tiny random-init models and the offline character tokenizer (no downloads)."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def char_tokenizer():
    from grpokit.model.loading import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture()
def tiny_model(char_tokenizer):
    from grpokit.model.loading import tiny_random_model

    return tiny_random_model(char_tokenizer, seed=0)


@pytest.fixture()
def one_thread():
    """Run a test on one torch thread (subprocess-heavy tests leave the other core to their children)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def portable_kernels(tmp_path_factory):
    """grpokit's C kernels built without -march=native: the plain-C loops that machines without AVX2 run."""
    import ctypes

    from grpokit.fast import native

    if native.kernels() is None:
        pytest.skip("no C compiler could build grpokit's kernels")
    flag_sets = native.FLAG_SETS
    native.FLAG_SETS = ([],)
    try:
        path = native.build(tmp_path_factory.mktemp("portable"))
    finally:
        native.FLAG_SETS = flag_sets
    assert path is not None
    return native.DecodeKernels(ctypes.CDLL(str(path)))


@pytest.fixture(params=["native", "portable"])
def lib(request):
    """Each kernel test runs on the default build (AVX2 paths where the CPU has them) and the plain-C one."""
    from grpokit.fast import native

    if native.kernels() is None:
        pytest.skip("no C compiler could build grpokit's kernels")
    return native.kernels() if request.param == "native" else request.getfixturevalue("portable_kernels")
