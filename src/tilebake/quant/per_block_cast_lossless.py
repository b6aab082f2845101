"""per_block_cast_lossless: re-quantise packed FP4 (e2m1) blocks to FP8 (e4m3) blocks exactly.

Validate, allocate, launch. The kernel is kernels_tl/quant/per_block_cast_lossless.py; the
reference (and the CPU path) is tilebake.torch.per_block_cast_lossless (src/tilebake/torch/cast_lossless.py).

Data-dependent failure (input scales that are not normal powers of two, or spread by more than
2^11 within one output block): the CPU path raises ValueError. A GPU kernel cannot raise, so the
offending blocks get a NaN scale (UE8M0 byte 0xFF), which poisons exactly their dequantised
values and costs no host sync; `check=True` looks for such scales after the launch and raises
(one device-to-host sync).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake import utils
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.quant._common import (
    QuantTensor,
    alloc_sf,
    check_aligned,
    check_fmt,
    check_out_data,
    check_out_sf,
    check_rows,
    fill_out,
)
from tilebake.utils import ceil_div, is_power_of_two

# Output SF blocks (bm, bk): powers of two in these ranges (a block lies inside one CTA's
# 128 x 128 tile; bk covers at least one 16-column half of a thread's columns).
MAX_BLOCK = 128
MIN_BLOCK_K = 16


@dataclasses.dataclass(frozen=True)
class PerBlockCastLosslessVariant(Variant):
    family = "quant"
    op = "per_block_cast_lossless"
    PARAMS = (
        ptr("X", "Y", "SIN", "SIN32", "S")
        + i32(
            "in_sf_packed", "in_sf_stride_m", "in_sf_stride_k", "in_shift_m", "in_shift_k", "out_shift_m",
            "out_shift_k", "packed_sf", "sf_stride_m", "sf_stride_k", "num_tokens", "x_words", "x_stride", "y_stride"
        )
    )  # fmt: skip

    out_fmt: str  # 'e4m3', the only one: block sizes and SF layouts are runtime arguments

    @classmethod
    def all(cls):
        return (cls("e4m3"),)


@dataclasses.dataclass(frozen=True)
class PerBlockCastLosslessAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/per_block_cast_lossless.py): the original's
    Ascend case, (1, 32) e2m1 blocks to (32, 32) e4m3 blocks; SFs fp32 or UE8M0 bytes two to an
    int16, row-major."""

    family = "quant"
    op = "per_block_cast_lossless"
    backend = "ascend"
    PARAMS = ptr("X", "SIN", "Y", "S") + i32("num_tokens", "x_bytes", "x_stride")  # x_bytes: hidden / 2

    in_sf: str  # 'fp32' | 'ue8m0'
    sf_mode: str  # 'fp32' | 'ue8m0'
    num_vec_cores: int

    @classmethod
    def all(cls):
        kinds = ("fp32", "ue8m0")
        return tuple(cls(i, o, cores) for i in kinds for o in kinds for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(PerBlockCastLosslessVariant)


def _is_pow2_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and is_power_of_two(v)


def check_block_sizes(x_block_size, out_block_size) -> tuple[int, int, int, int]:
    """(bm_in, bk_in, bm, bk): powers of two, 1 <= bm <= 128, 16 <= bk <= 128, each output block
    a whole number of input blocks (bm_in <= bm, 16 <= bk_in <= bk)."""
    try:
        bm, bk = out_block_size
        ok = _is_pow2_int(bm) and _is_pow2_int(bk) and bm <= MAX_BLOCK and MIN_BLOCK_K <= bk <= MAX_BLOCK
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"out_block_size must be a pair of powers of two (bm, bk) with 1 <= bm <= {MAX_BLOCK} and "
            f"{MIN_BLOCK_K} <= bk <= {MAX_BLOCK}, got {out_block_size!r}"
        )
    try:
        bm_in, bk_in = x_block_size
        ok = _is_pow2_int(bm_in) and _is_pow2_int(bk_in) and bm_in <= bm and MIN_BLOCK_K <= bk_in <= bk
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"x_block_size must be a pair of powers of two (bm_in, bk_in) with bm_in <= {bm} and "
            f"{MIN_BLOCK_K} <= bk_in <= {bk} (each output block {(bm, bk)} a whole number of input blocks), "
            f"got {x_block_size!r}"
        )
    return bm_in, bk_in, bm, bk


def per_block_cast_lossless(
    x: QuantTensor,
    fmt: str,
    x_block_size,
    out_block_size,
    use_tma_aligned_col_major_sf: bool = False,
    round_sf: bool = False,
    use_packed_ue8m0: bool = False,
    out: Optional[tuple[Optional[torch.Tensor], Optional[torch.Tensor]]] = None,
    *,
    check: bool = False,
) -> QuantTensor:
    """Losslessly re-quantise an FP4 (e2m1) tensor to FP8 (e4m3) with new block sizes.

    New scale per output block: max(input scales) / 2^6; each e2m1 value times its scale ratio
    is exactly an e4m3 number while the input scales of a block span at most 2^11.

    Args:
        x: (data, sf): data int8 (T, H/2), two e2m1 codes a byte (even element in the low
            nibble), rows 16-byte aligned, H a multiple of 32; sf its power-of-two scales per
            x_block_size block: fp32 (ceil(T/bm_in), ceil(H/bk_in)) or packed UE8M0 int32
            (.., ceil(ceil(H/bk_in)/4)), any strides (row- or column-major).
        fmt: 'e4m3'.
        x_block_size: (bm_in, bk_in), powers of two, bm_in <= bm, 16 <= bk_in <= bk.
        out_block_size: (bm, bk), powers of two, 1 <= bm <= 128, 16 <= bk <= 128: per-token
            blocks (1, 128) as well as 2-D ones (32, 32), (128, 128). T need not be a multiple
            of bm (nor H of bk).
        use_tma_aligned_col_major_sf: return the SF column-major (TMA-aligned view).
        round_sf: accepted for compatibility; the new scales are powers of two anyway.
        use_packed_ue8m0: new SF as UE8M0 bytes packed 4 to an int32 (2 to an int16 on an NPU) along K.
        out: optional preallocated (data, sf), either of them None (then allocated): data
            float8_e4m3fn (T, H), rows 16-byte aligned; sf of the returned dtype and shape,
            any strides. The given tensors are returned themselves.
        check: after a GPU launch, raise ValueError if a block could not be re-quantised
            exactly (a host sync). Without it such blocks carry a NaN scale (UE8M0 0xFF).

    Returns:
        (data e4m3 (T, H), sf) with cast_back(result) == cast_back(x) exactly. Given out=
        tensors have their version counters bumped, as by torch's out= ops.
    """
    # The native path: a call whose key has been seen runs as one plan (validate, allocate and
    # launch in C); a call the plan does not take (NotImplemented) goes on below; not while
    # torch.compile traces. The classes are in the key: 1 and True (or 32.0 and 32) are equal
    # keys the checks below tell apart.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[
                fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, check,
                out is None, x[0].dtype, x[1].dtype, use_tma_aligned_col_major_sf.__class__, round_sf.__class__,
                use_packed_ue8m0.__class__, check.__class__, x_block_size[0].__class__, x_block_size[1].__class__,
                out_block_size[0].__class__, out_block_size[1].__class__,
            ]  # fmt: skip
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, x, out)
            if result is not NotImplemented:
                return result
    check_fmt(fmt, ("e4m3",))
    bm_in, bk_in, bm, bk = check_block_sizes(x_block_size, out_block_size)
    for name, value in (
        ("use_tma_aligned_col_major_sf", use_tma_aligned_col_major_sf),
        ("round_sf", round_sf),
        ("use_packed_ue8m0", use_packed_ue8m0),
        ("check", check),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
    if not isinstance(x, (tuple, list)) or len(x) != 2 or not all(isinstance(t, torch.Tensor) for t in x):
        raise TypeError(f"x must be a QuantTensor (data, sf) of two tensors, got {type(x).__name__}")
    data, sf_in = x
    if data.dtype not in (torch.int8, torch.uint8):
        raise TypeError(f"x[0] must be int8 (packed e2m1 pairs), got {data.dtype}")
    num_tokens, half = check_rows(data, "x[0]", hidden_multiple=16)
    hidden = 2 * half
    in_packed = sf_in.dtype == utils.ue8m0_word(data.device)[0]  # int16 on an NPU
    check_out_sf(sf_in, "x[1]", ceil_div(num_tokens, bm_in), ceil_div(hidden, bk_in), in_packed, data)
    num_row_blocks, num_groups = ceil_div(num_tokens, bm), ceil_div(hidden, bk)
    out_data = out_sf = None
    if out is not None:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"out must be a (data, sf) pair (either may be None), got {type(out).__name__}")
        out_data, out_sf = out
        if out_data is not None:
            check_out_data(out_data, "out[0]", (num_tokens, hidden), torch.float8_e4m3fn, data)
        if out_sf is not None:
            check_out_sf(out_sf, "out[1]", num_row_blocks, num_groups, use_packed_ue8m0, data)
    if data.device.type == "npu":  # the Ascend kernels where they apply (int16 UE8M0 SFs); given outputs filled after
        from tilebake.quant import _per_block_cast_lossless_ascend as ascend_path

        result = ascend_path.per_block_cast_lossless(
            data, sf_in, (bm_in, bk_in), (bm, bk), use_tma_aligned_col_major_sf, use_packed_ue8m0, check
        )
        if result is not None:
            return fill_out(result, out_data, out_sf)

    if not data.is_cuda:  # the slow path: the reference (raises on a block it cannot cast exactly)
        from tilebake.torch import per_block_cast_lossless as reference

        y, sf = reference(
            (data, sf_in), "e4m3", (bm_in, bk_in), (bm, bk), use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0
        )
        return (y if out_data is None else out_data.copy_(y)), (sf if out_sf is None else out_sf.copy_(sf))

    y = out_data if out_data is not None else data.new_empty((num_tokens, hidden), dtype=torch.float8_e4m3fn)
    sf = out_sf
    if sf is None:
        sf = alloc_sf(data, num_row_blocks, num_groups, use_packed_ue8m0, use_tma_aligned_col_major_sf)
    if num_tokens == 0 or hidden == 0:
        return y, sf
    launch(data, sf_in, y, sf, (bm_in, bk_in), (bm, bk), use_packed_ue8m0)
    if out is not None:  # the kernel wrote them behind autograd's back
        torch.autograd.graph.increment_version([t for t in (out_data, out_sf) if t is not None])
    fully_given = type(out) is tuple and out_data is not None and out_sf is not None
    if not check and type(x) is tuple and (out is None or fully_given):  # the patterns with plans
        key = _plan_key(x, fmt, x_block_size, out_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0,
                        check, out)  # fmt: skip
        if key is not None and key not in _PLANS:
            plan.remember(
                _PLANS, key,
                _plan, _KERNELS["e4m3",], data.get_device(), data.dtype, sf_in.dtype, (bm_in, bk_in), (bm, bk),
                use_tma_aligned_col_major_sf, use_packed_ue8m0, out is not None,
            )  # fmt: skip
    if check:
        if use_packed_ue8m0:  # any byte 0xFF (read by shifts: a column-major view has no byte view)
            bad = torch.stack([((sf >> shift) & 0xFF) == 0xFF for shift in (0, 8, 16, 24)])
        else:
            bad = torch.isnan(sf)
        if bool(bad.any()):
            raise ValueError(
                "per_block_cast_lossless: some output blocks cannot be re-quantised exactly (their input scales "
                "are not normal powers of two within a ratio of 2^11); their scales are NaN"
            )
    return y, sf


def launch(data, sf_in, y, sf, x_block_size, out_block_size, use_packed_ue8m0: bool, kernels=_KERNELS) -> None:
    """One launch writing y and sf (checked, non-empty). `kernels`: the loader's table, or a
    stand-in with the same call (tests run the kernel's C++ on the CPU through one)."""
    (bm_in, bk_in), (bm, bk) = x_block_size, out_block_size
    num_tokens, hidden = y.shape
    data_ptr, y_ptr = data.data_ptr(), y.data_ptr()
    if data_ptr % 16:
        check_aligned(data_ptr, "x[0]")
    if y_ptr % 16:
        check_aligned(y_ptr, "out[0]")
    in_size, size = sf_in.element_size(), sf.element_size()  # the kernel addresses SF in bytes
    # The kernel reads and writes 4-byte words (8 codes in, 4 e4m3 bytes out); row strides in
    # words (a single row's stride is never used).
    x_stride = data.stride(0) // 4 if num_tokens > 1 else 0
    y_stride = y.stride(0) // 4 if num_tokens > 1 else 0
    kernels["e4m3",](
        data.get_device(),
        data_ptr, y_ptr, sf_in.data_ptr(), sf_in.data_ptr(), sf.data_ptr(),
        int(sf_in.dtype == torch.int32), sf_in.stride(0) * in_size, sf_in.stride(1) * in_size,
        bm_in.bit_length() - 1, bk_in.bit_length() - 1, bm.bit_length() - 1, bk.bit_length() - 1,
        int(use_packed_ue8m0), sf.stride(0) * size, sf.stride(1) * size,
        num_tokens, hidden // 8, x_stride, y_stride,
    )  # fmt: skip


_PLANS = plan.cache()


def _plan_key(x, fmt, x_block_size, out_block_size, col_major, round_sf, use_packed_ue8m0, check, out):
    """The call's key as per_block_cast_lossless's native path looks it up (None: not hashable)."""
    key = (
        fmt, x_block_size, out_block_size, col_major, round_sf, use_packed_ue8m0, check, out is None, x[0].dtype,
        x[1].dtype, col_major.__class__, round_sf.__class__, use_packed_ue8m0.__class__, check.__class__,
        x_block_size[0].__class__, x_block_size[1].__class__, out_block_size[0].__class__, out_block_size[1].__class__,
    )  # fmt: skip
    try:
        hash(key)
    except TypeError:  # e.g. a list of block sizes
        return None
    return key


def _plan(kernel, device, data_dtype, sf_in_dtype, x_block_size, out_block_size, col_major, packed, given_out):
    """The CUDA path above (check=False) as a call plan: the same checks (a non-empty problem
    only: an empty one takes the Python path), allocations and kernel arguments."""
    (bm_in, bk_in), (bm, bk) = x_block_size, out_block_size
    in_packed = sf_in_dtype == torch.int32
    b = plan.Builder()
    data = b.tensor((0, 0), data_dtype, ("T", "XH"), strides=("xs", 1))
    b.check("T >= 1 and XH >= 16 and XH % 16 == 0 and (T == 1 or xs % 16 == 0)")
    b.let("H", "2 * XH")
    in_cols = f"(H + {bk_in - 1}) // {bk_in}"
    in_shape = (f"(T + {bm_in - 1}) // {bm_in}", f"({in_cols} + 3) // 4" if in_packed else in_cols)
    sf_in = b.tensor((0, 1), sf_in_dtype, in_shape, strides=("is0", "is1"), align=1)
    b.let("R", f"(T + {bm - 1}) // {bm}")
    cols = f"(H + {bk - 1}) // {bk}"
    b.let("C", f"({cols} + 3) // 4" if packed else cols)
    sf_dtype = torch.int32 if packed else torch.float32
    if given_out:  # rows as check_out_data wants them (16-byte multiples, apart); the SF at any strides
        y = b.tensor((1, 0), torch.float8_e4m3fn, ("T", "H"), strides=("ys", 1))
        b.check("T == 1 or (ys % 16 == 0 and ys >= H)")
        sf = b.tensor((1, 1), sf_dtype, ("R", "C"), strides=("s0", "s1"), align=1)
    else:
        y = b.alloc(torch.float8_e4m3fn, ("T", "H"))
        b.let("ys", "H")
        if col_major:  # alloc_sf's TMA-aligned layout: a (C, padded R) buffer's transposed (R, C) view
            b.let("s1", "(R + 3) // 4 * 4")
            sf = b.alloc(sf_dtype, ("C", "s1"), view=(("R", "C"), (1, "s1")))
            b.let("s0", 1)
        else:
            sf = b.alloc(sf_dtype, ("R", "C"))
            b.let("s0", "C")
            b.let("s1", 1)
    b.launch(
        kernel, device, X=data, Y=y, SIN=sf_in, SIN32=sf_in, S=sf, in_sf_packed=int(in_packed),
        in_sf_stride_m="is0 * 4", in_sf_stride_k="is1 * 4", in_shift_m=bm_in.bit_length() - 1,
        in_shift_k=bk_in.bit_length() - 1, out_shift_m=bm.bit_length() - 1, out_shift_k=bk.bit_length() - 1,
        packed_sf=int(packed), sf_stride_m="s0 * 4", sf_stride_k="s1 * 4", num_tokens="T", x_words="H // 8",
        x_stride="min(T - 1, 1) * (xs // 4)", y_stride="min(T - 1, 1) * (ys // 4)",
    )  # fmt: skip
    if given_out:
        b.bump(y)
        b.bump(sf)
    b.returns((y, sf))
    return b.build()
