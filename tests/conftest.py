"""Shared fixtures: tiny random-init models and the offline character tokenizer (no downloads)."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def char_tokenizer():
    from grpokit.models import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture()
def tiny_model(char_tokenizer):
    from grpokit.models import tiny_random_model

    return tiny_random_model(char_tokenizer, seed=0)


@pytest.fixture()
def one_thread():
    """Run a test on one torch thread (subprocess-heavy tests leave the other core to their children)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
