"""mhc_pre_big_fuse_fwd: the whole of an inference mhc_pre after the projection GEMM, from its
split-K partials to the layer's input: reduce the partials and scale by the RMSNorm factor,
split the mixes, Sinkhorn-normalise the residual mix, and mix the streams.

Validate, allocate, launch. For m <= 4 (the original's m) one kernel, for any token count and
n_splits (the original: multiples of 16 tokens and n_splits == 1): kernels_tl/mhc/mhc_pre_big_fuse.py
(reduce, RMSNorm and split a warp a token, the streams mixed, then the Sinkhorn). For m = 5 to 8, on the CPU and under torch.compile, the training
path's four ops (mhc_reduce_partials_and_rmsnorm_fwd, mhc_pre_split_mixes_fwd, mhc_sinkhorn_fwd,
mhc_pre_apply_mix_fwd). Both give the training path's bytes: the mix kernel does each step with
that step's kernel's arithmetic.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, f32, i32, ptr
from tilebake.mhc import _plans_norm
from tilebake.mhc._common import (
    check_aligned,
    check_disjoint,
    check_float,
    check_int,
    check_mult_and_hidden,
    check_shape,
    check_streams,
    ndim_or_none,
)


@dataclasses.dataclass(frozen=True)
class MhcPreBigFuseVariant(Variant):
    family = "mhc"
    op = "mhc_pre_big_fuse"

    max_mult: int  # m's bound: 4 (m = 1 to 4; m = 5 to 8 take the chain of the single-step kernels)

    @classmethod
    def all(cls):
        return (cls(FUSED_MULT),)

    def params(self):
        return ptr("PM", "PS", "SCALE", "BASE", "X", "POST", "COMB", "O") + i32(
            "num_tokens", "mhc_mult", "hidden", "mix_cols", "n_splits", "rms_group_size", "repeat"
        ) + f32("rms_eps", "pre_eps", "eps", "post_mult")  # fmt: skip (eps: the Sinkhorn's)


FUSED_MULT = 4
_KERNELS = KernelTable(MhcPreBigFuseVariant)
_PLANS = plan.cache()  # by the ranks, which outputs are given (and their ranks), n_splits and the scalars


def _key(gemm_out_mul, residual, *rest):
    """The plan cache's key: the ranks of the partials, the residual and the given outputs (None:
    allocated), the scalars and their types."""
    outputs, scalars = rest[:3], rest[3:]
    return (gemm_out_mul.ndim, residual.ndim, *(ndim_or_none(t) for t in outputs), *scalars,
            tuple(v.__class__ for v in scalars))


def _check(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input, n_splits):
    """(tokens, m, hidden) of checked tensors."""
    check_streams(residual, "residual", torch.bfloat16, 2)
    m, hidden = residual.shape[-2:]
    check_mult_and_hidden(m, hidden, "residual", residual)
    lead = tuple(residual.shape[:-2])
    num_tokens = residual.numel() // max(m * hidden, 1)
    check_streams(gemm_out_mul, "gemm_out_mul", torch.float32, 4)
    if gemm_out_mul.dim() != 4 or tuple(gemm_out_mul.shape[1:3]) != (num_tokens, 1):
        raise ValueError(f"gemm_out_mul must have shape (n_splits, {num_tokens}, 1, m3) for the residual's "
                         f"{num_tokens} tokens, got {tuple(gemm_out_mul.shape)}")  # fmt: skip
    m3 = m * (m + 2)
    if gemm_out_mul.shape[-1] != m3:
        raise ValueError(f"gemm_out_mul's last dim must be m (m + 2) = {m3} for the residual's {m} streams, "
                         f"got {gemm_out_mul.shape[-1]}")  # fmt: skip
    n_splits = check_int(n_splits, "n_splits", 1)
    if gemm_out_mul.shape[0] != n_splits:
        raise ValueError(f"n_splits ({n_splits}) must equal gemm_out_mul's dim 0, got {gemm_out_mul.shape[0]}")
    check_shape(gemm_out_mul, "gemm_out_mul", gemm_out_mul.shape, residual, "residual")
    check_streams(gemm_out_sqrsum, "gemm_out_sqrsum", torch.float32, 1)
    check_shape(gemm_out_sqrsum, "gemm_out_sqrsum", (n_splits, num_tokens, 1), residual, "residual")
    check_streams(mhc_scale, "mhc_scale", torch.float32, 1)
    check_shape(mhc_scale, "mhc_scale", (3,), residual, "residual")
    check_streams(mhc_base, "mhc_base", torch.float32, 1)
    check_shape(mhc_base, "mhc_base", (m3,), residual, "residual")
    for t, name, shapes, dtype in ((post_mix, "post_mix", ((*lead, m, 1), (*lead, m)), torch.float32),
                                   (comb_mix, "comb_mix", ((*lead, m, m), (*lead, m * m)), torch.float32),
                                   (layer_input, "layer_input", ((*lead, hidden),), torch.bfloat16)):  # fmt: skip
        if t is None:
            continue
        check_streams(t, name, dtype, 1)
        if tuple(t.shape) not in shapes:
            raise ValueError(f"{name} must have shape {' or '.join(str(s) for s in shapes)}, got {tuple(t.shape)}")
        check_shape(t, name, t.shape, residual, "residual")
    outputs = {"post_mix": post_mix, "comb_mix": comb_mix, "layer_input": layer_input}
    inputs = {"gemm_out_mul": gemm_out_mul, "gemm_out_sqrsum": gemm_out_sqrsum, "mhc_scale": mhc_scale,
              "mhc_base": mhc_base, "residual": residual}  # fmt: skip
    check_disjoint(inputs, {k: v for k, v in outputs.items() if v is not None})
    return num_tokens, m, hidden


def mhc_pre_big_fuse_fwd(gemm_out_mul: torch.Tensor, gemm_out_sqrsum: torch.Tensor, mhc_scale: torch.Tensor,
                         mhc_base: torch.Tensor, residual: torch.Tensor, post_mix: Optional[torch.Tensor] = None,
                         comb_mix: Optional[torch.Tensor] = None, layer_input: Optional[torch.Tensor] = None,
                         rms_eps: float = 1e-6, mhc_pre_eps: float = 1e-6, mhc_sinkhorn_eps: float = 1e-6,
                         mhc_post_mult_value: float = 1.0, sinkhorn_repeat: int = 10, n_splits: int = 16):  # fmt: skip
    """(post_mix, comb_mix, layer_input) of one mhc_pre from the projection's partials.

    gemm_out_mul (n_splits, T, 1, m3) and gemm_out_sqrsum (n_splits, T, 1) fp32: split-K partials
    of residual @ fn^T and of the residual's square sums (mhc_pre_norm_gemm_fwd's outputs);
    mhc_scale (3,), mhc_base (m3,) fp32; residual (..., m, H) bf16 with T tokens in its leading
    dims. Outputs, written where given (not overlapping the inputs), else allocated: post_mix
    (..., m, 1) fp32 (also accepted: (..., m)), comb_mix (..., m, m) fp32 (also (..., m * m)),
    layer_input (..., H) bf16. n_splits must equal gemm_out_mul's dim 0. All contiguous.
    """
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[_key(gemm_out_mul, residual, post_mix, comb_mix, layer_input, rms_eps, mhc_pre_eps,
                               mhc_sinkhorn_eps, mhc_post_mult_value, sinkhorn_repeat, n_splits)]  # fmt: skip
        except (KeyError, TypeError, AttributeError):
            pass
        else:
            result = plan.run(call, gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix,
                              layer_input)  # fmt: skip
            if result is not NotImplemented:
                return result
    num_tokens, m, hidden = _check(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix,
                                   layer_input, n_splits)  # fmt: skip
    scalars = [check_float(v, name) for v, name in ((rms_eps, "rms_eps"), (mhc_pre_eps, "mhc_pre_eps"),
                                                     (mhc_sinkhorn_eps, "mhc_sinkhorn_eps"),
                                                     (mhc_post_mult_value, "mhc_post_mult_value"))]  # fmt: skip
    repeat = check_int(sinkhorn_repeat, "sinkhorn_repeat", 1)
    if torch.compiler.is_compiling() or not residual.is_cuda or m > FUSED_MULT or num_tokens == 0:
        return _chain(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input,
                      *scalars, repeat, n_splits)  # fmt: skip
    lead = tuple(residual.shape[:-2])
    new = residual.new_empty
    post = new((*lead, m, 1), dtype=torch.float32) if post_mix is None else post_mix
    comb = new((*lead, m, m), dtype=torch.float32) if comb_mix is None else comb_mix
    out = new((*lead, hidden), dtype=torch.bfloat16) if layer_input is None else layer_input
    check_aligned(residual=residual, layer_input=out)
    kernel = _KERNELS[FUSED_MULT,]
    device = residual.get_device()
    kernel(device, *(t.data_ptr() for t in (gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post, comb,
                                            out)),
           num_tokens, m, hidden, m * (m + 2), n_splits, m * hidden, repeat, *scalars)  # fmt: skip
    plan.bump(post_mix, comb_mix, layer_input)
    key = _key(gemm_out_mul, residual, post_mix, comb_mix, layer_input, rms_eps, mhc_pre_eps, mhc_sinkhorn_eps,
               mhc_post_mult_value, sinkhorn_repeat, n_splits)  # fmt: skip
    plan.remember(_PLANS, key, _plans_norm.big_fuse_fwd, kernel, device, residual.ndim - 2, key[2:5], n_splits,
                  repeat, scalars)  # fmt: skip
    return post, comb, out


def _chain(gemm_out_mul, gemm_out_sqrsum, mhc_scale, mhc_base, residual, post_mix, comb_mix, layer_input, rms_eps,
           pre_eps, sinkhorn_eps, post_mult, repeat, n_splits):  # fmt: skip
    """The training path's four ops, into the given outputs (else new ones)."""
    import tilebake.mhc as mhc

    m, hidden = residual.shape[-2:]
    lead = tuple(residual.shape[:-2])
    _, _, mixes = mhc.mhc_reduce_partials_and_rmsnorm_fwd(gemm_out_mul, gemm_out_sqrsum, rms_group_size=m * hidden,
                                                          rms_eps=rms_eps, n_splits=n_splits)  # fmt: skip
    pre = residual.new_empty((*lead, m, 1), dtype=torch.float32)
    comb_raw = residual.new_empty((*lead, m, m), dtype=torch.float32)
    if post_mix is None:
        post_mix = residual.new_empty((*lead, m, 1), dtype=torch.float32)
    mhc.mhc_pre_split_mixes_fwd(mixes.view(*lead, m * (m + 2)), mhc_scale, mhc_base, pre, post_mix, comb_raw,
                                post_mult, pre_eps)  # fmt: skip
    if comb_mix is not None and tuple(comb_mix.shape) == (*lead, m * m):
        mhc.mhc_sinkhorn_fwd(comb_raw, comb_mix.view(*lead, m, m), repeat, sinkhorn_eps)
    else:
        comb_mix = mhc.mhc_sinkhorn_fwd(comb_raw, comb_mix, repeat, sinkhorn_eps)
    layer_input = mhc.mhc_pre_apply_mix_fwd(residual, pre, layer_input)
    return post_mix, comb_mix, layer_input
