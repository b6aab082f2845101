"""Command line: `python -m tilebake list` and `python -m tilebake doctor [--require OPS]`.

Both work offline and compile nothing. `list` prints the variants of the installed kernel
package (tilebake-cuda). `doctor` says which backend this machine has, which kernel package
is installed, which archs its devices are and whether the installed binaries cover them,
verifies every binary against the manifest's sha256, and on a GPU smoke-runs every op
against its reference. `--require per_token_cast,cast_back` exits 1 unless those ops can
run on every GPU here (for cluster health checks).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import re
import sys
from pathlib import Path

import torch

import tilebake
from tilebake._runtime import loader
from tilebake.errors import TilebakeError


def _ops_by_arch(manifest: dict) -> dict[str, dict[str, set[str]]]:
    """op -> arch -> the variant ids built for it."""
    ops: dict[str, dict[str, set[str]]] = {}
    for vid, per_arch in manifest["kernels"].items():
        for arch, entry in per_arch.items():
            ops.setdefault(entry["op"], {}).setdefault(arch, set()).add(vid)
    return ops


def _kernels_or_reason() -> tuple[dict | None, str]:
    """The installed kernels' whole manifest, or None and why there is none."""
    try:
        return loader.manifest(), ""
    except TilebakeError as e:  # not installed, another version, or a broken install
        return None, str(e)


def cmd_list(args) -> int:
    manifest, reason = _kernels_or_reason()
    if manifest is None:
        print(f"tilebake {tilebake.__version__}: no kernels: {reason}")
        return 1
    print(
        f"tilebake {tilebake.__version__}, {loader.CUDA_KERNELS_PACKAGE} at {loader.kernel_dir().parent}: "
        f"{len(manifest['kernels'])} variants, built with tilelang "
        f"{manifest['tilelang_version']}, nvcc {manifest['nvcc_version']}, commit {manifest['git_commit']}"
    )
    for vid, per_arch in sorted(manifest["kernels"].items()):
        print(f"{vid}  [{', '.join(sorted(per_arch))}]")
    return 0


def driver_release(proc_version: str) -> str | None:
    """The release in /proc/driver/nvidia/version ("... Kernel Module  580.65.06  ...", or "... Open
    Kernel Module for x86_64  580.159.04  ...")."""
    match = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", proc_version)
    return match.group(1) if match else None


def _driver() -> tuple[str, int | None]:
    """(what to print: the driver release and the CUDA version it supports, that CUDA major or None)."""
    try:
        release = driver_release(Path("/proc/driver/nvidia/version").read_text()) or "release unknown"
    except OSError:
        release = "release unknown"
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            cuda = version.value
            return f"{release} (CUDA {cuda // 1000}.{cuda % 1000 // 10})", cuda // 1000
    except OSError:
        pass
    return "not found", None


def _verify_artifacts(manifest: dict) -> list[str]:
    problems = []
    for per_arch in manifest["kernels"].values():
        for entry in per_arch.values():
            path = loader.kernel_dir() / entry["binary"]
            try:
                if hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
                    problems.append(f"{path}: sha256 mismatch")
            except OSError as e:
                problems.append(f"{path}: {e}")
    return problems


def _smoke_run(device: int) -> list[str]:
    """Every op once on `device` against its reference (tilebake._smoke): "op: what differs" per failure."""
    from tilebake._smoke import run_smoke

    return run_smoke(torch.device("cuda", device))


def cmd_doctor(args) -> int:
    required = [op for op in (args.require or "").split(",") if op]
    problems = []

    def problem(text: str) -> None:  # printed where it is found; any makes the exit status 1
        problems.append(text)
        print(f"  {text}")

    print(f"tilebake {tilebake.__version__} (runtime) at {Path(tilebake.__file__).parent}")
    driver, driver_cuda_major = _driver()
    print(f"torch {torch.__version__}, CUDA runtime {torch.version.cuda}, driver {driver}")
    from tilebake._runtime import plan

    print("call path: " + ("native (torch's DLPack C exchange API 1.3)" if plan.available() else
                           "Python (this torch has no DLPack C exchange API 1.3; calls cost more host time)"))  # fmt: skip
    manifest, reason = _kernels_or_reason()
    if manifest is None:
        print(f"{loader.CUDA_KERNELS_PACKAGE}: {reason}")
        if torch.cuda.is_available():
            problem(f"no usable {loader.CUDA_KERNELS_PACKAGE}")
        print("artifacts: none")
        manifest = {"kernels": {}}
    else:
        print(f"{loader.CUDA_KERNELS_PACKAGE} {manifest['tilebake_version']} at {loader.kernel_dir().parent}")
        print(f"binaries: {', '.join(manifest['backends']['cuda']['archs'])}; tilelang {manifest['tilelang_version']}, "
              f"nvcc {manifest['nvcc_version']}, commit {manifest['git_commit']}")  # fmt: skip
        # SASS cubins of CUDA 13.x need a driver of the CUDA 13 family or newer (README, driver versions).
        built_major = int(manifest["nvcc_version"].split("release ")[1].split(".")[0])
        if driver_cuda_major is not None and driver_cuda_major < built_major:
            problem(f"the driver supports CUDA {driver_cuda_major}; the kernels need {built_major} (R580+)")
        unknown = [op for op in required if op not in manifest["ops"]]
        if unknown:
            print(f"--require: unknown ops {unknown}; the installed kernels have {manifest['ops']}")
            return 2
        bad_artifacts = _verify_artifacts(manifest)
        count = sum(len(per_arch) for per_arch in manifest["kernels"].values())
        verdict = f"{len(bad_artifacts)} bad:" if bad_artifacts else "all match their sha256"
        print(f"artifacts: {count} binaries, {verdict}")
        for bad in bad_artifacts:
            problem(bad)
    ops = _ops_by_arch(manifest)

    uncovered = set(required)
    if not torch.cuda.is_available():
        print("backend: none (no CUDA device); every op runs on its pure-torch reference on CPU tensors")
    else:
        print("backend: cuda")
        uncovered = set(required) - set(ops)  # all of them when no kernels are installed
        runnable = not problems  # (bad binaries, an old driver): no smoke run; one GPU's failure skips no other
        for device in range(torch.cuda.device_count()):
            arch = loader.device_arch(device)
            missing = sorted(op for op in ops if arch not in ops[op])
            uncovered |= set(missing) & set(required)
            if not ops:
                covered = "no kernels installed"
            else:
                covered = "all ops covered" if not missing else f"no binary for {missing}"
            print(f"  cuda:{device} {torch.cuda.get_device_name(device)}: {arch}, {covered}")
            if ops and not missing and runnable:
                failures = _smoke_run(device)
                print("    smoke run: " + ("every op matches its reference" if not failures else f"FAILED {failures}"))
                problems += [f"cuda:{device} smoke run {failure}" for failure in failures]
                uncovered |= {failure.split(":", 1)[0] for failure in failures} & set(required)
    from tilebake import _doctor_ascend

    _doctor_ascend.report(problem)
    if required:
        print(f"--require {','.join(required)}: " + ("ok" if not uncovered else f"NOT covered: {sorted(uncovered)}"))
    return 1 if problems or uncovered else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tilebake", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print the compiled variants").set_defaults(fn=cmd_list)
    doctor = sub.add_parser("doctor", help="check this machine against the installed binaries")
    doctor.add_argument("--require", metavar="OPS", help="comma-separated ops that must run on every GPU here")
    doctor.set_defaults(fn=cmd_doctor)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except BrokenPipeError:  # `list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
