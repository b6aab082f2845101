"""The Ascend runtime without an NPU: tilebake's launcher (acl_launcher.c) and loader
(tilebake/_runtime/ascend.py) against a stand-in libascendcl (standin_ascendcl.c,
built here) that records every call. The kernel package is this tree's backends/ascend built by
its CMake with a stand-in CANN toolchain (binaries that only name their variant), checked by
check_wheel.py and installed. For every Ascend variant: one load per device with the entry the manifest names,
then launches with its block count, its unified-buffer attribute and the argument bytes at the
offsets its parameter list gives (8 bytes a pointer, scalars aligned to max(size, 4), the total
rounded up to 8). Also the typed errors, the package's checks and doctor (the public ops on NPU
tensors: test_quant_ops.py). Each case runs in a fresh interpreter (the launcher opens
libascendcl once a process)."""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.ascend.harness import ARCH, VARIANTS, expected_args, run


def test_every_variant_loads_and_launches_as_the_manifest_says(setup):
    body = """
    for k, v in enumerate(all_variants("ascend")):
        args = [0x10000 * (j + 1) + k if p.dtype == "handle" else 1.5 if p.dtype == "float32" else 100 + j
                for j, p in enumerate(v.params())]
        kernel = ascend.AscendKernel(v)
        kernel(0, *args)
        kernel(0, *args)  # loaded once a device
        print(json.dumps({"id": v.id, "args": dict(zip(v.arg_names, args))}))
    """
    result, calls = run(setup, body)
    assert result.returncode == 0, result.stderr
    sent = [json.loads(line) for line in result.stdout.splitlines()]
    assert [s["id"] for s in sent] == [v.id for v in VARIANTS]
    kernels = setup[1]
    per_variant = [calls[i : i + 4] for i in range(0, len(calls), 4)]
    assert len(calls) == 4 * len(VARIANTS)
    for s, lines in zip(sent, per_variant):
        v = next(v for v in VARIANTS if v.id == s["id"])
        entry = json.loads((kernels / "ops" / f"{v.op}.json").read_text())["kernels"][v.id][ARCH]
        image = (kernels / ARCH / f"{v.id}.aibin").read_bytes()
        assert image == f"AIBIN REL {v.id}".encode()  # this variant's binary, through the build
        assert lines[0] == f"load {len(image)} {image.decode()} 1"
        assert lines[1] == f"function {entry['entry']}"
        packed = expected_args(entry["params"], [s["args"][p["name"]] for p in entry["params"]])
        attr = f" attr 2 {entry['ub_bytes']}" if entry["ub_bytes"] else ""
        expect = (
            f"launch {entry['entry']} {entry['block_dim']} 0x5000 {1 if attr else 0}{attr} "
            f"args {len(packed)} {packed.hex()} placeholders (nil) 0"
        )
        assert lines[2] == lines[3] == expect
        assert entry["block_dim"] == v.num_vec_cores


@pytest.mark.parametrize(
    "case,env,model,cores,error,match",
    [
        ("no package", {}, "Ascend950PR_9589", 64, "KernelsNotInstalledError", "pip install tilebake-ascend=="),
        ("model", {}, "Ascend910B3", 64, "NoBinaryForDeviceError", "Ascend910B3 with 64 vector cores"),
        ("cores", {}, "Ascend950PR_9589", 32, "NoBinaryForDeviceError", "32 vector cores.*with 64 vector cores"),
        (
            "load",
            {"STANDIN_ACL_FAIL": "load"},
            "Ascend950PR_9589",
            64,
            "AscendRuntimeError",
            "aclrtBinaryLoadFromData failed with ACL error 107000: stand-in failure",
        ),
        (
            "launch",
            {"STANDIN_ACL_FAIL": "launch"},
            "Ascend950PR_9589",
            64,
            "AscendRuntimeError",
            "aclrtLaunchKernelWithHostArgs failed with ACL error 507015",
        ),
        (
            "device",
            {"STANDIN_ACL_DEVICE": "1"},
            "Ascend950PR_9589",
            64,
            "RuntimeError",
            "loading a kernel for npu:0 while npu:1 is current",
        ),
    ],
)
def test_typed_errors(setup, case, env, model, cores, error, match):
    body = f"""
    import re
    v = all_variants("ascend")[0]
    if {case!r} == "cores":
        v = type(v)(**{{**vars(v), "num_vec_cores": ascend.vector_cores(0)}})
    try:
        ascend.AscendKernel(v)(0, *[0] * len(v.params()))
    except Exception as e:
        print(type(e).__name__, str(e).replace(chr(10), " "))
    """
    result, _ = run(setup, body, model=model, cores=cores, env=env, site=case != "no package")
    assert result.returncode == 0, result.stderr
    name, _, message = result.stdout.strip().partition(" ")
    assert name == error, result.stdout
    assert re.search(match, message), message


def test_corrupt_binary_and_stage1_only_package(setup, tmp_path):
    site, kernels, lib = setup
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    v = VARIANTS[0]
    (copy / "tilebake_ascend" / "kernels" / ARCH / f"{v.id}.aibin").write_bytes(b"tampered")
    result, _ = run(
        (copy, kernels, lib),
        """
    v = all_variants("ascend")[0]
    try:
        ascend.AscendKernel(v)(0, *[0] * len(v.params()))
    except Exception as e:
        print(type(e).__name__, e)
    """,
    )
    assert result.stdout.startswith("CorruptArtifactError") and "sha256" in result.stdout
    manifest = copy / "tilebake_ascend" / "kernels" / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "stage1_only": True}))
    result, _ = run(
        (copy, kernels, lib),
        """
    try:
        ascend.AscendKernel(all_variants("ascend")[0])
    except Exception as e:
        print(type(e).__name__, e)
    """,
    )
    assert result.stdout.startswith("CorruptArtifactError") and "stage-1 output only" in result.stdout
    assert hashlib.sha256(b"tampered").hexdigest() not in manifest.read_text()


def test_import_tilebake_loads_no_ascend_module(setup):
    """import tilebake (and a CPU call) imports neither torch_npu, tilelang nor the Ascend runtime."""
    body = """
    import sys, torch, tilebake
    tilebake.quant.per_token_cast(torch.randn(2, 128), "e4m3", 32)
    print(sorted(m for m in sys.modules if "npu" in m or "ascend" in m or m == "tilelang"))
    """
    result, calls = run(setup, body, prelude=False)
    assert result.returncode == 0 and result.stdout.strip() == "[]" and calls == []


def test_doctor_reports_the_ascend_package(setup, tmp_path):
    site, _, _ = setup

    def doctor(site_dir):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site_dir), os.environ.get("PYTHONPATH", "")])}
        return subprocess.run([sys.executable, "-m", "tilebake", "doctor"], capture_output=True, text=True, env=env)

    result = doctor(site)
    assert f"{len(VARIANTS)} binaries for {ARCH}" in result.stdout and "all match their sha256" in result.stdout
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    (copy / "tilebake_ascend" / "kernels" / ARCH / f"{VARIANTS[0].id}.aibin").write_bytes(b"tampered")
    result = doctor(copy)
    assert result.returncode == 1 and "1 bad" in result.stdout and "sha256 mismatch" in result.stdout
