"""The loader's choices and errors, checked without a GPU: arch selection, an arch with no
binary, a corrupt binary, a variant that is not built, and the native module's contract."""

import dataclasses
import shutil

import pytest
import torch

from tilebake._runtime import loader
from tilebake._variants import Param
from tilebake.errors import CorruptArtifactError, NoBinaryForDeviceError, VariantNotBuiltError
from tilebake.quant.per_token_cast import PerTokenCastVariant

VARIANT = PerTokenCastVariant("bf16", "e4m3", 128, "fp32")
ARGS = VARIANT.arg_names  # its declaration (PerTokenCastVariant.params)


@dataclasses.dataclass(frozen=True)
class _Misdeclared(PerTokenCastVariant):
    """The same variant (same id, so the same manifest entry) declaring other parameters."""

    def params(self):
        if self.sf_mode == "fp32":  # the last name wrong
            return super().params()[:-1] + (Param("bogus", "int32"),)
        return tuple(Param(p.name, "float32") if p.name == "hidden" else p for p in super().params())  # a dtype wrong


def test_arch_of_compute_capability():
    assert loader.arch_of((9, 0)) == "sm_90a"
    assert loader.arch_of((10, 0)) == "sm_100a"
    assert loader.arch_of((12, 0)) == "sm_120a"
    assert loader.arch_of((8, 0)) == "sm_80"


@pytest.fixture
def fake_device(monkeypatch):
    """Pretend device 0 has a given arch, without touching CUDA."""

    def set_arch(arch):
        monkeypatch.setattr(loader, "device_arch", lambda index: arch)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Fake GPU")

    return set_arch


def test_device_without_binary_names_both_archs(fake_device):
    fake_device("sm_120a")
    with pytest.raises(NoBinaryForDeviceError, match=r"cuda:0 \(Fake GPU\) is sm_120a; .* sm_100a, sm_90a"):
        loader.Kernel(VARIANT)(0, *range(len(ARGS)))


def test_corrupt_binary_is_named(fake_device, monkeypatch, tmp_path):
    fake_device("sm_90a")
    kernels = tmp_path / "kernels"
    shutil.copytree(loader.kernel_dir(), kernels)
    binary = kernels / loader.manifest()["kernels"][VARIANT.id]["sm_90a"]["binary"]
    data = bytearray(binary.read_bytes())
    data[100] ^= 0xFF
    binary.write_bytes(bytes(data))
    monkeypatch.setattr(loader, "kernel_dir", lambda: kernels)
    with pytest.raises(CorruptArtifactError, match=f"{binary.name} does not match the sha256"):
        loader.Kernel(VARIANT)(0, *range(len(ARGS)))
    binary.unlink()
    with pytest.raises(CorruptArtifactError, match="unreadable"):
        loader.Kernel(VARIANT)(0, *range(len(ARGS)))


def _clear_manifest_caches():
    for cached in (loader.manifest, loader.manifest_header, loader.op_kernels):
        cached.cache_clear()


def test_missing_manifest(monkeypatch, tmp_path):
    monkeypatch.setattr(loader, "kernel_dir", lambda: tmp_path)
    _clear_manifest_caches()
    try:
        with pytest.raises(CorruptArtifactError, match="manifest.json is missing"):
            loader.manifest()
        (tmp_path / "manifest.json").write_text('{"manifest_version": 99}')
        _clear_manifest_caches()
        with pytest.raises(CorruptArtifactError, match="manifest_version 99"):
            loader.manifest()
    finally:
        _clear_manifest_caches()


def test_missing_or_corrupt_op_manifest(monkeypatch, tmp_path):
    """An op's own manifest file (kernels/ops/<op>.json) missing or unparsable is named."""
    kernels = tmp_path / "kernels"
    shutil.copytree(loader.kernel_dir(), kernels)
    monkeypatch.setattr(loader, "kernel_dir", lambda: kernels)
    _clear_manifest_caches()
    try:
        op_file = kernels / "ops" / f"{VARIANT.op}.json"
        op_file.write_text("{not json")
        with pytest.raises(CorruptArtifactError, match=f"{op_file.name} is unreadable"):
            loader.Kernel(VARIANT)
        _clear_manifest_caches()
        op_file.unlink()
        with pytest.raises(CorruptArtifactError, match=f"{op_file.name} is missing"):
            loader.Kernel(VARIANT)
    finally:
        _clear_manifest_caches()


def test_unbuilt_variant_lists_the_closest():
    with pytest.raises(VariantNotBuiltError) as info:
        loader.Kernel(PerTokenCastVariant("fp16", "e4m3", 128, "fp32"))
    message = str(info.value)
    assert (
        "per_token_cast.in_dtype-fp16" in message
        and "in_dtype-bf16.fmt-e4m3.num_per_channels-128.sf_mode-fp32" in message
    )


def test_closest_variants_come_from_the_wheel(monkeypatch):
    """A wheel built without a variant (a partial build) names only variants it holds, never the
    missing one itself, and says so when it holds none of the op."""
    wanted = PerTokenCastVariant("bf16", "e4m3", 128, "fp32")
    kept = PerTokenCastVariant("bf16", "e4m3", 32, "fp32")
    partial = {kept.id: {}}
    monkeypatch.setattr(loader, "op_kernels", lambda op: partial if op == wanted.op else {})
    with pytest.raises(VariantNotBuiltError) as info:
        loader.Kernel(wanted)
    listed = str(info.value).split("closest built variants:")[1].split()
    assert listed == [kept.id]
    partial.clear()
    with pytest.raises(VariantNotBuiltError, match="nor any other per_token_cast variant"):
        loader.Kernel(wanted)


def test_parameter_mismatch_is_reported(fake_device):
    fake_device("sm_90a")
    with pytest.raises(CorruptArtifactError, match="takes parameters .*'sf_stride_g:i'.*'bogus:i'"):
        loader.Kernel(_Misdeclared(*dataclasses.astuple(VARIANT)))(0, *range(len(ARGS)))
    with pytest.raises(CorruptArtifactError, match="takes parameters .*'hidden:i'.*'hidden:f'"):
        loader.Kernel(_Misdeclared("bf16", "e4m3", 128, "round"))(0, *range(len(ARGS)))


def test_native_launcher_imports_without_a_gpu():
    from tilebake._runtime import _launcher

    with pytest.raises(TypeError):
        _launcher.launch(0)
    if not torch.cuda.is_available():
        # No driver here: loading must fail with a clear error, never crash.
        with pytest.raises(RuntimeError, match="CUDA driver|cuInit"):
            _launcher.load(b"\x7fELF", "k", 0, 0)


def test_manifest_launch_expressions_are_checked_before_evaluation(fake_device, monkeypatch, tmp_path):
    """The grid comes from the manifest as text: anything but integer arithmetic on the
    kernel's parameters is refused as a corrupt artifact, never evaluated."""
    import json

    fake_device("sm_90a")
    kernels = tmp_path / "kernels"
    shutil.copytree(loader.kernel_dir(), kernels)
    op_file = kernels / "ops" / f"{VARIANT.op}.json"
    data = json.loads(op_file.read_text())
    data["kernels"][VARIANT.id]["sm_90a"]["grid"][0] = "__import__('os').getpid()"
    op_file.write_text(json.dumps(data))
    monkeypatch.setattr(loader, "kernel_dir", lambda: kernels)
    _clear_manifest_caches()
    try:
        with pytest.raises(CorruptArtifactError, match="not integer arithmetic on parameters"):
            loader.Kernel(VARIANT)(0, *range(len(ARGS)))
    finally:
        _clear_manifest_caches()
    assert loader.launch_expr_error("(num_tokens + 15) // 16 * ((hidden + 511) // 512)", ARGS) is None
    assert loader.launch_expr_error("max(num_tokens, 1)", ARGS) is None
    assert "not integer arithmetic" in loader.launch_expr_error("num_tokens / 2.5", ARGS)
    assert "does not parse" in loader.launch_expr_error("num_tokens +", ARGS)
