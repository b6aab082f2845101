"""`python -m tilebake doctor`'s Ascend part: the tilebake-ascend package, the CANN toolkit and
the NPUs, when present (torch_npu is imported only if installed: doctor is the one place that
looks for it). Never run on an NPU here; tests/ascend/ covers what runs without one.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import torch


def _cann() -> str:
    home = os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
    if not home:
        return "not found (ASCEND_HOME_PATH unset)"
    info = next(iter(Path(home).glob("**/version.cfg")), None) or next(iter(Path(home).glob("**/version.info")), None)
    version = info.read_text(errors="replace").strip().splitlines()[0] if info else "version unknown"
    return f"{home} ({version})"


def _npus() -> list[tuple[int, str, int]]:
    """(index, model, vector cores) of every visible NPU; [] without torch_npu or NPUs."""
    if importlib.util.find_spec("torch_npu") is None:
        return []
    import torch_npu  # noqa: F401  (registers torch.npu)

    from tilebake._runtime import ascend

    if not torch.npu.is_available():
        return []
    return [(i, *ascend.device_facts(i)) for i in range(torch.npu.device_count())]


def report(problem) -> None:
    """Print the Ascend lines; call problem(text) for each thing that would break an NPU call."""
    from tilebake._runtime import ascend

    npus = _npus()
    installed = importlib.util.find_spec(ascend.ASCEND_KERNELS_MODULE) is not None
    if not installed and not npus:
        print(f"{ascend.ASCEND_KERNELS_PACKAGE}: not installed (NPU tensors need it: {ascend.install_hint()})")
        return
    print(f"CANN: {_cann()}")
    built_cores: dict[str, set] = {}
    if installed:
        try:
            header = ascend.manifest_header()
        except Exception as e:  # the typed errors of a bad install, reported rather than raised
            problem(f"{ascend.ASCEND_KERNELS_PACKAGE}: {e}")
        else:
            bad = []
            for op in header["ops"]:
                for vid, per_arch in ascend.op_kernels(op).items():
                    entry = per_arch[ascend.ARCH]
                    built_cores.setdefault(op, set()).add(entry["block_dim"])
                    path = ascend.kernel_dir() / entry["binary"]
                    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != entry["sha256"]:
                        bad.append(str(path))
            count = sum(len(ascend.op_kernels(op)) for op in header["ops"])
            verdict = f"{len(bad)} bad" if bad else "all match their sha256"
            print(f"{ascend.ASCEND_KERNELS_PACKAGE} {header['tilebake_version']} at {ascend.kernel_dir().parent}: "
                  f"{count} binaries for {ascend.ARCH}, CANN {header.get('cann_version')}, {verdict}")  # fmt: skip
            for path in bad:
                problem(f"{path}: missing or sha256 mismatch")
    elif npus:
        problem(f"NPUs present but {ascend.ASCEND_KERNELS_PACKAGE} is not installed: {ascend.install_hint()}")
    for index, model, cores in npus:
        uncovered = sorted(op for op, have in built_cores.items() if cores not in have or "950" not in model)
        covered = "all ops covered" if not uncovered else f"no binary for {uncovered}"
        print(f"  npu:{index} {model}, {cores} vector cores: " + (covered if built_cores else "no kernels installed"))
