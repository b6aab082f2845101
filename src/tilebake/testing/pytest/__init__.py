"""pytest plugins for test suites written against tile_kernels.testing, loaded by name, e.g.
`pytest_plugins = ["tilebake.testing.pytest.random", "tilebake.testing.pytest.precompile"]`.

Only these two are here; the original's benchmark, gpu_mem, tilelang_warning and
xdist_failfast plugins are not provided.
"""
