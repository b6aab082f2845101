"""Helpers of the call-plan tests (tests/test_plans*.py): build an op's plan on the CPU from
the installed manifest and trace it (every step but the launch)."""

import pytest

from tilebake._runtime import loader, plan
from tilebake._runtime.loader import _native

needs_plans = pytest.mark.skipif(not plan.available(), reason="torch without the DLPack C exchange API 1.3")


class ManifestKernel:
    """A kernel's launch spec from the installed manifest (sm_90a), as loader.Kernel gives it on
    a GPU: plans build from it without one."""

    def __init__(self, variant):
        self.variant = variant
        entry = loader.op_kernels(variant.op)[variant.id]["sm_90a"]
        names = tuple(p["name"] for p in entry["params"])
        kinds = tuple(p["kind"] for p in entry["params"])
        self.spec = (names, kinds, tuple(entry["grid"]), tuple(int(b) for b in entry["block"]), entry["dynamic_smem"])

    def launch_spec(self, device):
        return self.spec

    def handle(self, device):
        raise AssertionError("a trace never launches")


def trace(p, *args):
    result, launches = _native().trace(p, *args)
    return result, launches


def params_of(kernel, launch):
    """{name: value} of a traced launch of `kernel`."""
    return dict(zip(kernel.spec[0], launch[4]))
