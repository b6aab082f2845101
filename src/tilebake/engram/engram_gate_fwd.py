"""engram_gate_fwd: the Engram gate, out = x + sigmoid(signed_sqrt(d)) * v per (token, head).

Validate, allocate, launch (kernels_tl/engram/engram_gate_fwd.py: persistent, a CTA per head
taking every num_ctas_per_head-th token);
CPU tensors, and CUDA tensors the kernel does not take (H not a multiple of 8, rows not 16-byte
aligned), take the reference (tilebake.torch.engram.engram_gate_fwd_ref). The arithmetic is in
tilebake.torch.engram's docstring; `dot` is returned raw.

k and v are read through their own strides, so the 2.1.0 `kv` tensor (k = kv[:, :hc], v =
kv[:, hc]) and the 1.0 separate k and v (tilebake.modeling.engram) take the same kernel, copy-free.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake import config
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.engram._common import MAX_HC, check_same_device, check_tensor, dense

# The kernels keep a head's row in registers: one variant per row length class (the smallest
# that holds H is launched), so a short row does not take the registers of a long one, and the
# short classes' small CTAs fit many a SM (rows below 2048 are too short to keep the memory
# system busy with a few CTAs, each walking its tokens one after another).
HIDDEN_CLASSES = (512, 1024, 2048, 4096, 8192, 16384)
MAX_HIDDEN = HIDDEN_CLASSES[-1]


def hidden_class(hidden: int) -> int:
    return next(c for c in HIDDEN_CLASSES if hidden <= c)


# Resident CTAs a SM of each variant's persistent grid (kernels_tl/engram/engram_gate_fwd.py CONFIGS).
CTAS_PER_SM = {512: 32, 1024: 24, 2048: 8, 4096: 6, 8192: 3, 16384: 1}


def ctas_per_head(num_tokens: int, hc: int, hidden: int) -> int:
    """The grid is this many CTAs a head (set_num_sms respected)."""
    return max(1, min(num_tokens, CTAS_PER_SM[hidden_class(hidden)] * config.get_num_sms() // hc))


def row_params(*names: str):
    """The (token, head) strides of each (T, hc, H) operand, last dim contiguous."""
    return i32(*(f"{n}_{s}" for n in names for s in ("token_stride", "head_stride")))


@dataclasses.dataclass(frozen=True)
class EngramGateFwdVariant(Variant):
    family = "engram"
    op = "engram_gate_fwd"
    PARAMS = (
        ptr("X", "K", "V", "W", "MASK", "OUT", "DOT", "GATE", "RSTD_X", "RSTD_K")
        + f32("eps", "clamp_value")
        + i32("num_tokens", "hc", "hidden", "num_ctas_per_head", "has_mask", "save")
        + row_params("x", "k", "out")
        + i32("v_token_stride")
    )

    in_dtype: str  # 'bf16'
    max_hidden: int  # a HIDDEN_CLASSES entry: the longest row the kernel's registers hold

    @classmethod
    def all(cls):
        return tuple(cls("bf16", h) for h in HIDDEN_CLASSES)


@dataclasses.dataclass(frozen=True)
class EngramGateFwdAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/engram/engram_gate_fwd.py): a (token, head) row a
    step of a vector core, rows up to max_hidden."""

    family = "engram"
    op = "engram_gate_fwd"
    backend = "ascend"
    PARAMS = (
        ptr("X", "K", "V", "W", "MASK", "OUT", "DOT", "GATE", "RSTD_X", "RSTD_K")
        + f32("eps", "clamp_value")
        + i32("num_tokens", "hc", "hidden", "has_mask", "save")
        + row_params("x", "k", "out")
        + i32("v_token_stride")
    )

    max_hidden: int
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(MAX_HIDDEN, cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(EngramGateFwdVariant)
_PLANS = plan.cache()  # by (H, eps, clamp_value with their classes, save_for_backward, no mask, inplace)


def check_gate_inputs(hidden_states, kv, image_token_mask, k=None, v=None) -> tuple[int, int, int]:
    """(T, hc, H) of hidden_states (T, hc, H) bf16 with kv (T, hc + 1, H) bf16 (or, for the 1.0
    form, k (T, hc, H) and v (T, H)); image_token_mask (T,) bool or None."""
    check_tensor(hidden_states, "hidden_states", (torch.bfloat16,), 3)
    num_tokens, hc, hidden = hidden_states.shape
    if not 1 <= hc <= MAX_HC or hidden < 1:
        raise ValueError(f"hidden_states must be (T, hc, H) with 1 <= hc <= {MAX_HC}, got {tuple(hidden_states.shape)}")
    if kv is not None:
        check_tensor(kv, "kv", (torch.bfloat16,), 3)
        if tuple(kv.shape) != (num_tokens, hc + 1, hidden):
            raise ValueError(f"kv must be (T, hc + 1, H) = {(num_tokens, hc + 1, hidden)}, got {tuple(kv.shape)}")
        check_same_device("kv", kv, hidden_states, "hidden_states")
    else:
        check_tensor(k, "k", (torch.bfloat16,), 3)
        check_tensor(v, "v", (torch.bfloat16,), 2)
        if tuple(k.shape) != (num_tokens, hc, hidden):
            raise ValueError(f"k must be hidden_states' shape {(num_tokens, hc, hidden)}, got {tuple(k.shape)}")
        if tuple(v.shape) != (num_tokens, hidden):
            raise ValueError(f"v must be (T, H) = {(num_tokens, hidden)}, got {tuple(v.shape)}")
        check_same_device("k", k, hidden_states, "hidden_states")
        check_same_device("v", v, hidden_states, "hidden_states")
    if image_token_mask is not None:
        check_tensor(image_token_mask, "image_token_mask", (torch.bool,), 1)
        if image_token_mask.shape[0] != num_tokens:
            raise ValueError(f"image_token_mask must be ({num_tokens},), got {tuple(image_token_mask.shape)}")
        check_same_device("image_token_mask", image_token_mask, hidden_states, "hidden_states")
    return num_tokens, hc, hidden


def check_fused_weight(weight_fused, hc: int, hidden: int, like) -> None:
    check_tensor(weight_fused, "weight_fused", (torch.float32,), 2)
    if tuple(weight_fused.shape) != (hc, hidden):
        raise ValueError(f"weight_fused must be (hc, H) = {(hc, hidden)}, got {tuple(weight_fused.shape)}")
    check_same_device("weight_fused", weight_fused, like, "hidden_states")


def kernel_rows(*tensors: torch.Tensor) -> bool:
    """True when every (.., H) bf16 operand has a contiguous last dim, 16-byte aligned rows (what
    the kernels read as whole 16-byte vectors) and element offsets below 2^31 (int32 indices)."""
    for t in tensors:
        if t.stride(-1) != 1 and t.shape[-1] > 1:
            return False
        if t.data_ptr() % 16 or any(s % 8 or s < 0 for s in t.stride()[:-1]):
            return False
        if sum((n - 1) * s for n, s in zip(t.shape, t.stride())) >= 2**31:
            return False
    return True


def engram_gate_fwd(
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    eps: float,
    clamp_value: float,
    save_for_backward: bool = True,
    image_token_mask: Optional[torch.Tensor] = None,
    inplace: bool = False,
):
    """The gate forward.

    Args:
        hidden_states: (T, hc, H) bf16, 1 <= hc <= 8.
        kv: (T, hc + 1, H) bf16: k = kv[:, :hc], v = kv[:, hc] (shared by the hc heads).
        weight_fused: (hc, H) fp32, fused_weight(weight_hidden, weight_embed).
        eps: the RMSNorms' epsilon; clamp_value: the floor of |d| under the square root.
        save_for_backward: also return dot, gate_score, rstd_x, rstd_k, fp32 (T, hc).
        image_token_mask: optional (T,) bool; True tokens pass through unchanged.
        inplace: write the output into hidden_states (not with save_for_backward).

    Returns:
        (output, dot, gate_score, rstd_x, rstd_k); the last four None without save_for_backward.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            key = (hidden_states.shape[-1], eps, eps.__class__, clamp_value, clamp_value.__class__, save_for_backward,
                   image_token_mask is None, inplace)  # fmt: skip
            call = _PLANS[key]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, hidden_states, kv, weight_fused, image_token_mask)
            if result is not NotImplemented:
                return result
    result = gate_forward(hidden_states, None, None, kv, weight_fused, eps, clamp_value, save_for_backward,
                          image_token_mask, inplace)  # fmt: skip
    hidden = hidden_states.shape[-1]
    if hidden_states.is_cuda and hidden % 8 == 0 and hidden <= MAX_HIDDEN and not torch.compiler.is_compiling():
        key = (hidden, eps, eps.__class__, clamp_value, clamp_value.__class__, save_for_backward, image_token_mask is None,
               inplace)  # fmt: skip
        plan.remember(_PLANS, key, _plan, _KERNELS["bf16", hidden_class(hidden)], hidden_states.get_device(), hidden,
                      float(eps), float(clamp_value), bool(save_for_backward), image_token_mask is not None,
                      bool(inplace), config.get_num_sms())  # fmt: skip
    return result


def _plan(kernel, device, hidden, eps, clamp_value, save, has_mask, inplace, num_sms):
    """run(hidden_states (T, hc, H), kv (T, hc + 1, H), weight_fused (hc, H), image_token_mask):
    as kernel_rows takes them (contiguous last dims, 16-byte aligned rows, offsets below 2^31)."""
    b = plan.Builder()
    x = b.tensor(0, torch.bfloat16, ("T", "hc", "H"), strides=("xts", "xhs", 1))
    kv = b.tensor(1, torch.bfloat16, ("T1", "hc1", "H1"), strides=("kts", "khs", 1))
    w = b.tensor(2, torch.float32, ("hc2", "H2"), strides=("H2", 1))
    b.check(f"T >= 1 and H == {hidden} and T1 == T and hc1 == hc + 1 and H1 == H and hc2 == hc and H2 == H")
    b.check(f"hc >= 1 and hc <= {MAX_HC} and xts >= 0 and xhs >= 0 and kts >= 0 and khs >= 0")
    b.check("xts % 8 == 0 and xhs % 8 == 0 and kts % 8 == 0 and khs % 8 == 0")
    b.check("(T - 1) * xts + (hc - 1) * xhs + H < 2147483648 and (T - 1) * kts + hc * khs + H < 2147483648")
    b.check("T * hc * H < 2147483648")
    mask = b.tensor(3, torch.bool, ("T3",), strides=(1,), align=1) if has_mask else None
    if has_mask:
        b.check("T3 == T")
    if inplace:
        b.disjoint(x, kv)
    out = x if inplace else b.alloc(torch.bfloat16, ("T", "hc", "H"))
    saved = [b.alloc(torch.float32, ("T", "hc")) for _ in range(4)] if save else [None] * 4
    b.address(kv, "kvp")
    b.let("per_head", f"max(1, min(T, {CTAS_PER_SM[hidden_class(hidden)] * num_sms} // hc))")
    b.launch(
        kernel, device, X=x, K=kv, V="kvp + hc * khs * 2", W=w, MASK=mask, OUT=out, DOT=saved[0], GATE=saved[1],
        RSTD_X=saved[2], RSTD_K=saved[3], eps=eps, clamp_value=clamp_value, num_tokens="T", hc="hc", hidden="H",
        num_ctas_per_head="per_head", has_mask=int(has_mask), save=int(save), x_token_stride="xts",
        x_head_stride="xhs", k_token_stride="kts", k_head_stride="khs", out_token_stride="xts" if inplace else "hc * H",
        out_head_stride="xhs" if inplace else "H", v_token_stride="kts",
    )  # fmt: skip
    if inplace:
        b.bump(x)
    b.returns((out, *saved))
    return b.build()


def gate_forward(hidden_states, k, v, kv, weight_fused, eps, clamp_value, save_for_backward, image_token_mask,
                 inplace):  # fmt: skip
    """engram_gate_fwd with k and v given apart (kv None) or inside kv."""
    num_tokens, hc, hidden = check_gate_inputs(hidden_states, kv, image_token_mask, k, v)
    check_fused_weight(weight_fused, hc, hidden, hidden_states)
    if inplace and save_for_backward:
        raise ValueError("engram_gate_fwd: inplace=True needs save_for_backward=False (the saved path keeps x)")
    for name, value in (("eps", eps), ("clamp_value", clamp_value)):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if kv is not None:
        k, v = kv[:, :hc], kv[:, hc]
    if torch.compiler.is_compiling():
        out, saved = torch.ops.tilebake.engram_gate_fwd(hidden_states, k, v, weight_fused, float(eps),
                                                        float(clamp_value), image_token_mask)  # fmt: skip
        return _results(hidden_states, out, saved, save_for_backward, inplace)
    out, saved = _forward(hidden_states, k, v, weight_fused, float(eps), float(clamp_value), image_token_mask,
                          save_for_backward, inplace)  # fmt: skip
    return _results(hidden_states, out, saved, save_for_backward, inplace)


def _results(hidden_states, out, saved, save_for_backward, inplace):
    if inplace:
        if out is hidden_states:  # the kernel wrote it
            torch.autograd.graph.increment_version(hidden_states)
        else:
            hidden_states.copy_(out)
        out = hidden_states
    if not save_for_backward:
        return out, None, None, None, None
    return (out, *saved.unbind(0))


def _forward(hidden_states, k, v, weight_fused, eps, clamp_value, image_token_mask, save, inplace):
    """(output, saved (4, T, hc) fp32 = dot, gate, rstd_x, rstd_k): output is hidden_states itself
    when inplace and the kernel wrote it."""
    num_tokens, hc, hidden = hidden_states.shape
    use_kernel = (
        hidden_states.is_cuda and num_tokens > 0 and hidden % 8 == 0 and hidden <= MAX_HIDDEN
        and kernel_rows(hidden_states, k, v)
    )  # fmt: skip
    if hidden_states.device.type == "npu" and num_tokens > 0 and hidden <= MAX_HIDDEN:  # the Ascend kernel
        from tilebake.engram._engram_ascend import gate_forward_npu

        return gate_forward_npu(hidden_states, k, v, weight_fused, eps, clamp_value, image_token_mask, save, inplace)
    if not use_kernel:
        from tilebake.torch.engram import engram_gate_fwd_ref

        out, *saved = engram_gate_fwd_ref(hidden_states, torch.cat([k, v[:, None]], 1), weight_fused, eps, clamp_value,
                                          image_token_mask)  # fmt: skip
        return out, torch.stack(saved)
    out = hidden_states if inplace else torch.empty(hidden_states.shape, dtype=hidden_states.dtype,
                                                    device=hidden_states.device)  # fmt: skip
    saved = hidden_states.new_empty((4, num_tokens, hc), dtype=torch.float32) if save else None
    w = dense(weight_fused)
    mask = dense(image_token_mask) if image_token_mask is not None else None
    sp = saved.data_ptr() if save else 0
    step = num_tokens * hc * 4  # bytes between the saved planes
    args = dict(
        X=hidden_states.data_ptr(), K=k.data_ptr(), V=v.data_ptr(), W=w.data_ptr(),
        MASK=mask.data_ptr() if mask is not None else 0, OUT=out.data_ptr(),
        DOT=sp, GATE=sp + step if save else 0, RSTD_X=sp + 2 * step if save else 0, RSTD_K=sp + 3 * step if save else 0,
        eps=eps, clamp_value=clamp_value, num_tokens=num_tokens, hc=hc, hidden=hidden,
        has_mask=int(mask is not None), save=int(save), v_token_stride=v.stride(0),
        num_ctas_per_head=ctas_per_head(num_tokens, hc, hidden),
    )  # fmt: skip
    for name, t in (("x", hidden_states), ("k", k), ("out", out)):
        args[f"{name}_token_stride"], args[f"{name}_head_stride"] = t.stride(0), t.stride(1)
    kernel = _KERNELS["bf16", hidden_class(hidden)]
    kernel(hidden_states.get_device(), *[args[n] for n in kernel.arg_names])
    return out, saved


# --- torch.library: lets torch.compile(fullgraph=True) trace the gate; eager calls skip it ---


def _op_impl(x, k, v, w, eps, clamp_value, mask):
    out, saved = _forward(x, k, v, w, eps, clamp_value, mask, True, False)
    return out, saved


def _meta(x, k, v, w, eps, clamp_value, mask):
    return torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty((4, *x.shape[:2]), dtype=torch.float32)


register(
    "engram_gate_fwd(Tensor x, Tensor k, Tensor v, Tensor weight_fused, float eps, float clamp_value,"
    " Tensor? image_token_mask) -> (Tensor, Tensor)",
    _op_impl,
    _meta,
)
