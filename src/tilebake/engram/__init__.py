"""Engram: the hashed n-gram memory's kernels and its Sinkhorn optimizer helpers (the original's
tile_kernels.engram). Not yet here: engram_gate_fwd / engram_gate_bwd and the autograd gate
(tilebake.modeling.engram); their references are tilebake.torch.engram_gate_fwd_ref /
engram_gate_bwd_ref / engram_gate_ref.

Each op's module (its checks, torch.library schema and kernel table) loads on first use.
"""

from tilebake._lazy import make_lazy

# public name -> the module that defines it
_MODULES = {
    "engram_hash": "engram_hash",
    "fused_weight": "fused_weight",
    "grad_w_reduce": "grad_w_reduce",
    "engram_sinkhorn_momentum_update": "engram_sinkhorn",
    "engram_sinkhorn_step": "engram_sinkhorn",
    "engram_sinkhorn_step_reduce": "engram_sinkhorn",
    "engram_sinkhorn_finalize": "engram_sinkhorn",
}


make_lazy(__name__)

__all__ = list(_MODULES)
