"""Shared test setup: GPU tests skip cleanly without a GPU, seeds come from the test id
(a failure reproduces alone), and runtime config is reset around every test."""

import zlib

import pytest
import torch

import tilebake


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_and_reset(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    tilebake.config.reset_runtime_config()
    yield
    tilebake.config.reset_runtime_config()
