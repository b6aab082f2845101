"""batched_transpose_weight_sf: fp32 power-of-two weight block scales -> DeepGEMM UE8M0 layouts.

Validate, allocate, launch (two launches per weight: sf0 and sf1, the same kernel reading the
scales through swapped strides), then read the kernels' flag of a bad scale (one device-to-host
copy: the values are checked on the device, not by torch ops on the host). The kernel is kernels_tl/quant/batched_transpose_weight_sf.py; the
reference (and the CPU path) and the full description of the layouts are in
src/tilebake/torch/weight_sf.py.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch

from tilebake import utils
from tilebake._checks import check_device
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.torch.weight_sf import (
    WEIGHT_SF_BLOCK_SIZES,
    check_power_of_two_scales,
    sf1_layout,
    sf_shapes,
    weight_sf_layout,
)
from tilebake.utils import ceil_div


@dataclasses.dataclass(frozen=True)
class BatchedTransposeWeightSfVariant(Variant):
    family = "quant"
    op = "batched_transpose_weight_sf"
    PARAMS = (
        ptr("SF", "OUT", "BAD")
        + i32(
            "num_words_total", "rows", "words", "cols", "shift", "in_stride_g", "in_stride_r", "in_stride_c",
            "out_stride_g", "out_stride_r", "out_stride_w"
        )
    )  # fmt: skip

    in_dtype: str  # 'fp32': the only input; block size, shapes and layouts are runtime

    @classmethod
    def all(cls):
        return (cls("fp32"),)


@dataclasses.dataclass(frozen=True)
class BatchedTransposeWeightSfAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/quant/batched_transpose_weight_sf.py): the
    original's Ascend case, block size 32, UE8M0 bytes packed two to an int16; the scales
    contiguous (G, nb, kb). along 'k': sf0's (G, ceil(kb / 2), n) buffer; along 'n': sf1's
    (G, ceil(nb / 2), k) buffer."""

    family = "quant"
    op = "batched_transpose_weight_sf"
    backend = "ascend"
    PARAMS = ptr("SF", "OUT", "BAD") + i32("groups", "nb", "kb")

    along: str  # 'k' | 'n': the dim whose consecutive scales share an int16
    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(along, cores) for along in ("k", "n") for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(BatchedTransposeWeightSfVariant)


def _check_out(t, name: str, shape: tuple[int, ...], like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor (or None), got {type(t).__name__}")
    packed = utils.ue8m0_word(like.device)[0]  # int32; on an NPU int16
    if t.dtype != packed:
        raise TypeError(f"{name} must be {packed} (packed UE8M0 on {like.device.type}), got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != like.device:
        raise ValueError(f"{name} must be on {like.device}, got {t.device}")


def _launch(src: torch.Tensor, out: torch.Tensor, bs: int, transpose: bool, kernels, bad: torch.Tensor) -> None:
    """src (G, R, C) fp32 block scales -> out (G, R*bs, ceil(C/4)) words; transpose reads src as (G, C, R)."""
    g, r, c = src.shape
    sg, sr, sc = src.stride()
    if transpose:
        r, c, sr, sc = c, r, sc, sr
    rows, words = r * bs, ceil_div(c, 4)
    total = g * rows * words
    if total == 0:
        return
    og, orow, ow = out.stride()
    kernels["fp32",](
        src.get_device(),
        src.data_ptr(), out.data_ptr(), bad.data_ptr(), total, rows, words, c, bs.bit_length() - 1, sg, sr, sc, og,
        orow, ow,
    )  # fmt: skip


def batched_transpose_weight_sf(
    sf: Sequence[torch.Tensor],
    block_size: int,
    transpose_sf1s: Sequence[bool],
    outs: Optional[Sequence[Optional[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]]] = None,
) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Transform per-weight fp32 power-of-two block scales into DeepGEMM's UE8M0 layouts.

    For a weight W (n, k) with scales sf[i] (n/bs, k/bs) (or (G, n/bs, k/bs) for G experts; the
    same per group), both layouts hold UE8M0 bytes packed 4 to an int32 (details in
    tilebake.torch.weight_sf):

    * sf0: W's scales at (1, bs) granularity, packed along K: int32 (n, ceil(k/bs/4)) MN-major,
      the transposed view of a (ceil(k/bs/4), n) buffer (strides (1, n); grouped (G, n, ..)).
    * sf1: W^T's, packed along N, in a (ceil(n/bs/4), k) buffer: that buffer itself when
      transpose_sf1s[i] (strides (k, 1)), else its transposed (k, ceil(n/bs/4)) view (strides
      (1, k)).

    Unlike the original, n and k need not be multiples of 128, the scales may have any strides,
    and outs is optional.

    Args:
        sf: fp32 tensors (any strides) of positive normal powers of two; anything else raises
            ValueError naming the entry (checked by the kernels, read back with one device-to-host
            copy; the outputs then hold 0xFF, UE8M0's NaN, for each bad scale). While a CUDA graph
            is captured nothing can be read back: bad scales are only those 0xFF bytes.
        block_size: bs, 32 or 128.
        transpose_sf1s: one bool per weight.
        outs: optional, one entry per weight: None, or a (sf0, sf1) pair of int32 tensors of the
            returned shapes (any strides), filled in place and returned themselves; a None part
            is allocated.

    Returns:
        [(sf0, sf1)] per weight. CPU tensors take the reference path. Given outs have their
        version counters bumped, as by torch's out= ops.
    """
    # The native path: a call whose key has been seen runs as a plan (validate, allocate and
    # launch in C), then the flag of a bad scale is read. A call the plan does not take
    # (NotImplemented) goes on below; not while torch.compile traces. The classes are in the
    # key: 1 and True are equal keys the checks below tell apart.
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS[(
                block_size, block_size.__class__, len(sf), len(transpose_sf1s), None if outs is None else len(outs),
                *[(t, t.__class__) for t in transpose_sf1s], *[s.ndim for s in sf],
            )]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, *(sf if outs is None else (*sf, *outs)))
            if result is not NotImplemented:
                results, bad = result
                _raise_if_bad(bad, sf)
                return list(results)
    if block_size not in WEIGHT_SF_BLOCK_SIZES or isinstance(block_size, bool):
        raise ValueError(f"block_size must be one of {WEIGHT_SF_BLOCK_SIZES}, got {block_size!r}")
    sf, transpose_sf1s = list(sf), list(transpose_sf1s)
    if len(transpose_sf1s) != len(sf):
        raise ValueError(f"transpose_sf1s must have one flag per weight ({len(sf)}), got {len(transpose_sf1s)}")
    outs_given = outs is not None
    outs = [None] * len(sf) if outs is None else list(outs)
    if len(outs) != len(sf):
        raise ValueError(f"outs must have one entry (or None) per weight ({len(sf)}), got {len(outs)}")
    for i, (s, transpose, out) in enumerate(zip(sf, transpose_sf1s, outs)):
        if not isinstance(transpose, bool):
            raise TypeError(f"transpose_sf1s[{i}] must be a bool, got {transpose!r}")
        if not isinstance(s, torch.Tensor):
            raise TypeError(f"sf[{i}] must be a torch.Tensor, got {type(s).__name__}")
        if s.dtype != torch.float32:
            raise TypeError(f"sf[{i}] must be torch.float32, got {s.dtype}")
        if s.dim() not in (2, 3):
            raise ValueError(f"sf[{i}] must be (n/bs, k/bs) or (G, n/bs, k/bs), got shape {tuple(s.shape)}")
        check_device(s, f"sf[{i}]")
        if out is not None:
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise TypeError(f"outs[{i}] must be None or a (sf0, sf1) pair, got {type(out).__name__}")
            for j, (t, shape) in enumerate(zip(out, sf_shapes(s, block_size, transpose))):
                if t is not None:
                    _check_out(t, f"outs[{i}][{j}]", shape, s)
        if s.is_cpu:  # (on the GPU the kernels check every scale: _raise_if_bad)
            check_power_of_two_scales(s, f"sf[{i}]")

    if sf and all(s.device.type == "npu" for s in sf) and not outs_given:  # the Ascend kernels where they apply
        from tilebake.quant import _batched_transpose_weight_sf_ascend as ascend_path

        results = ascend_path.batched_transpose_weight_sf(sf, block_size, transpose_sf1s)
        if results is not None:
            return results
    if not all(s.is_cuda for s in sf):
        from tilebake.torch import batched_transpose_weight_sf as reference

        return reference(sf, block_size, transpose_sf1s, outs)

    if not sf:
        return []
    bad = sf[0].new_zeros((1,), dtype=torch.int32)  # set by the kernels on a bad scale
    results = [transform(s, block_size, transpose, out, bad=bad) for s, transpose, out in zip(sf, transpose_sf1s, outs)]
    given = [t for out in outs if out is not None for t in out if t is not None]
    if given:  # the kernel wrote them behind autograd's back
        torch.autograd.graph.increment_version(given)
    _raise_if_bad(bad, sf)
    # Plans for up to MAX_PLANNED weights (a plan makes at most 8 launches), outs None or all given.
    fully = outs_given and len(given) == 2 * len(sf) and all(type(out) is tuple for out in outs)
    if 1 <= len(sf) <= MAX_PLANNED and (not outs_given or fully):
        key = _plan_key(sf, block_size, transpose_sf1s, outs if outs_given else None)
        if key not in _PLANS:
            plan.remember(
                _PLANS, key,
                _plans, _KERNELS["fp32",], sf[0].get_device(), block_size, tuple(s.dim() for s in sf),
                tuple(transpose_sf1s), outs_given,
            )  # fmt: skip
    return results


MAX_PLANNED = 4
_PLANS = plan.cache()


def _raise_if_bad(bad: torch.Tensor, sf) -> None:
    """The kernels' flag of a scale that is not a positive normal power of two, read back (one
    device-to-host copy; not while a CUDA graph is captured, where only the 0xFF bytes tell):
    check_power_of_two_scales's error for the first weight holding one."""
    if (bad.is_cuda and torch.cuda.is_current_stream_capturing()) or not bad.item():
        return
    for i, s in enumerate(sf):
        check_power_of_two_scales(s, f"sf[{i}]")
    raise AssertionError("batched_transpose_weight_sf: the kernels flagged a scale the host check accepts")


def _plan_key(sf, block_size, transpose_sf1s, outs):
    """The call's key as the native path above looks it up."""
    return (
        block_size, block_size.__class__, len(sf), len(transpose_sf1s), None if outs is None else len(outs),
        *[(t, t.__class__) for t in transpose_sf1s], *[s.ndim for s in sf],
    )  # fmt: skip


def _plans(kernel, device, block_size, ranks, transposes, given_outs):
    """The CUDA path above as a call plan: the checks, the allocations, the zeroed bad-scale flag
    and both launches of every weight, returning (a tuple of (sf0, sf1) per weight, the flag).
    Arguments: the scales, then (with given_outs) each weight's (sf0, sf1). Empty weights take
    the Python path."""
    try:
        return _plan(kernel, device, block_size, ranks, transposes, given_outs)
    except ValueError:  # more registers or tensors than a plan holds: the Python path
        return None


def _plan(kernel, device, block_size, ranks, transposes, given_outs):
    b = plan.Builder()
    b.let("shift", block_size.bit_length() - 1)
    b.let("one", 1)
    results = []
    for i, (rank, transpose) in enumerate(zip(ranks, transposes)):
        p = f"w{i}_"  # this weight's symbols
        names = [p + n for n in ("g", "nb", "kb")][3 - rank :]
        strides = [p + n for n in ("sg", "sr", "sc")][3 - rank :]
        s = b.tensor(i, torch.float32, names, strides=strides, align=4)
        if rank == 2:  # transform()'s unsqueeze(0): one group, its stride nb * sr
            b.let(p + "g", "one")
            b.let(p + "sg", f"{p}nb * {p}sr")
        b.check(f"{p}g >= 1 and {p}nb >= 1 and {p}kb >= 1")
        b.let(p + "n", f"{p}nb * {block_size}")
        b.let(p + "k", f"{p}kb * {block_size}")
        b.let(p + "w0", f"({p}kb + 3) // 4")
        b.let(p + "w1", f"({p}nb + 3) // 4")
        groups = [p + "g"] if rank == 3 else []
        if given_outs:  # (sf0, sf1) at any strides; the kernel's (G, rows, words) views of them
            sf0 = b.tensor((len(ranks) + i, 0), torch.int32, [*groups, p + "n", p + "w0"],
                           strides=[p + n for n in ("o0g", "o0r", "o0w")][3 - rank :], align=4)  # fmt: skip
            sf1_shape = [p + "w1", p + "k"] if transpose else [p + "k", p + "w1"]
            sf1_strides = [p + "o1a", p + "o1b"]
            sf1 = b.tensor((len(ranks) + i, 1), torch.int32, [*groups, *sf1_shape],
                           strides=[p + "o1g", *sf1_strides][3 - rank :], align=4)  # fmt: skip
            # sf1 as (G, k, words): transposed when the buffer itself was given
            b.let(p + "o1r", sf1_strides[1] if transpose else sf1_strides[0])
            b.let(p + "o1w", sf1_strides[0] if transpose else sf1_strides[1])
            if rank == 2:  # unsqueeze(0) of the (rows, words) views
                b.let(p + "o0g", f"{p}n * {p}o0r")
                b.let(p + "o1g", f"{p}k * {p}o1r")
        else:  # weight_sf_layout / sf1_layout: MN-major views of (G?, words, rows) buffers
            strides0 = [f"{p}w0 * {p}n", "one", p + "n"][3 - rank :]
            sf0 = b.alloc(torch.int32, [*groups, p + "w0", p + "n"], view=([*groups, p + "n", p + "w0"], strides0))
            if transpose:  # the (G?, w1, k) buffer itself
                sf1 = b.alloc(torch.int32, [*groups, p + "w1", p + "k"])
            else:
                strides1 = [f"{p}w1 * {p}k", "one", p + "k"][3 - rank :]
                sf1 = b.alloc(torch.int32, [*groups, p + "w1", p + "k"], view=([*groups, p + "k", p + "w1"], strides1))
            # the (G, rows, words) views' strides; unsqueeze(0) of a (rows, words) one: rows * 1
            b.let(p + "o0g", f"{p}w0 * {p}n" if rank == 3 else p + "n")
            b.let(p + "o0r", "one")
            b.let(p + "o0w", p + "n")
            b.let(p + "o1g", f"{p}w1 * {p}k" if rank == 3 else p + "k")
            b.let(p + "o1r", "one")
            b.let(p + "o1w", p + "k")
        results.append((s, sf0, sf1))
    bad = b.alloc(torch.int32, ("one",))
    b.zero(bad, 4)
    for i, (s, sf0, sf1) in enumerate(results):
        p = f"w{i}_"
        for out, rows, words, cols, o, (sr, sc) in (
            (sf0, "n", "w0", "kb", "o0", ("sr", "sc")), (sf1, "k", "w1", "nb", "o1", ("sc", "sr"))
        ):  # fmt: skip
            b.launch(
                kernel, device, SF=s, OUT=out, BAD=bad, num_words_total=f"{p}g * {p}{rows} * {p}{words}", rows=p + rows,
                words=p + words, cols=p + cols, shift="shift", in_stride_g=p + "sg", in_stride_r=p + sr,
                in_stride_c=p + sc, out_stride_g=f"{p}{o}g", out_stride_r=f"{p}{o}r", out_stride_w=f"{p}{o}w",
            )  # fmt: skip
    if given_outs:
        for _, sf0, sf1 in results:
            b.bump(sf0)
            b.bump(sf1)
    b.returns((tuple((sf0, sf1) for _, sf0, sf1 in results), bad))
    return b.build()


def transform(s: torch.Tensor, block_size: int, transpose: bool, out, kernels=_KERNELS, bad=None):
    """One weight's (sf0, sf1) (checked arguments): two launches, which set bad[0] (an int32
    tensor; a new zeroed one if None) on a bad scale. `kernels`: the loader's table, or a
    stand-in with the same call (tests run the kernel's C++ on the CPU through one)."""
    bad = s.new_zeros((1,), dtype=torch.int32) if bad is None else bad
    groups = s.shape[0] if s.dim() == 3 else None
    nb, kb = s.shape[-2:]
    sf0, sf1 = (None, None) if out is None else out
    if sf0 is None:
        sf0 = weight_sf_layout(nb * block_size, kb, groups, s.device)
    if sf1 is None:
        sf1 = sf1_layout(nb, kb * block_size, groups, transpose, s.device)
    # The kernel writes (G, rows, words) views: sf0 and sf1's (k, words) orientation.
    sf1_rows = sf1.transpose(-1, -2) if transpose else sf1
    if groups is None:
        s, sf0_rows, sf1_rows = s.unsqueeze(0), sf0.unsqueeze(0), sf1_rows.unsqueeze(0)
    else:
        sf0_rows = sf0
    _launch(s, sf0_rows, block_size, False, kernels, bad)
    _launch(s, sf1_rows, block_size, True, kernels, bad)
    return sf0, sf1
