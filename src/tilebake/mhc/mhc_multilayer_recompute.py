"""mhc_multilayer_recompute: the activation recompute of L layers' mHC steps for the backward,
the chain residual_0 = initial_residual, and for layer i
    layer_input_list[i] = mhc_pre_apply_mix(residual_i, pre_mix_list[i])
    residual_{i+1} = residual_list[i] = mhc_post(layer_output_list[i], residual_i, post_mix_list[i], comb_mix_list[i])
(the post step for the first len(post_mix_list) layers: L or L - 1).

The original launches this as one kernel whose tensor lists travel as device pointer tables
(L compile-time). Here it is the chain of the single-layer kernels, 2L launches from one call,
bit-equal to them by construction, for any L and any m from 1 to 8.
"""

from __future__ import annotations

from typing import Sequence

import torch


def mhc_multilayer_recompute(initial_residual: torch.Tensor, pre_mix_list: Sequence[torch.Tensor],
                             layer_output_list: Sequence[torch.Tensor], post_mix_list: Sequence[torch.Tensor],
                             comb_mix_list: Sequence[torch.Tensor], layer_input_list: Sequence[torch.Tensor],
                             residual_list: Sequence[torch.Tensor]) -> None:  # fmt: skip
    """Writes layer_input_list[i] ((..., H) bf16) for every layer and residual_list[i]
    ((..., m, H) bf16) for every post step, in place. initial_residual (..., m, H) bf16; pre, post
    mixes (..., m) or (..., m, 1) fp32, comb mixes (..., m, m) fp32, layer outputs (..., H) bf16."""
    import tilebake.mhc as mhc

    num_layers, num_post = len(pre_mix_list), len(post_mix_list)
    if num_post not in (num_layers, num_layers - 1) or num_layers < 1:
        raise ValueError(f"post_mix_list must hold L or L - 1 mixes for L = len(pre_mix_list) = {num_layers} >= 1 layers, "
                         f"got {num_post}")  # fmt: skip
    for name, items, want in (("layer_output_list", layer_output_list, num_post), ("comb_mix_list", comb_mix_list, num_post),
                              ("layer_input_list", layer_input_list, num_layers), ("residual_list", residual_list, num_post)):  # fmt: skip
        if len(items) != want:
            raise ValueError(f"{name} must hold {want} tensors (one a {'post step' if want == num_post else 'layer'}), "
                             f"got {len(items)}")  # fmt: skip
    for name, items in (("layer_input_list", layer_input_list), ("residual_list", residual_list)):
        for i, t in enumerate(items):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
            if any(t.data_ptr() == r.data_ptr() and t.numel() for r in (initial_residual, *layer_output_list)):
                raise ValueError(f"{name}[{i}] must not share storage with the inputs it is computed from")
    residual = initial_residual
    for i in range(num_layers):
        mhc.mhc_pre_apply_mix_fwd(residual, pre_mix_list[i], layer_input_list[i])
        if i < num_post:
            mhc.mhc_post_fwd(layer_output_list[i], residual, post_mix_list[i], comb_mix_list[i], out=residual_list[i])
            residual = residual_list[i]
