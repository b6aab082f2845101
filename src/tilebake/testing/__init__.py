"""Helpers for testing and benchmarking kernels (the original's tile_kernels.testing, which its
wheel ships for users' test suites): comparisons (numeric), test parameters and inputs
(generator), quantised-output checks (quant), router inputs (moe) and ids (bench).

Not imported by `import tilebake`; `tilebake.testing` loads on first use.
"""

from tilebake.testing import bench, generator, moe, numeric, quant
from tilebake.testing.quant import clear_unused_sf

__all__ = ["bench", "clear_unused_sf", "generator", "moe", "numeric", "quant"]
