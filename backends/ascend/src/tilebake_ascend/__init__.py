"""tilebake's Ascend 950 kernels (data only): the runtime (`tilebake`) finds this package at run
time and reads KERNEL_DIR/manifest.json. Importing it loads nothing else."""

from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
