"""Constants of the counter-based hashes (no RNG state) that kernels and references share:
stochastic rounding's per-pair bits (tilebake.torch.stochastic, kernels_tl/quant/common.py)
and the router's force_random draws (tilebake.torch.gate, kernels_tl/moe/gate_parts.py)."""

GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: the key step (SR: per pair; force_random: per draw)
SR_OFFSET = 0x7F4A7C15  # stochastic rounding's key: p * GOLDEN + SR_OFFSET
