"""Reproducible randomness per test: `--seed N` (default 0) plus a hash of the test's node id
seeds Python's `random`, torch and tilebake.rand before each test, so a failing case reruns
alone with the same inputs."""

from __future__ import annotations

import hashlib
import random

import pytest

import tilebake.rand


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=0, help="base seed, combined with each test's node id")


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """The seed this test ran with (also set up for it)."""
    digest = hashlib.sha256(request.node.nodeid.encode()).digest()
    value = request.config.getoption("--seed") + int.from_bytes(digest, "big") % 2**31
    random.seed(value)
    tilebake.rand.set_seed(value)  # torch's generators and tilebake.rand's seed counter
    return value
