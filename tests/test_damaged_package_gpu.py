"""A damaged tilebake-cuda on a GPU (issue 18): a corrupted, truncated or missing binary, a
manifest of another manifest version and a kernel package of another tilebake version each raise
their typed error at the first call that needs them, and the process goes on: other ops (whose
binaries are intact) still run and match their references. Each case runs in a fresh process
that imports a copy of the installed tilebake_cuda, damaged, ahead of the real one."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.gpu

# The damaged op: per_token_cast (bf16 -> e4m3, 128 columns a scale); the intact one: expand_to_mhc.
SCRIPT = textwrap.dedent("""
    import sys, torch, tilebake, tilebake.errors as E
    x = torch.randn(8, 256, device="cuda").bfloat16()
    try:
        tilebake.quant.per_token_cast(x, "e4m3", 128)
        print("NO ERROR")
    except E.TilebakeError as e:
        print(type(e).__name__, "|", e)
    o = tilebake.mhc.expand_to_mhc_fwd(x, torch.empty(8, 4, 256, device="cuda", dtype=torch.bfloat16))
    assert torch.equal(o.cpu(), x.cpu().unsqueeze(-2).expand(8, 4, 256)), "the intact op's result"
    print("OTHER OP OK")
""")


def damaged_copy(tmp_path, damage) -> str:
    """A copy of the installed tilebake_cuda under tmp_path/site, damaged by damage(kernels_dir,
    per_token_cast_binaries); returns the site dir."""
    from tilebake._runtime import loader

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    src = loader.kernel_dir().parent
    site = tmp_path / "site"
    shutil.copytree(src, site / src.name)
    kernels = site / src.name / "kernels"
    arch = loader.device_arch(0)
    entries = json.loads((kernels / "ops" / "per_token_cast.json").read_text())["kernels"].values()
    binaries = sorted({kernels / e[arch]["binary"] for e in entries if arch in e})
    damage(kernels, binaries)
    return str(site)


def run(site: str, script: str = SCRIPT) -> subprocess.CompletedProcess:
    """`script` in a fresh Python importing tilebake_cuda from `site` first."""
    paths = [site, *sys.path]
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ":".join(p for p in paths if p)})  # fmt: skip


def flip(kernels, binaries):
    for b in binaries:
        data = bytearray(b.read_bytes())
        data[len(data) // 2] ^= 0xFF
        b.write_bytes(bytes(data))


def truncate(kernels, binaries):
    for b in binaries:
        b.write_bytes(b.read_bytes()[:1000])


def remove(kernels, binaries):
    for b in binaries:
        b.unlink()


def other_manifest_version(kernels, binaries):
    path = kernels / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "manifest_version": 99}))


def other_tilebake_version(kernels, binaries):
    path = kernels / "manifest.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "tilebake_version": "0.0.1"}))


@pytest.mark.parametrize("damage, error, match", [
    (flip, "CorruptArtifactError", "does not match the sha256"),
    (truncate, "CorruptArtifactError", "does not match the sha256"),
    (remove, "CorruptArtifactError", "unreadable"),
])  # fmt: skip
def test_damaged_binary_is_named_and_other_ops_run(tmp_path, damage, error, match):
    result = run(damaged_copy(tmp_path, damage))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith(error + " |") and match in lines[0], lines
    assert lines[-1] == "OTHER OP OK"


@pytest.mark.parametrize("damage, error, match", [
    (other_manifest_version, "CorruptArtifactError", "manifest_version 99"),
    (other_tilebake_version, "KernelsNotInstalledError", "for tilebake 0.0.1"),
])  # fmt: skip
def test_foreign_manifest_is_named(tmp_path, damage, error, match):
    """A whole package refused: every op raises the same typed error (the intact op too)."""
    result = run(damaged_copy(tmp_path, damage), SCRIPT.replace('print("OTHER OP OK")', ""))
    lines = result.stdout.strip().splitlines()
    assert lines and lines[0].startswith(error + " |") and match in lines[0], (lines, result.stderr[-2000:])
    assert error in result.stderr  # the intact op's call: the same refusal, raised
