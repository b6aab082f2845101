"""Runtime knobs (the original's tile_kernels.config). Values here are read per call
and passed to kernels as arguments: changing one never needs another binary."""

from __future__ import annotations

import functools
import os

_DEFAULT_AMAX_CLAMP = {
    ("e4m3", False): 1e-4,
    ("e4m3", True): 448.0 * 2.0**-9,
    ("e2m1", False): 6.0 * 2.0**-126,
    ("e2m1", True): 6.0 * 2.0**-9,
}
_amax_clamp = dict(_DEFAULT_AMAX_CLAMP)
_token_alignment = 128
_num_sms: int | None = None
_pdl = False
_deterministic = False


def _changed() -> None:
    """Call plans bake these settings in (tilebake/_runtime/plan.py): a change empties them."""
    from tilebake._runtime import plan

    plan.clear_all()


def _check_fmt(fmt: str, use_e4m3_sf: bool) -> tuple[str, bool]:
    key = (fmt, bool(use_e4m3_sf))
    if key not in _DEFAULT_AMAX_CLAMP:
        raise ValueError(f"fmt must be 'e4m3' or 'e2m1', got {fmt!r}")
    return key


def get_amax_clamp_for_quant(fmt: str, use_e4m3_sf: bool = False) -> float:
    return _amax_clamp[_check_fmt(fmt, use_e4m3_sf)]


def set_amax_clamp_for_quant(fmt: str, use_e4m3_sf: bool, value: float) -> None:
    """Minimum amax a block is clamped to before its scale is computed."""
    key = _check_fmt(fmt, use_e4m3_sf)
    if not value > 0:
        raise ValueError(f"value must be a positive float, got {value!r}")
    _amax_clamp[key] = float(value)
    _changed()


def get_token_alignment() -> int:
    return _token_alignment


def set_token_alignment(n: int) -> None:
    """Per-expert padding alignment of the SwiGLU psum layout."""
    global _token_alignment
    if not isinstance(n, int) or n <= 0:
        raise ValueError(f"n must be a positive int, got {n!r}")
    _token_alignment = n
    _changed()


def get_device_num_sms() -> int:
    import torch

    return _sms_of(torch.cuda.current_device())


@functools.cache
def _sms_of(device: int) -> int:
    """A device's SM count, read once (get_device_properties costs microseconds a call)."""
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count


def get_num_sms() -> int:
    return _num_sms if _num_sms is not None else get_device_num_sms()


# The original's Ascend names for the same count, and its vector-core count (two an AI core).
get_num_ai_cores = get_num_sms
get_num_cube_cores = get_num_sms


def get_num_vec_cores() -> int:
    return 2 * get_num_sms()


@functools.cache
def is_ascend() -> bool:
    """Whether this host has Ascend NPUs (their device manager node), as the original decides its
    backend. tilebake follows each call's tensors instead; this answers callers that ask."""
    return os.path.exists("/dev/davinci_manager")


def get_device() -> str:
    """'npu' on an Ascend host, else 'cuda' (the original's device string)."""
    return "npu" if is_ascend() else "cuda"


def get_max_smem_per_sm() -> int:
    """Shared memory bytes an SM of the current CUDA device has."""
    import torch

    return _smem_of(torch.cuda.current_device())


@functools.cache
def _smem_of(device: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor


def get_max_ub_per_vector_core(use_simt: bool = True) -> int:
    """Unified-buffer bytes an Ascend 950 vector-core kernel may use: 216 KiB with SIMT vector
    functions, 248 KiB without (../shared/notes/ascend_aot.md)."""
    return (216 if use_simt else 248) * 1024


def set_num_sms(n: int) -> None:
    """Number of SMs persistent kernels may use (1 .. the device's count)."""
    global _num_sms
    limit = get_device_num_sms()
    if not isinstance(n, int) or not 0 < n <= limit:
        raise ValueError(f"n must be an int in [1, {limit}], got {n!r}")
    _num_sms = n
    _changed()


def get_pdl() -> bool:
    return _pdl


def set_pdl(enabled: bool) -> None:
    """Programmatic dependent launch. Accepted for compatibility; no kernel uses it yet."""
    global _pdl
    _pdl = bool(enabled)


def get_deterministic_algorithms() -> bool:
    return _deterministic


def use_deterministic_algorithms(enabled: bool) -> None:
    global _deterministic
    _deterministic = bool(enabled)
    _changed()


def reset_runtime_config() -> None:
    global _token_alignment, _num_sms, _pdl, _deterministic
    before = (dict(_amax_clamp), _token_alignment, _num_sms, _deterministic)
    _amax_clamp.clear()
    _amax_clamp.update(_DEFAULT_AMAX_CLAMP)
    _token_alignment, _num_sms, _pdl, _deterministic = 128, None, False, False
    if before != (_amax_clamp, _token_alignment, _num_sms, _deterministic):
        _changed()
