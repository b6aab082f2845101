"""The mhc ops on NPU tensors with Ascend 950 kernels (expand_to_mhc, mhc_post, mhc_pre_apply_mix,
mhc_sinkhorn, mhc_fn_normw_merge, mhc_head_compute_mix, mhc_pre_split_mixes,
mhc_reduce_partials_and_rmsnorm and mhc_pre_norm_gemm, both directions; m and every size at run
time): the references' arithmetic (the same bits for expand, post and apply-mix's forwards,
expand's backward and the split partials' sums; column sums and the pre-norm GEMM's sums in fixed
orders of their own; the exponential, and torch's CPU square root beside the RMSNorm scaling's
IEEE one, the things not bit-exact). mhc_multilayer_recompute is the chain of the apply-mix and
post forwards' launches, a layer at a time; mhc_pre_big_fuse_fwd the chain of the partials'
reduction and RMSNorm, split mixes, Sinkhorn and apply-mix launches. Never run on an NPU here:
the kernels are run on the CPU by tests/ascend/test_emulated_mhc.py, their launches checked
against a stand-in libascendcl."""

from __future__ import annotations

from tilebake._runtime import ascend
from tilebake.mhc.expand_to_mhc import ExpandToMhcAscendVariant
from tilebake.mhc.mhc_fn_normw_merge import MhcFnNormwMergeAscendVariant
from tilebake.mhc.mhc_head_compute_mix import MhcHeadComputeMixAscendVariant
from tilebake.mhc.mhc_post import MhcPostAscendVariant
from tilebake.mhc.mhc_pre_apply_mix import MhcPreApplyMixAscendVariant
from tilebake.mhc.mhc_pre_norm_gemm import MhcPreNormGemmAscendVariant
from tilebake.mhc.mhc_pre_split_mixes import MhcPreSplitMixesAscendVariant
from tilebake.mhc.mhc_reduce_partials_and_rmsnorm import MhcReducePartialsAndRmsnormAscendVariant
from tilebake.mhc.mhc_sinkhorn import MhcSinkhornAscendVariant

_EXPAND = ascend.AscendKernelTable(ExpandToMhcAscendVariant)
_POST = ascend.AscendKernelTable(MhcPostAscendVariant)
_APPLY_MIX = ascend.AscendKernelTable(MhcPreApplyMixAscendVariant)
_SINKHORN = ascend.AscendKernelTable(MhcSinkhornAscendVariant)
_HEAD_MIX = ascend.AscendKernelTable(MhcHeadComputeMixAscendVariant)
_SPLIT_MIXES = ascend.AscendKernelTable(MhcPreSplitMixesAscendVariant)
_FN_MERGE = ascend.AscendKernelTable(MhcFnNormwMergeAscendVariant)
_REDUCE_NORM = ascend.AscendKernelTable(MhcReducePartialsAndRmsnormAscendVariant)
_GEMM = ascend.AscendKernelTable(MhcPreNormGemmAscendVariant)
_TABLES = {
    "expand_to_mhc": _EXPAND, "mhc_post": _POST, "mhc_pre_apply_mix": _APPLY_MIX, "mhc_sinkhorn": _SINKHORN,
    "mhc_head_compute_mix": _HEAD_MIX, "mhc_pre_split_mixes": _SPLIT_MIXES, "mhc_fn_normw_merge": _FN_MERGE,
    "mhc_reduce_partials_and_rmsnorm": _REDUCE_NORM, "mhc_pre_norm_gemm": _GEMM,
}  # fmt: skip


def launch(op: str, direction: str, like, *args) -> None:
    """op's `direction` kernel on like's NPU, with the CUDA kernel's arguments (checked,
    contiguous tensors' addresses and the sizes)."""
    index, kernel = _TABLES[op].on(like, direction)
    kernel(index, *args)
