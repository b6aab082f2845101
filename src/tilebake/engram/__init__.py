"""Engram: the hashed n-gram memory's kernels and its Sinkhorn optimizer helpers (the original's
tile_kernels.engram); the autograd gate built on them is tilebake.modeling.engram.

Each op's module (its checks, torch.library schema and kernel table) loads on first use.
"""

from tilebake._lazy import make_lazy

# public name -> the module that defines it
_MODULES = {
    "engram_hash": "engram_hash",
    "fused_weight": "fused_weight",
    "engram_gate_fwd": "engram_gate_fwd",
    "engram_gate_bwd": "engram_gate_bwd",
    "grad_w_reduce": "grad_w_reduce",
    "engram_sinkhorn_momentum_update": "engram_sinkhorn",
    "engram_sinkhorn_step": "engram_sinkhorn",
    "engram_sinkhorn_step_reduce": "engram_sinkhorn",
    "engram_sinkhorn_finalize": "engram_sinkhorn",
}


make_lazy(__name__)

__all__ = list(_MODULES)
