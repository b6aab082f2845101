#!/usr/bin/env bash
# The build environment of the CUDA kernels (backends/cuda: `pip wheel --no-build-isolation`),
# installed from PyPI into the active Python (wheels.yml runs it in the manylinux_2_28 image).
# No CUDA install step: the CUDA 13.0 compiler comes from NVIDIA's PyPI wheels, which
# backends/cuda/CMakeLists.txt finds in nvidia/cu13/bin. torch is only imported by tilelang at
# build time, so it is a CPU wheel.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_INDEX=${TILEBAKE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
# The torch pin lives in requirements-build.txt only.
TORCH_PIN=$(grep -E '^torch==' build_tools/requirements-build.txt)

# 1. torch alone from the CPU index. Its 2.x.y+cpu satisfies the ==2.x.y of
#    requirements-build.txt, so step 2 keeps it and nothing can pull PyPI's multi-GB CUDA torch.
python -m pip install "$TORCH_PIN" --index-url "$TORCH_INDEX"
# 2. tilelang, scikit-build-core, cmake, ninja.
python -m pip install -r build_tools/requirements-build.txt
# 3. nvcc and what it needs at run time: cicc and libdevice (nvvm), the crt and runtime headers,
#    CCCL (libcu++ headers). 13.0 is the CUDA we build and test with; it fixes the driver floor
#    (README, "Building wheels"). nvcc also wants a host compiler: the image's gcc.
python -m pip install "nvidia-cuda-nvcc==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" \
  "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*"

python - <<'EOF'
import os

import nvidia.cu13
import tilelang
import torch

# A CUDA torch here means step 1 was bypassed; it would also cost gigabytes.
assert torch.version.cuda is None, f"the build environment has a CUDA torch ({torch.__version__})"
nvcc = os.path.join(nvidia.cu13.__path__[0], "bin", "nvcc")
assert os.access(nvcc, os.X_OK), f"PyPI nvcc not found at {nvcc}"
print(f"build environment: torch {torch.__version__}, tilelang {tilelang.__version__}, nvcc {nvcc}")
EOF
"$(python -c 'import nvidia.cu13, os; print(os.path.join(nvidia.cu13.__path__[0], "bin", "nvcc"))')" --version | tail -n 2
