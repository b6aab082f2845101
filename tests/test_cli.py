"""`python -m tilebake list` and `doctor`, as a user runs them (a subprocess, offline)."""

import subprocess
import sys

import torch

from tilebake._registry import all_variants


def run(*args):
    return subprocess.run([sys.executable, "-m", "tilebake", *args], capture_output=True, text=True)


def test_list_prints_every_variant_with_its_archs():
    result = run("list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"{len(all_variants())} variants" in lines[0]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(v.id for v in all_variants())
    assert all(line.endswith("[sm_100a, sm_90a]") for line in lines[1:])


def test_doctor_verifies_artifacts_and_reports_backend():
    result = run("doctor")
    assert "all match their sha256" in result.stdout, result.stdout
    if torch.cuda.is_available():
        assert result.returncode == 0 and "every op matches its reference" in result.stdout, result.stdout
    else:
        assert result.returncode == 0 and "backend: none" in result.stdout, result.stdout


def test_doctor_require():
    result = run("doctor", "--require", "nonexistent_op")
    assert result.returncode == 2 and "unknown ops ['nonexistent_op']" in result.stdout
    result = run("doctor", "--require", "per_token_cast,cast_back")
    if torch.cuda.is_available():
        assert result.returncode == 0 and "--require per_token_cast,cast_back: ok" in result.stdout, result.stdout
    else:  # no GPU here: the ops cannot run on one
        assert result.returncode == 1 and "NOT covered: ['cast_back', 'per_token_cast']" in result.stdout


def test_doctor_flags_a_driver_older_than_the_kernels(monkeypatch, capsys):
    from tilebake import __main__ as cli

    monkeypatch.setattr(cli, "_driver", lambda: ("535.104.05 (CUDA 12.2)", 12))
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "driver 535.104.05 (CUDA 12.2)" in out and "the driver supports CUDA 12; the kernels need 13" in out


def test_list_into_a_closed_pipe_is_quiet(monkeypatch, tmp_path):
    """`python -m tilebake list | head`: a reader that closed the pipe ends `list` with status 0 and
    no traceback (the output is too small to fill a pipe, so the closed pipe is simulated)."""
    from tilebake import __main__ as cli

    class ClosedPipe:
        def __init__(self):
            self.file = open(tmp_path / "stdout", "w")  # the fd that is pointed at /dev/null

        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self):
            return self.file.fileno()

        def flush(self):
            pass

    closed = ClosedPipe()
    monkeypatch.setattr(sys, "stdout", closed)
    assert cli.main(["list"]) == 0
    closed.file.close()


def test_driver_release_is_read_from_both_kernel_module_flavours():
    from tilebake.__main__ import driver_release

    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:31 UTC 2025\n"
    open_module = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (builder)\n"
    assert driver_release(proprietary) == "580.65.06"
    assert driver_release(open_module) == "580.159.04"
    assert driver_release("") is None


def test_doctor_lists_and_smoke_runs_every_gpu(monkeypatch, capsys):
    """Two GPUs (issue 19), simulated: each is listed and smoke-run, and a failure on cuda:0 does not
    keep cuda:1 from its own run."""
    from pathlib import Path

    from tilebake import __main__ as cli
    from tilebake._runtime import loader, plan

    entry = {"op": "per_token_cast", "binary": "b.cubin", "sha256": "0"}
    manifest = {
        "tilebake_version": "0", "tilelang_version": "0", "git_commit": "0", "ops": ["per_token_cast"],
        "nvcc_version": "Cuda compilation tools, release 13.0, V13.0.88", "backends": {"cuda": {"archs": ["sm_90a"]}},
        "kernels": {"per_token_cast.v": {"sm_90a": entry}},
    }  # fmt: skip
    smoke_runs = []

    def smoke_run(device):
        smoke_runs.append(device)
        return ["per_token_cast: 1 of 2 elements differ"] if device == 0 else []

    monkeypatch.setattr(loader, "manifest", lambda: manifest)
    monkeypatch.setattr(loader, "kernel_dir", lambda: Path("/kernels/tilebake_cuda/kernels"))
    monkeypatch.setattr(loader, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(plan, "available", lambda: True)
    monkeypatch.setattr(cli, "_driver", lambda: ("580.159.04 (CUDA 13.0)", 13))
    monkeypatch.setattr(cli, "_verify_artifacts", lambda manifest: [])
    monkeypatch.setattr(cli, "_smoke_run", smoke_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: f"GPU {device}")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "cuda:0 GPU 0: sm_90a, all ops covered" in out and "cuda:1 GPU 1: sm_90a, all ops covered" in out, out
    assert smoke_runs == [0, 1], out
    assert "smoke run: FAILED ['per_token_cast: 1 of 2 elements differ']" in out
    assert "smoke run: every op matches its reference" in out
