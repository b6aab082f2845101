"""bench/ddp_step.py (issue 19): a two-process data-parallel training step through the quant, moe,
engram and mhc ops. Two gloo processes on the CPU (the reference path; CI), then two nccl
processes, one per GPU, on a two-GPU host: both ranks must hold bit-identical averaged gradients,
equal to a one-process run of the same inputs, and a planted mismatch must be reported."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TWO_GPUS

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "ddp_step.py"


def run(*args: str) -> tuple[int, dict]:
    """(exit status, rank 0's JSON report) of the script in a fresh Python with this sys.path."""
    paths = os.pathsep.join(p for p in sys.path if p)
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": paths})  # fmt: skip
    assert result.stdout.lstrip().startswith("{"), f"no report; stderr: {result.stderr[-3000:]}"
    return result.returncode, json.loads(result.stdout)


def assert_agree(report: dict, backend: str) -> None:
    assert report["ok"], report
    assert (report["backend"], report["world_size"]) == (backend, 2)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    for r in report["ranks"]:
        assert r["ranks_bitwise_equal"] and r["matches_one_process"] and r["finite"], r
        assert r["max_abs_diff_vs_one_process"] == 0.0
    # every parameter has a gradient (none cut off, e.g. by the engram gate's clamp)
    assert all(norm > 0 for norm in report["grad_norms"].values()), report["grad_norms"]


def _loopback_works() -> bool:
    """Whether a TCP connection to 127.0.0.1 can be made: gloo's processes meet there. Not in a
    network namespace whose loopback is down (build_tools/offline_check.sh's `unshare -n`)."""
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            socket.create_connection(server.getsockname(), timeout=5).close()
        return True
    except OSError:
        return False


NEEDS_LOOPBACK = pytest.mark.skipif(not _loopback_works(), reason="no TCP loopback for gloo (a network namespace)")


@NEEDS_LOOPBACK
def test_two_cpu_processes_agree_bit_for_bit():
    status, report = run("--backend", "gloo")
    assert status == 0
    assert_agree(report, "gloo")
    assert [r["device"] for r in report["ranks"]] == ["cpu", "cpu"]


@NEEDS_LOOPBACK
def test_a_mismatch_between_ranks_is_reported():
    status, report = run("--backend", "gloo", "--break-rank", "1")
    assert status == 1 and not report["ok"]
    first, second = report["ranks"]
    assert not first["ranks_bitwise_equal"] and not second["ranks_bitwise_equal"]
    assert first["matches_one_process"] and not second["matches_one_process"]


@pytest.mark.gpu
@TWO_GPUS
def test_two_gpus_with_nccl_agree_bit_for_bit():
    status, report = run("--backend", "nccl")
    assert status == 0, report
    assert_agree(report, "nccl")
    assert [r["device"].split()[0] for r in report["ranks"]] == ["cuda:0", "cuda:1"]
    assert report["missing_kernels"] == []
