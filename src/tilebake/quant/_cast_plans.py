"""Call plans (tilebake/_runtime/plan.py) of the cast ops: per_token_cast (+ _with_sf_only,
_with_precomputed_sf), per_block_cast (the same three), per_channel_cast and cast.

Each builder is the op's CUDA Python path for one call key as a plan: the same checks (some
stricter: those calls take the Python path), allocations, kernel arguments and returned
structure. The ops build them after a launch succeeded (every argument validated by then) and
pass what the key fixes (dtypes, formats, SF mode, the amax clamp) in.
"""

from __future__ import annotations

import torch

from tilebake._runtime import plan




_DATA = {"e4m3": (torch.float8_e4m3fn, "H"), "e2m1": (torch.int8, "H // 2")}  # fmt -> dtype, columns


def _rows(b: plan.Builder, dtype: torch.dtype, hidden_multiple: int = 16):
    """x (T, H) as check_rows wants it (last dim contiguous, rows 16 bytes apart), 16-byte
    aligned as the launch checks; T >= 1 (an empty problem goes to the Python path)."""
    x = b.tensor(0, dtype, ("T", "H"), strides=("xs", 1))
    b.check(f"T >= 1 and H >= 1 and H % {hidden_multiple} == 0 and (T == 1 or xs % {16 // dtype.itemsize} == 0)")
    return x


def _data_out(b: plan.Builder, arg, fmt: str, row_bytes: int):
    """The quantized data (T, H) e4m3 or (T, H/2) packed int8: args[arg] with rows `row_bytes`
    apart, aligned so and not overlapping (check_out_data, check_packed_rows, the launch's
    alignment check), or allocated contiguous (arg None). Binds ds, its row stride."""
    dtype, cols = _DATA[fmt]
    if arg is None:
        b.let("ds", cols)
        return b.alloc(dtype, ("T", cols))
    data = b.tensor(arg, dtype, ("T", cols), strides=("ds", 1), align=row_bytes)
    b.check(f"T == 1 or (ds % {row_bytes} == 0 and ds >= {cols})")
    return data


def _sf_out(b: plan.Builder, arg, dtype: torch.dtype, rows: str, cols: str, col_major: bool):
    """SF (rows, cols): args[arg] as check_out_sf_layout takes it, or allocated as alloc_sf
    (and per_token_cast's e4m3 SF) lays it out (arg None). Binds st, sg (its strides)."""
    size = dtype.itemsize
    if arg is None:
        if col_major:  # a (cols, rows padded to 16 bytes) buffer, handed out as its transposed view
            pad = 16 // size
            b.let("sg", f"({rows} + {pad - 1}) // {pad} * {pad}")
            b.let("st", 1)
            return b.alloc(dtype, (cols, "sg"), view=((rows, cols), (1, "sg")))
        b.let("st", cols)
        b.let("sg", 1)
        return b.alloc(dtype, (rows, cols))
    if col_major:  # TMA-aligned column-major, columns 16 bytes apart, the data 16-byte aligned
        sf = b.tensor(arg, dtype, (rows, cols), strides=(1, "sg"))
        b.check(f"{cols} == 1 or (sg % {16 // size} == 0 and sg >= {rows})")
        b.let("st", 1)
        return sf
    # row-major rows apart, or column-major columns apart: no two SF at one address
    sf = b.tensor(arg, dtype, (rows, cols), strides=("st", "sg"), align=size)
    b.check(f"(sg == 1 and ({rows} == 1 or st >= {cols})) or (st == 1 and ({cols} == 1 or sg >= {rows}))")
    return sf


# --- per_token_cast ---

CAST, SF_ONLY, PRECOMPUTED = "cast", "sf_only", "precomputed"  # the three public functions


def per_token_plan(kernel, device, dtype, fmt, npc, sf_dtype, packed, col_major, given, clamp, form=CAST, sf_mode=0,
                   stochastic=0):  # fmt: skip
    """One per_token_cast kernel's call. form CAST: run(x, out) -> (data, sf), out (data, sf)
    given or None; SF_ONLY: run(x, out_sf) -> sf; PRECOMPUTED: run(x, sf, out) -> data, sf an
    fp32 (T, G) input with unit column stride. sf_dtype, packed: the SF's dtype and whether it
    is UE8M0 packed 4 to an int32 (its strides then in bytes); sf_mode, stochastic: the 'rne'
    and 'runtime' kernels' arguments (the hot kernels have none)."""
    b = plan.Builder()
    x = _rows(b, dtype)
    b.let("G", f"(H + {npc - 1}) // {npc}")
    b.let("C", "(G + 3) // 4" if packed else "G")
    data = None
    if form == PRECOMPUTED:
        sf = b.tensor(1, torch.float32, ("T", "G"), strides=("st", "sg"), align=4)
        b.check("G == 1 or sg == 1")
        data = _data_out(b, 2 if given else None, fmt, 16 if fmt == "e4m3" else 8)
    elif form == SF_ONLY:
        sf = _sf_out(b, 1 if given else None, sf_dtype, "T", "C", col_major)
    else:
        data = _data_out(b, (1, 0) if given else None, fmt, 16 if fmt == "e4m3" else 8)
        sf = _sf_out(b, (1, 1) if given else None, sf_dtype, "T", "C", col_major)
    unit = 4 if packed else 1  # packed SF strides are in bytes
    params = dict(
        X=x, Y=data, S=sf, amax_clamp=clamp, num_tokens="T", hidden="H", x_stride="xs",
        y_stride="ds" if data is not None else 0, sf_stride_t=f"st * {unit}", sf_stride_g=f"sg * {unit}",
    )  # fmt: skip
    flavour = kernel.variant.sf_mode
    if flavour in ("rne", "runtime"):
        params.update(SB=sf, SE=sf, sf_mode=sf_mode)
    if flavour == "runtime":
        params.update(store_data=int(data is not None), stochastic=stochastic)
    b.launch(kernel, device, **params)
    written = {CAST: (data, sf), SF_ONLY: (sf,), PRECOMPUTED: (data,)}[form]
    if given:
        for ref in written:
            b.bump(ref)
    b.returns(written if form == CAST else written[0])
    return b.build()


# --- per_block_cast ---


def per_block_plan(kernel, device, dtype, fmt, bm, bk, packed, col_major, given, clamp, mode, round_sf, form=CAST):
    """One per_block_cast kernel's call (mode: the kernel's cast / SF only / precomputed SF);
    form and the arguments as per_token_plan's, the SF (ceil(T/bm), ceil(H/bk)) (a precomputed
    one fp32 at any strides), addressed in bytes."""
    b = plan.Builder()
    x = _rows(b, dtype, 32 if fmt == "e2m1" else 16)  # e2m1 rows of H / 2 bytes stay 16-byte aligned
    b.let("R", f"(T + {bm - 1}) // {bm}")
    b.let("G", f"(H + {bk - 1}) // {bk}")
    b.let("C", "(G + 3) // 4" if packed else "G")
    data = None
    if form == PRECOMPUTED:
        sf = b.tensor(1, torch.float32, ("R", "G"), strides=("st", "sg"), align=4)
        data = _data_out(b, 2 if given else None, fmt, 16)
    elif form == SF_ONLY:
        sf = _sf_out(b, 1 if given else None, torch.int32 if packed else torch.float32, "R", "C", col_major)
    else:
        data = _data_out(b, (1, 0) if given else None, fmt, 16)
        sf = _sf_out(b, (1, 1) if given else None, torch.int32 if packed else torch.float32, "R", "C", col_major)
    b.launch(
        kernel, device, X=x, Y=x if data is None else data, S=sf, amax_clamp=clamp, mode=mode,
        round_sf=int(round_sf), packed_sf=int(packed), sf_stride_m="st * 4", sf_stride_k="sg * 4",
        num_tokens="T", hidden="H", x_stride="xs", y_stride=0 if data is None else "ds",
    )  # fmt: skip
    written = {CAST: (data, sf), SF_ONLY: (sf,), PRECOMPUTED: (data,)}[form]
    if given:
        for ref in written:
            b.bump(ref)
    b.returns(written if form == CAST else written[0])
    return b.build()


# --- per_channel_cast (a plain input) and cast (stochastic rounding) ---


def per_channel_plan(kernel, device, dtype, npt, round_sf, packed, clamp):
    """run(x) -> (data e4m3 (T, H), sf fp32 (ceil(T/npt), H) or packed int32 (ceil(../4), H))."""
    b = plan.Builder()
    x = _rows(b, dtype)
    b.let("R", f"(T + {npt - 1}) // {npt}")
    data = b.alloc(torch.float8_e4m3fn, ("T", "H"))
    sf = b.alloc(torch.int32, ("(R + 3) // 4", "H")) if packed else b.alloc(torch.float32, ("R", "H"))
    b.launch(
        kernel, device, X=x, Y=data, S32=sf, S8=sf, amax_clamp=clamp, round_sf=int(round_sf), packed_sf=int(packed),
        num_tokens="T", hidden="H", x_stride="xs",
    )  # fmt: skip
    b.returns((data, sf))
    return b.build()


def stochastic_cast_plan(kernel, device, dtype, out_dtype, ndim):
    """run(x) -> x cast to out_dtype: x contiguous (the standard strides) of rank ndim, 16-byte
    aligned, numel a multiple of 4 in [4, 2^31)."""
    b = plan.Builder()
    sizes = [f"n{d}" for d in range(ndim)]
    strides = [" * ".join(sizes[d + 1 :]) or 1 for d in range(ndim)]
    x = b.tensor(0, dtype, sizes, strides=strides)
    b.let("N", " * ".join(sizes))
    b.check("N >= 4 and N % 4 == 0 and N < 2147483648")
    y = b.alloc(out_dtype, sizes)
    b.launch(kernel, device, X=x, Y=y, num_groups="N // 4")
    b.returns(y)
    return b.build()
