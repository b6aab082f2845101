"""cast_back / per_token_cast_back: dequantise FP8 e4m3 or packed FP4 e2m1 blocks to bf16 or fp32.

Validate, allocate, launch. The kernel is kernels_tl/quant/cast_back.py; the reference
(and the CPU path) is tilebake.torch.cast_back.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator

import torch

from tilebake import utils
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.quant._common import FLOAT_DTYPES, QuantTensor, check_aligned, check_fmt, check_rows
from tilebake.utils import ceil_div


@dataclasses.dataclass(frozen=True)
class CastBackVariant(Variant):
    family = "quant"
    op = "cast_back"
    PARAMS = (
        ptr("X", "S", "Y")
        + i32("block_m", "block_k", "num_tokens", "x_cols", "x_stride", "sf_stride_0", "sf_stride_1")
    )  # fmt: skip

    in_fmt: str  # 'e4m3' (float8_e4m3fn data) | 'e2m1' (int8, two codes a byte)
    out_dtype: str  # 'bf16' | 'fp32'
    sf_kind: str  # 'fp32' | 'e4m3' | 'ue8m0' (4 bytes packed in an int32)
    per_channel: bool  # SF block (bm, 1): one scale per element column

    @classmethod
    def all(cls):
        return tuple(
            cls(*key)
            for key in itertools.product(("e4m3", "e2m1"), ("bf16", "fp32"), ("fp32", "e4m3", "ue8m0"), (False, True))
        )


@dataclasses.dataclass(frozen=True)
class CastBackAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/cast_back.py): e4m3 data in 32-column
    groups (per_token_cast's Ascend output), SF fp32 or UE8M0 bytes packed two to an int16,
    row-major."""

    family = "quant"
    op = "cast_back"
    backend = "ascend"
    PARAMS = ptr("X", "S", "Y") + i32("num_tokens", "hidden", "x_stride", "sf_cols")

    out_dtype: str  # 'bf16' | 'fp32'
    sf_kind: str  # 'fp32' | 'ue8m0'
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(*key) for key in itertools.product(("bf16", "fp32"), ("fp32", "ue8m0"), ASCEND_VEC_CORES))


_IN_FMTS = {torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1", torch.uint8: "e2m1"}
_SF_KINDS = {torch.float32: "fp32", torch.float8_e4m3fn: "e4m3", torch.int32: "ue8m0"}
_KEYS: dict[tuple, tuple[int, int]] = {}  # validated (fmt, x_block_size, x_special_fmt) -> (bm, bk)


def _key_of(fmt, x_block_size, x_special_fmt) -> tuple[int, int]:
    """Check the non-tensor arguments; remember the valid combination."""
    if x_special_fmt is not None:
        raise ValueError(f"x_special_fmt is reserved and must be None, got {x_special_fmt!r}")
    check_fmt(fmt, tuple(FLOAT_DTYPES))
    try:
        block_m, block_k = (operator.index(b) for b in x_block_size)
    except (TypeError, ValueError):
        raise ValueError(f"x_block_size must be a pair (bm, bk) of positive ints, got {x_block_size!r}") from None
    if block_m < 1 or block_k < 1 or isinstance(block_m, bool) or isinstance(block_k, bool):
        raise ValueError(f"x_block_size must be a pair (bm, bk) of positive ints, got {x_block_size!r}")
    if block_k != 1 and block_k % 16:
        raise ValueError(f"x_block_size[1] (bk) must be 1 (per-channel) or a multiple of 16, got {x_block_size!r}")
    try:
        _KEYS[fmt, x_block_size, x_special_fmt] = (block_m, block_k)
    except TypeError:  # an unhashable x_block_size (a list) is valid, just not cached
        pass
    return block_m, block_k


def _check_sf(sf, data, num_tokens, hidden, block_m, block_k) -> str:
    """The SF tensor's kind; its shape for (bm, bk), its device; no column-major per-channel SF."""
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"x[1] must be a torch.Tensor, got {type(sf).__name__}")
    packed, per_word = utils.ue8m0_word(data.device)  # int32 of 4 bytes; on an NPU int16 of 2
    sf_kind = {torch.float32: "fp32", torch.float8_e4m3fn: "e4m3", packed: "ue8m0"}.get(sf.dtype)
    if sf_kind is None:
        raise TypeError(f"x[1] must be torch.float32, torch.float8_e4m3fn or {packed} (packed UE8M0 on "
                        f"{data.device.type}), got {sf.dtype}")  # fmt: skip
    rows, cols = ceil_div(num_tokens, block_m), ceil_div(hidden, block_k)
    if sf_kind == "ue8m0":
        shape = (ceil_div(rows, per_word), cols) if block_k == 1 else (rows, ceil_div(cols, per_word))
    else:
        shape = (rows, cols)
    if tuple(sf.shape) != shape:
        raise ValueError(
            f"x[1] must have shape {shape} for data of {num_tokens} x {hidden} and x_block_size "
            f"{(block_m, block_k)} ({sf_kind} SF), got {tuple(sf.shape)}"
        )
    if sf.device != data.device:
        raise ValueError(f"x[1] must be on {data.device}, got {sf.device}")
    if block_k == 1 and shape[0] > 1 and shape[1] > 1 and sf.stride(0) == 1:
        raise ValueError(
            "x[1] must be row-major when x_block_size[1] == 1 (column-major per-channel SF is not allowed)"
        )
    return sf_kind


_KERNELS = KernelTable(CastBackVariant)


def cast_back(x: QuantTensor, fmt: str, x_block_size, x_special_fmt=None) -> torch.Tensor:
    """Dequantise `x = (data, sf)`: y = data * sf per block, rounded to `fmt`.

    Args:
        x: data e4m3 (T, H) or packed e2m1 int8 (T, H/2) (last dim contiguous, rows 16-byte
            aligned, or 8-byte for e2m1; H a multiple of 16), and its SF: fp32, float8_e4m3fn or packed UE8M0 int32,
            of shape (ceil(T/bm), ceil(H/bk)) (UE8M0: four to a word along H, or along T when
            bk == 1), row-major or TMA-aligned column-major (any strides; row-major only when
            bk == 1). The data format and SF kind come from the dtypes.
        fmt: output format, 'bf16' or 'fp32'.
        x_block_size: the SF block (bm, bk): bm >= 1, bk a multiple of 16 or 1 (per-channel).
        x_special_fmt: reserved, must be None.
    """
    # The native path: a call whose key has been seen runs as one plan (validate, allocate and
    # launch in C); a call the plan does not take (NotImplemented) goes on below. torch.compile
    # traces the Python path (its torch.library op), never the native call.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[fmt, x_block_size, x_special_fmt, x[0].dtype, x[1].dtype]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, x)
            if result is not NotImplemented:
                return result
    # Validate: the non-tensor arguments once per combination, the tensors every call.
    try:
        block_m, block_k = _KEYS[fmt, x_block_size, x_special_fmt]
    except (KeyError, TypeError):
        block_m, block_k = _key_of(fmt, x_block_size, x_special_fmt)
    try:
        data, sf = x
    except (TypeError, ValueError):
        raise TypeError("x must be a (data, sf) tuple of tensors") from None
    if not isinstance(data, torch.Tensor):
        raise TypeError("x must be a (data, sf) tuple of tensors")
    in_fmt = _IN_FMTS.get(data.dtype)
    if in_fmt is None:
        raise TypeError(f"x[0] must be torch.float8_e4m3fn (e4m3) or torch.int8 (packed e2m1), got {data.dtype}")
    e2m1 = in_fmt == "e2m1"
    # Packed e2m1 rows are read 8 bytes a thread (DEFAULT_CONFIG_E2M1), so 8-byte rows suffice.
    row_bytes = 8 if e2m1 else 16
    num_tokens, x_cols = check_rows(data, "x[0]", hidden_multiple=8 if e2m1 else 16, row_bytes=row_bytes)
    hidden = 2 * x_cols if e2m1 else x_cols
    if data.device.type == "npu":  # the Ascend kernels where they apply (its own SF layout: int16 UE8M0)
        from tilebake.quant import _cast_back_ascend

        out = _cast_back_ascend.cast_back(data, sf, fmt, block_m, block_k)
        if out is not None:
            return out
    sf_kind = _check_sf(sf, data, num_tokens, hidden, block_m, block_k)
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.cast_back(data, sf, fmt, block_m, block_k)

    if not data.is_cuda:  # the slow path: the reference allocates its own (contiguous) output
        from tilebake.torch import cast_back as reference

        return reference((data, sf), in_fmt, (block_m, block_k), out_dtype=FLOAT_DTYPES[fmt]).contiguous()

    # Allocate, then launch.
    out = data.new_empty((num_tokens, hidden), dtype=FLOAT_DTYPES[fmt])
    if num_tokens == 0 or hidden == 0:
        return out
    data_ptr = data.data_ptr()
    if data_ptr % row_bytes:
        check_aligned(data_ptr, "x[0]", row_bytes)
    scale = 4 if sf_kind == "ue8m0" else 1  # the kernel addresses packed SF in bytes
    _KERNELS[in_fmt, fmt, sf_kind, block_k == 1](
        data.get_device(),
        data_ptr, sf.data_ptr(), out.data_ptr(), block_m, block_k, num_tokens, x_cols, data.stride(0),
        sf.stride(0) * scale, sf.stride(1) * scale,
    )  # fmt: skip
    if type(x) is tuple and type(x_block_size) is tuple:  # the plan's arguments and key must be hashable tuples
        plan_key = (fmt, x_block_size, x_special_fmt, data.dtype, sf.dtype)
        if plan_key not in _PLANS:
            plan.remember(
                _PLANS, plan_key,
                _plan, _KERNELS[in_fmt, fmt, sf_kind, block_k == 1], data.get_device(), data.dtype, sf.dtype, fmt,
                block_m, block_k,
            )  # fmt: skip
    return out


_PLANS = plan.cache()


def _plan(kernel, device, data_dtype, sf_dtype, fmt, block_m, block_k):
    """cast_back's CUDA path above as a call plan: the same checks (a non-empty problem only:
    an empty one takes the Python path), the same allocation and kernel arguments."""
    e2m1 = data_dtype != torch.float8_e4m3fn
    row_bytes, multiple = (8, 8) if e2m1 else (16, 16)
    b = plan.Builder()
    data = b.tensor((0, 0), data_dtype, ("T", "XC"), strides=("xs", 1), align=row_bytes)
    b.check(f"T >= 1 and XC >= 1 and XC % {multiple} == 0 and (T == 1 or xs % {row_bytes} == 0)")
    b.let("H", "2 * XC" if e2m1 else "XC")
    b.let("R", f"(T + {block_m - 1}) // {block_m}")
    b.let("C", f"(H + {block_k - 1}) // {block_k}")
    packed = _SF_KINDS[sf_dtype] == "ue8m0"
    if packed:  # four UE8M0 bytes a word: along T for per-channel SF, else along H
        shape = ("(R + 3) // 4", "C") if block_k == 1 else ("R", "(C + 3) // 4")
    else:
        shape = ("R", "C")
    sf = b.tensor((0, 1), sf_dtype, ("SR", "SC"), strides=("s0", "s1"), align=1)
    b.check(f"SR == {shape[0]} and SC == {shape[1]}")
    if block_k == 1:  # no column-major per-channel SF
        b.check("SR <= 1 or SC <= 1 or s0 != 1")
    y = b.alloc(FLOAT_DTYPES[fmt], ("T", "H"))
    scale = 4 if packed else 1  # the kernel addresses packed SF in bytes
    b.launch(
        kernel, device, X=data, S=sf, Y=y, block_m=block_m, block_k=block_k, num_tokens="T", x_cols="XC",
        x_stride="xs", sf_stride_0=f"s0 * {scale}", sf_stride_1=f"s1 * {scale}",
    )  # fmt: skip
    b.returns(y)
    return b.build()


def per_token_cast_back(x: QuantTensor, fmt: str, num_per_channels: int, x_special_fmt=None) -> torch.Tensor:
    """`cast_back` with SF blocks of (1, num_per_channels)."""
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt)


# --- torch.library: lets torch.compile(fullgraph=True) trace the op; eager calls skip it ---


# The shape function as a Meta kernel, what torch.compile's fake tensors run.
def _meta(data, sf, fmt, bm, bk):
    num_tokens, cols = data.shape
    hidden = cols if data.dtype == torch.float8_e4m3fn else 2 * cols
    return data.new_empty((num_tokens, hidden), dtype=FLOAT_DTYPES[fmt])


register(
    "cast_back(Tensor data, Tensor sf, str fmt, int block_m, int block_k) -> Tensor",
    lambda data, sf, fmt, bm, bk: cast_back((data, sf), fmt, (bm, bk)),
    _meta,
)
