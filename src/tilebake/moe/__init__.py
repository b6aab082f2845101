"""MoE routing: top-k expert selection, weight normalisation and the router backward (the
original's tile_kernels.moe), and the TileKernels 1.0 token-to-expert mapping ops (api.md 1.11):
get_fused_mapping, expand_to_fused, expand_to_fused_with_sf, reduce_fused.

Each op's module (its checks, torch.library schema and kernel table) loads on first use of
one of its functions, as in tilebake.quant.
"""

from tilebake._lazy import make_lazy

# public name -> the module that defines it
_MODULES = {
    "moe_topk_gate_backward": "moe_topk_gate_backward",
    "normalize_weight": "normalize_weight",
    "topk_gate": "topk_gate",
    "get_fused_mapping": "get_fused_mapping",
    "expand_to_fused": "expand_to_fused",
    "expand_to_fused_with_sf": "expand_to_fused",
    "reduce_fused": "reduce_fused",
    "moe_topk_gate": "moe_topk_gate_forward",
    "moe_topk_gate_forward": "moe_topk_gate_forward",
}


make_lazy(__name__)

__all__ = [*_MODULES]
