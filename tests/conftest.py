"""Shared test setup: GPU tests skip cleanly without a GPU, seeds come from the test id
(a failure reproduces alone), and runtime config is reset around every test."""

import os
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


def pytest_runtest_logfinish(nodeid, location):
    """TILEBAKE_VARIANT_LOG=PATH: the kernel variants this process has loaded, one id a line, to PATH
    (PATH.<xdist worker> under pytest-xdist), rewritten after each test that loaded a new one (a run
    stopped by a time limit keeps them): bench/sanitize.sh's coverage of the binaries."""
    path = os.environ.get("TILEBAKE_VARIANT_LOG")
    if not path:
        return
    from tilebake._runtime import loader

    if len(loader.loaded_variants) != _logged[0]:
        _logged[0] = len(loader.loaded_variants)
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        with open(f"{path}.{worker}" if worker else path, "w") as f:
            f.writelines(f"{v}\n" for v in sorted(loader.loaded_variants))


_logged = [0]
