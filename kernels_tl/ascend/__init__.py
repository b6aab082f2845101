"""Ascend 950 (dav-3510) TileLang factories, one module per op as in kernels_tl/<family>/ (build time
only: build_tools/aot_ascend.py lowers them to AscendC)."""
