"""MoE routing (the original's tile_kernels.moe)."""

from tilebake.moe.moe_topk_gate_forward import moe_topk_gate, moe_topk_gate_forward

__all__ = ["moe_topk_gate", "moe_topk_gate_forward"]
