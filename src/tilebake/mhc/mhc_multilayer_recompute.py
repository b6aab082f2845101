"""mhc_multilayer_recompute: the activation recompute of L layers' mHC steps for the backward,
the chain residual_0 = initial_residual, and for layer i
    layer_input_list[i] = mhc_pre_apply_mix(residual_i, pre_mix_list[i])
    residual_{i+1} = residual_list[i] = mhc_post(layer_output_list[i], residual_i, post_mix_list[i], comb_mix_list[i])
(the post step for the first len(post_mix_list) layers: L or L - 1).

On CUDA one kernel launch a chunk of up to LMAX layers (kernels_tl/mhc/mhc_multilayer_recompute.py):
each thread keeps its 8-column slice of the residual in registers across the chunk's layers,
with the single-layer kernels' arithmetic (bit-equal to their chain, residual_{i+1} the rounded
bf16 post output as the chain re-reads it). A chunk after the first starts from the previous
one's last residual_list entry. Each layer's tensors travel as separate kernel parameters (the
original passes device pointer tables). m (1 to 8), sizes and layer counts at run time. CPU
tensors take the chain of the single-layer ops (their references), NPU tensors the same chain,
whose single-layer ops launch their Ascend kernels (tilebake.mhc._mhc_ascend): an apply-mix
launch and a post launch a layer, no kernel of its own (tests/ascend/test_emulated_mhc.py,
tests/ascend/test_mhc_ops.py).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import Variant, i32, ptr
from tilebake.mhc import _plans
from tilebake.mhc._common import (
    MAX_MHC_MULT,
    check_aligned,
    check_disjoint,
    check_mult_and_hidden,
    check_shape,
    check_streams,
)

# Layers a launch. Its parameters are 6 pointers a layer + the initial residual + 5 sizes: 72 at
# LMAX = 11, the native launcher's limit (src/tilebake/_runtime/launcher.c, MAX_ARGS): the
# original's 10-layer benchmark in one launch.
LMAX = 11
LAYER_PARAMS = ("PRE", "LO", "POST", "COMB", "LI", "RL")  # a layer's pointers, suffixed with its index in the chunk


@dataclasses.dataclass(frozen=True)
class MhcMultilayerRecomputeVariant(Variant):
    family = "mhc"
    op = "mhc_multilayer_recompute"

    # m's upper bound, which sizes the kernel's register arrays: 4 (m = 1 to 4; the original's
    # only m) or 8 (m = 5 to 8)
    max_mult: int
    # built for m == max_mult only (m = 4, the original's): the stream loops unroll without
    # run-time guards and the mixes' offsets are constants
    exact: bool

    @classmethod
    def all(cls):
        return tuple(cls(m, False) for m in MAX_MULTS) + (cls(EXACT_MULT, True),)

    def params(self):
        layers = tuple(p for l in range(LMAX) for p in ptr(*(f"{name}{l}" for name in LAYER_PARAMS)))
        return ptr("R0") + layers + i32("num_tokens", "mhc_mult", "hidden", "num_layers", "num_post")


MAX_MULTS = (4, MAX_MHC_MULT)
EXACT_MULT = 4
_KERNELS = KernelTable(MhcMultilayerRecomputeVariant)
_PLANS = plan.cache()  # by _key


def _key(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list,
         residual_list) -> tuple:  # fmt: skip
    """The plan cache's key: the residual's rank and m, each pre and post mix's rank (their number:
    the layer and post-step counts), the other lists' lengths."""
    return (initial_residual.ndim, initial_residual.shape[-2], tuple(t.ndim for t in pre_mix_list),
            tuple(t.ndim for t in post_mix_list), len(layer_output_list), len(comb_mix_list), len(layer_input_list),
            len(residual_list))  # fmt: skip


def _check_mix(t, name: str, lead: tuple, mhc_mult: int, like: torch.Tensor) -> None:
    check_streams(t, name, torch.float32, 1)
    if tuple(t.shape) not in ((*lead, mhc_mult), (*lead, mhc_mult, 1)):
        raise ValueError(f"{name} must have shape {(*lead, mhc_mult)} or {(*lead, mhc_mult, 1)}, got {tuple(t.shape)}")
    check_shape(t, name, t.shape, like, "initial_residual")


def _check(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list,
           residual_list):  # fmt: skip
    """(tokens, m, hidden) of checked arguments (the list lengths already checked)."""
    r0 = initial_residual
    check_streams(r0, "initial_residual", torch.bfloat16, 2)
    mhc_mult, hidden = r0.shape[-2:]
    check_mult_and_hidden(mhc_mult, hidden, "initial_residual", r0)
    lead = tuple(r0.shape[:-2])
    for name, items, dtype, shape in (
        ("layer_output_list", layer_output_list, torch.bfloat16, (*lead, hidden)),
        ("comb_mix_list", comb_mix_list, torch.float32, (*lead, mhc_mult, mhc_mult)),
        ("layer_input_list", layer_input_list, torch.bfloat16, (*lead, hidden)),
        ("residual_list", residual_list, torch.bfloat16, r0.shape),
    ):
        for i, t in enumerate(items):
            check_streams(t, f"{name}[{i}]", dtype, 1)
            check_shape(t, f"{name}[{i}]", shape, r0, "initial_residual")
    for name, items in (("pre_mix_list", pre_mix_list), ("post_mix_list", post_mix_list)):
        for i, t in enumerate(items):
            _check_mix(t, f"{name}[{i}]", lead, mhc_mult, r0)
    lists = {"pre_mix_list": pre_mix_list, "layer_output_list": layer_output_list, "post_mix_list": post_mix_list,
             "comb_mix_list": comb_mix_list}  # fmt: skip
    inputs = {"initial_residual": r0, **{f"{n}[{i}]": t for n, items in lists.items() for i, t in enumerate(items)}}
    outputs = {f"{n}[{i}]": t for n, items in (("layer_input_list", layer_input_list), ("residual_list", residual_list))
               for i, t in enumerate(items)}  # fmt: skip
    check_disjoint(inputs, outputs)
    return r0.numel() // (mhc_mult * hidden), mhc_mult, hidden


def mhc_multilayer_recompute(initial_residual: torch.Tensor, pre_mix_list: Sequence[torch.Tensor],
                             layer_output_list: Sequence[torch.Tensor], post_mix_list: Sequence[torch.Tensor],
                             comb_mix_list: Sequence[torch.Tensor], layer_input_list: Sequence[torch.Tensor],
                             residual_list: Sequence[torch.Tensor]) -> None:  # fmt: skip
    """Writes layer_input_list[i] ((..., H) bf16) for every layer and residual_list[i]
    ((..., m, H) bf16) for every post step, in place. initial_residual (..., m, H) bf16, 1 <= m <= 8;
    pre, post mixes (..., m) or (..., m, 1) fp32, comb mixes (..., m, m) fp32, layer outputs
    (..., H) bf16. All contiguous, on one device, no output overlapping another tensor; on CUDA
    the bf16 tensors 16-byte aligned, H a multiple of 8."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[_key(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list,
                               layer_input_list, residual_list)]  # fmt: skip
        except (KeyError, TypeError, AttributeError, IndexError):
            pass
        else:
            result = plan.run(call, initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list,
                              layer_input_list, residual_list)  # fmt: skip
            if result is not NotImplemented:
                return result
    num_layers, num_post = len(pre_mix_list), len(post_mix_list)
    if num_post not in (num_layers, num_layers - 1) or num_layers < 1:
        raise ValueError(f"post_mix_list must hold L or L - 1 mixes for L = len(pre_mix_list) = {num_layers} >= 1 layers, "
                         f"got {num_post}")  # fmt: skip
    for name, items, want in (("layer_output_list", layer_output_list, num_post), ("comb_mix_list", comb_mix_list, num_post),
                              ("layer_input_list", layer_input_list, num_layers), ("residual_list", residual_list, num_post)):  # fmt: skip
        if len(items) != want:
            raise ValueError(f"{name} must hold {want} tensors (one a {'post step' if want == num_post else 'layer'}), "
                             f"got {len(items)}")  # fmt: skip
    num_tokens, mhc_mult, hidden = _check(initial_residual, pre_mix_list, layer_output_list, post_mix_list,
                                          comb_mix_list, layer_input_list, residual_list)  # fmt: skip
    if num_tokens == 0:
        return
    if not initial_residual.is_cuda:  # the chain: on an NPU the Ascend apply-mix and post kernels
        import tilebake.mhc as mhc

        residual = initial_residual
        for i in range(num_layers):
            mhc.mhc_pre_apply_mix_fwd(residual, pre_mix_list[i], layer_input_list[i])
            if i < num_post:
                residual = mhc.mhc_post_fwd(layer_output_list[i], residual, post_mix_list[i], comb_mix_list[i],
                                            out=residual_list[i])  # fmt: skip
        return
    check_aligned(initial_residual=initial_residual)
    for name, items in (("layer_output_list", layer_output_list), ("layer_input_list", layer_input_list),
                        ("residual_list", residual_list)):  # fmt: skip
        check_aligned(**{f"{name}[{i}]": t for i, t in enumerate(items)})
    key = (EXACT_MULT, True) if mhc_mult == EXACT_MULT else (next(c for c in MAX_MULTS if mhc_mult <= c), False)
    kernel = _KERNELS[key]
    device = initial_residual.get_device()
    residual = initial_residual
    for start in range(0, num_layers, LMAX):
        layers = range(start, min(start + LMAX, num_layers))
        posts = max(0, min(num_post, layers.stop) - start)
        pointers = []
        for i in range(start, start + LMAX):  # unused layers' pointers are never read: null
            has_pre, has_post = i < layers.stop, i < start + posts
            pointers += [pre_mix_list[i].data_ptr() if has_pre else 0]
            pointers += [items[i].data_ptr() if has_post else 0
                         for items in (layer_output_list, post_mix_list, comb_mix_list)]  # fmt: skip
            pointers += [layer_input_list[i].data_ptr() if has_pre else 0,
                         residual_list[i].data_ptr() if has_post else 0]  # fmt: skip
        kernel(device, residual.data_ptr(), *pointers, num_tokens, mhc_mult, hidden, len(layers), posts)
        if posts:
            residual = residual_list[start + posts - 1]
    plan.bump(*layer_input_list, *residual_list)
    key = _key(initial_residual, pre_mix_list, layer_output_list, post_mix_list, comb_mix_list, layer_input_list,
               residual_list)  # fmt: skip
    if num_layers <= LMAX:  # one launch (a plan holds at most 72 tensors)
        plan.remember(_PLANS, key, _plans.multilayer, kernel, device, initial_residual.ndim - 2, mhc_mult, key[2],
                      key[3])  # fmt: skip
