"""engram_gate_bwd: the Engram gate's gradients from engram_gate_fwd's saved tensors; the
fused weight's gradient left as per-CTA fp32 partials for grad_w_reduce.

Validate, allocate, launch (kernels_tl/engram/engram_gate_bwd.py: persistent, a CTA per head
taking every num_ctas_per_head-th token, CTAS_PER_SM CTAs a SM); CPU tensors and rows the kernel does not take go
to the reference (tilebake.torch.engram.engram_gate_bwd_ref, one partial row). Any hc from 1 to 8
(the original: 4 only).
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
from tilebake.engram.engram_gate_fwd import (
    HIDDEN_CLASSES,
    MAX_HIDDEN,
    check_fused_weight,
    check_gate_inputs,
    hidden_class,
    kernel_rows,
    row_params,
)

# Resident CTAs a SM of each variant's persistent grid (kernels_tl/engram/engram_gate_bwd.py CONFIGS).
CTAS_PER_SM = {512: 16, 1024: 8, 2048: 4, 4096: 2, 8192: 1, 16384: 1}


@dataclasses.dataclass(frozen=True)
class EngramGateBwdVariant(Variant):
    family = "engram"
    op = "engram_gate_bwd"
    PARAMS = (
        ptr("G", "X", "K", "V", "W", "DOT", "GATE", "RSTD_X", "RSTD_K", "MASK", "DX", "DK", "DV", "P")
        + f32("clamp_value")
        + i32("num_tokens", "hc", "hidden", "num_ctas_per_head", "has_mask")
        + row_params("g", "x", "k", "dx", "dk")
        + i32("v_token_stride", "dv_token_stride")
    )

    in_dtype: str  # 'bf16'
    max_hidden: int  # a HIDDEN_CLASSES entry: the longest row the kernel's registers hold

    @classmethod
    def all(cls):
        return tuple(cls("bf16", h) for h in HIDDEN_CLASSES)


# The Ascend kernel's longest row (its unified buffer holds seven rows of a head).
ASCEND_MAX_HIDDEN = 8192


@dataclasses.dataclass(frozen=True)
class EngramGateBwdAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/engram/engram_gate_bwd.py): a token a step of a
    vector core, its heads in order; grad_w_partial a row a core."""

    family = "engram"
    op = "engram_gate_bwd"
    backend = "ascend"
    PARAMS = (
        ptr("G", "X", "K", "V", "W", "DOT", "GATE", "RSTD_X", "RSTD_K", "MASK", "DX", "DK", "DV", "P")
        + f32("clamp_value")
        + i32("num_tokens", "hc", "hidden", "has_mask")
        + row_params("g", "x", "k", "dx", "dk")
        + i32("v_token_stride", "dv_token_stride")
    )

    max_hidden: int
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(ASCEND_MAX_HIDDEN, cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(EngramGateBwdVariant)
_PLANS = plan.cache()  # by (H, clamp_value with its class, no mask)


def num_partials(num_tokens: int, hc: int, hidden: int) -> int:
    """grad_w_partial's rows: the kernel's CTAs a head (set_num_sms respected)."""
    sms = config.get_num_sms()
    return max(1, min(num_tokens, CTAS_PER_SM[hidden_class(min(hidden, MAX_HIDDEN))] * sms // hc))


def engram_gate_bwd(
    grad_out: torch.Tensor,
    hidden_states: torch.Tensor,
    kv: torch.Tensor,
    weight_fused: torch.Tensor,
    dot: torch.Tensor,
    gate_score: torch.Tensor,
    rstd_x: torch.Tensor,
    rstd_k: torch.Tensor,
    clamp_value: float,
    image_token_mask: Optional[torch.Tensor] = None,
):
    """The gate backward.

    Args:
        grad_out: (T, hc, H) bf16, the output's gradient.
        hidden_states, kv, weight_fused, image_token_mask: as given to engram_gate_fwd.
        dot, gate_score, rstd_x, rstd_k: its saved (T, hc) fp32 tensors.
        clamp_value: as given to engram_gate_fwd.

    Returns:
        (grad_hidden_states (T, hc, H) bf16, grad_kv (T, hc + 1, H) bf16, grad_w_partial
        (P, hc, H) fp32): grad_w_reduce turns the partials into the two weights' gradients.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[hidden_states.shape[-1], clamp_value, clamp_value.__class__, image_token_mask is None]
        except (KeyError, AttributeError, TypeError, IndexError):
            pass
        else:
            result = plan.run(call, grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k,
                              image_token_mask)  # fmt: skip
            if result is not NotImplemented:
                return result
    num_tokens, hc, hidden = check_gate_inputs(hidden_states, kv, image_token_mask)
    grad_kv = kv.new_empty(kv.shape)
    dx, partial = gate_backward(grad_out, hidden_states, kv[:, :hc], kv[:, hc], weight_fused, dot, gate_score,
                                rstd_x, rstd_k, clamp_value, image_token_mask, grad_kv[:, :hc], grad_kv[:, hc])  # fmt: skip
    if hidden_states.is_cuda and hidden % 8 == 0 and hidden <= MAX_HIDDEN and not torch.compiler.is_compiling():
        key = (hidden, clamp_value, clamp_value.__class__, image_token_mask is None)
        plan.remember(_PLANS, key, _plan, _KERNELS["bf16", hidden_class(hidden)], hidden_states.get_device(), hidden,
                      float(clamp_value), image_token_mask is not None, config.get_num_sms())  # fmt: skip
    return dx, grad_kv, partial


def _plan(kernel, device, hidden, clamp_value, has_mask, num_sms):
    """run(grad_out, hidden_states, kv, weight_fused, dot, gate_score, rstd_x, rstd_k, mask) ->
    (grad_hidden_states, grad_kv, grad_w_partial): rows as kernel_rows takes them, the saved
    (T, hc) tensors contiguous."""
    b = plan.Builder()
    g = b.tensor(0, torch.bfloat16, ("T", "hc", "H"), strides=("gts", "ghs", 1))
    x = b.tensor(1, torch.bfloat16, ("T1", "hc1", "H1"), strides=("xts", "xhs", 1))
    kv = b.tensor(2, torch.bfloat16, ("T2", "hc2", "H2"), strides=("kts", "khs", 1))
    w = b.tensor(3, torch.float32, ("hc3", "H3"), strides=("H3", 1))
    saved = [b.tensor(4 + i, torch.float32, (f"T{4 + i}", f"hc{4 + i}"), strides=("hc", 1), align=4) for i in range(4)]
    b.check(f"T >= 1 and H == {hidden} and T1 == T and hc1 == hc and H1 == H and T2 == T and hc2 == hc + 1 and H2 == H")
    b.check(f"hc3 == hc and H3 == H and hc >= 1 and hc <= {MAX_HC}")
    b.check(" and ".join(f"T{4 + i} == T and hc{4 + i} == hc" for i in range(4)))
    b.check("gts >= 0 and ghs >= 0 and xts >= 0 and xhs >= 0 and kts >= 0 and khs >= 0")
    b.check("gts % 8 == 0 and ghs % 8 == 0 and xts % 8 == 0 and xhs % 8 == 0 and kts % 8 == 0 and khs % 8 == 0")
    b.check("(T - 1) * gts + (hc - 1) * ghs + H < 2147483648 and (T - 1) * xts + (hc - 1) * xhs + H < 2147483648")
    b.check("(T - 1) * kts + hc * khs + H < 2147483648 and T * (hc + 1) * H < 2147483648")
    mask = b.tensor(8, torch.bool, ("T8",), strides=(1,), align=1) if has_mask else None
    if has_mask:
        b.check("T8 == T")
    b.let("P", f"max(1, min(T, {CTAS_PER_SM[hidden_class(hidden)] * num_sms} // hc))")  # num_partials
    dx = b.alloc(torch.bfloat16, ("T", "hc", "H"))
    grad_kv = b.alloc(torch.bfloat16, ("T", "hc + 1", "H"))
    partial = b.alloc(torch.float32, ("P", "hc", "H"))
    b.address(kv, "kvp")
    b.address(grad_kv, "gkvp")
    b.launch(
        kernel, device, G=g, X=x, K=kv, V="kvp + hc * khs * 2", W=w, DOT=saved[0], GATE=saved[1], RSTD_X=saved[2],
        RSTD_K=saved[3], MASK=mask, DX=dx, DK=grad_kv, DV="gkvp + hc * H * 2", P=partial, clamp_value=clamp_value,
        num_tokens="T", hc="hc", hidden="H", num_ctas_per_head="P", has_mask=int(has_mask), g_token_stride="gts",
        g_head_stride="ghs", x_token_stride="xts", x_head_stride="xhs", k_token_stride="kts", k_head_stride="khs",
        dx_token_stride="hc * H", dx_head_stride="H", dk_token_stride="(hc + 1) * H", dk_head_stride="H",
        v_token_stride="kts", dv_token_stride="(hc + 1) * H",
    )  # fmt: skip
    b.returns((dx, grad_kv, partial))
    return b.build()


def _check_saved(saved, num_tokens, hc, like):
    for name, t in saved.items():
        check_tensor(t, name, (torch.float32,), 2)
        if tuple(t.shape) != (num_tokens, hc):
            raise ValueError(f"{name} must be (T, hc) = {(num_tokens, hc)}, got {tuple(t.shape)}")
        check_same_device(name, t, like, "hidden_states")


def gate_backward(grad_out, x, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value, image_token_mask,
                  dk, dv):  # fmt: skip
    """(grad_x, grad_w_partial), with k's and v's gradients written into dk (T, hc, H) and dv
    (T, H): views of one grad_kv, or separate tensors (the 1.0 form)."""
    num_tokens, hc, hidden = check_gate_inputs(x, None, image_token_mask, k, v)
    check_tensor(grad_out, "grad_out", (torch.bfloat16,), 3)
    if grad_out.shape != x.shape:
        raise ValueError(f"grad_out must be hidden_states' shape {tuple(x.shape)}, got {tuple(grad_out.shape)}")
    if grad_out.device != x.device:
        raise ValueError(f"grad_out must be on {x.device} (as hidden_states), got {grad_out.device}")
    check_fused_weight(weight_fused, hc, hidden, x)
    saved = dict(dot=dot, gate_score=gate_score, rstd_x=rstd_x, rstd_k=rstd_k)
    _check_saved(saved, num_tokens, hc, x)
    if not isinstance(clamp_value, (int, float)) or isinstance(clamp_value, bool):
        raise TypeError(f"clamp_value must be a float, got {type(clamp_value).__name__}")
    if torch.compiler.is_compiling():
        dx, dk_new, dv_new, partial = torch.ops.tilebake.engram_gate_bwd(
            grad_out, x, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, float(clamp_value), image_token_mask
        )
        dk.copy_(dk_new)
        dv.copy_(dv_new)
        return dx, partial
    return _backward(grad_out, x, k, v, weight_fused, saved, float(clamp_value), image_token_mask, dk, dv)


def _backward(grad_out, x, k, v, w, saved, clamp_value, mask, dk, dv):
    num_tokens, hc, hidden = x.shape
    use_kernel = (
        x.is_cuda and num_tokens > 0 and hidden % 8 == 0 and hidden <= MAX_HIDDEN
        and kernel_rows(grad_out, x, k, v, dk, dv)
    )  # fmt: skip
    if x.device.type == "npu" and num_tokens > 0 and hidden <= ASCEND_MAX_HIDDEN:  # the Ascend kernel
        from tilebake.engram._engram_ascend import gate_backward_npu

        return gate_backward_npu(grad_out, x, k, v, w, saved, clamp_value, mask, dk, dv)
    if not use_kernel:
        from tilebake.torch.engram import engram_gate_bwd_ref

        dx, grad_kv, partial = engram_gate_bwd_ref(grad_out, x, torch.cat([k, v[:, None]], 1), w, *saved.values(),
                                                   clamp_value, mask)  # fmt: skip
        dk.copy_(grad_kv[:, :hc])
        dv.copy_(grad_kv[:, hc])
        if x.is_cuda:  # the kernel's row count (what torch.compile's meta says), zeros below the sum
            partial = torch.cat([partial, partial.new_zeros((num_partials(num_tokens, hc, hidden) - 1, hc, hidden))])
        return dx, partial
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ctas = num_partials(num_tokens, hc, hidden)
    partial = x.new_empty((ctas, hc, hidden), dtype=torch.float32)
    w = dense(w)
    saved = {n: dense(t) for n, t in saved.items()}
    mask = dense(mask) if mask is not None else None
    args = dict(
        G=grad_out.data_ptr(), X=x.data_ptr(), K=k.data_ptr(), V=v.data_ptr(), W=w.data_ptr(),
        DOT=saved["dot"].data_ptr(), GATE=saved["gate_score"].data_ptr(), RSTD_X=saved["rstd_x"].data_ptr(),
        RSTD_K=saved["rstd_k"].data_ptr(), MASK=mask.data_ptr() if mask is not None else 0, DX=dx.data_ptr(),
        DK=dk.data_ptr(), DV=dv.data_ptr(), P=partial.data_ptr(), clamp_value=clamp_value,
        num_tokens=num_tokens, hc=hc, hidden=hidden, num_ctas_per_head=ctas, has_mask=int(mask is not None),
        v_token_stride=v.stride(0), dv_token_stride=dv.stride(0),
    )  # fmt: skip
    for name, t in (("g", grad_out), ("x", x), ("k", k), ("dx", dx), ("dk", dk)):
        args[f"{name}_token_stride"], args[f"{name}_head_stride"] = t.stride(0), t.stride(1)
    kernel = _KERNELS["bf16", hidden_class(hidden)]
    kernel(x.get_device(), *[args[n] for n in kernel.arg_names])
    return dx, partial


# --- torch.library: lets torch.compile(fullgraph=True) trace the backward; eager calls skip it ---


def _op_impl(g, x, k, v, w, dot, gate, rx, rk, clamp_value, mask):
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    saved = dict(dot=dot, gate_score=gate, rstd_x=rx, rstd_k=rk)
    dx, partial = _backward(g, x, k, v, w, saved, clamp_value, mask, dk, dv)
    return dx, dk, dv, partial


def _meta(g, x, k, v, w, dot, gate, rx, rk, clamp_value, mask):
    rows = num_partials(*x.shape) if x.device.type != "cpu" else 1
    return (torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format), x.new_empty((rows, *x.shape[1:]), dtype=torch.float32))  # fmt: skip


register(
    "engram_gate_bwd(Tensor grad_out, Tensor x, Tensor k, Tensor v, Tensor weight_fused, Tensor dot, Tensor gate_score,"
    " Tensor rstd_x, Tensor rstd_k, float clamp_value, Tensor? image_token_mask) -> (Tensor, Tensor, Tensor, Tensor)",
    _op_impl,
    _meta,
)
