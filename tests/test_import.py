"""`import tilebake` compiles nothing: no tilelang, TVM or native launcher is loaded and no
file is written, checked in a fresh interpreter with empty HOME and TMPDIR."""

import json
import os
import subprocess
import sys

PROBE = r"""
import json, sys
import tilebake
import tilebake as tile_kernels
tile_kernels.quant.per_token_cast, tile_kernels.quant.cast_back, tile_kernels.torch.cast
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in ("tilelang", "tvm", "tvm_ffi") or m.endswith("_launcher"))))
"""


def test_import_loads_no_compiler_and_writes_nothing(tmp_path):
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(), tmp.mkdir()
    env = dict(os.environ, HOME=str(home), TMPDIR=str(tmp), PYTHONDONTWRITEBYTECODE="1")
    result = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
    assert list(home.iterdir()) == [] and list(tmp.iterdir()) == []


def test_quant_names_stay_functions_after_their_modules_load():
    """tilebake.quant loads op modules lazily; importing a module directly (as the build and
    some tests do) must not replace the function of the same name with the module."""
    import importlib
    import pkgutil

    import tilebake.quant

    for info in pkgutil.iter_modules(tilebake.quant.__path__):
        importlib.import_module(f"tilebake.quant.{info.name}")
    for name in tilebake.quant.__all__:
        if name != "QuantTensor":  # a type alias
            value = getattr(tilebake.quant, name)
            assert callable(value) and value.__name__ == name, (name, value)
