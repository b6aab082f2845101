"""tilebake: TileLang kernels for LLM training and inference, compiled ahead of time.

`import tilebake as tile_kernels` gives the TileKernels 2.1.0 API. Importing compiles
nothing, loads no native code and writes no file: kernels are loaded on first use.
"""

import importlib

from tilebake import config, engram, mhc, moe, quant, rand, transform, utils
from tilebake.config import (  # the original re-exports its config functions
    get_amax_clamp_for_quant,
    get_deterministic_algorithms,
    get_device,
    get_device_num_sms,
    get_max_smem_per_sm,
    get_max_ub_per_vector_core,
    get_num_ai_cores,
    get_num_cube_cores,
    get_num_sms,
    get_num_vec_cores,
    get_pdl,
    get_token_alignment,
    is_ascend,
    set_amax_clamp_for_quant,
    set_num_sms,
    set_pdl,
    set_token_alignment,
    use_deterministic_algorithms,
)

__version__ = "0.1.0"


def __getattr__(name):
    # tilebake.torch (the references) loads on first use: GPU code never needs it, and
    # it is a good part of the import time that counts towards a cold start. So do
    # modeling (it imports torch's references too) and testing (only test suites use it).
    if name in ("torch", "modeling", "testing"):
        return importlib.import_module(f"tilebake.{name}")
    raise AttributeError(f"module 'tilebake' has no attribute {name!r}")


__all__ = [
    "config",
    "engram",
    "mhc",
    "modeling",
    "moe",
    "quant",
    "rand",
    "testing",
    "torch",
    "transform",
    "utils",
    "get_amax_clamp_for_quant",
    "get_deterministic_algorithms",
    "get_device",
    "get_device_num_sms",
    "get_max_smem_per_sm",
    "get_max_ub_per_vector_core",
    "get_num_ai_cores",
    "get_num_cube_cores",
    "get_num_sms",
    "get_num_vec_cores",
    "get_pdl",
    "get_token_alignment",
    "is_ascend",
    "set_amax_clamp_for_quant",
    "set_num_sms",
    "set_pdl",
    "set_token_alignment",
    "use_deterministic_algorithms",
]
