"""Each variant declares its kernel's parameters once (Variant.params()); the build compares the
lowered IR with that declaration and fails on any difference, naming the variant and it."""

import dataclasses
import importlib.util

import pytest

from build_tools import aot
from tilebake._registry import all_variants
from tilebake._variants import PARAM_DTYPES, Param
from tilebake.quant.cast import CastVariant


def test_every_declaration_is_well_formed():
    """Unique names of known dtypes, for every variant the build lowers (and launches)."""
    for v in all_variants():
        params = v.params()
        names = [p.name for p in params]
        assert names and len(set(names)) == len(names), v.id
        assert all(isinstance(p, Param) and p.dtype in PARAM_DTYPES for p in params), v.id
        assert v.arg_names == tuple(names)


def _lowered(v, **changes):
    """The manifest's parameter list of a kernel that takes exactly what `v` declares, in the IR's
    order (pointers, then scalars, by name), with `changes` {name: kind letter or None (dropped)}."""
    params = [{"name": p.name, "kind": PARAM_DTYPES[p.dtype]} for p in v.params()]
    params = [{**p, "kind": changes.get(p["name"], p["kind"])} for p in params if changes.get(p["name"], 1)]
    params += [{"name": n, "kind": k} for n, k in changes.items() if k and n not in v.arg_names]
    return sorted(params, key=lambda p: (p["kind"] != "p", p["name"]))


def test_check_params_accepts_the_declaration_in_any_order():
    v = CastVariant("fp32", "bf16")
    aot.check_params(v, _lowered(v))
    aot.check_params(v, _lowered(v)[::-1])


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"num_groups": None}, "the kernel has no parameter 'num_groups'"),
        ({"extra": "i"}, "the kernel takes 'extra' (int32), which is not declared"),
        ({"num_groups": "l"}, "'num_groups' is declared int32, the kernel takes int64"),
        ({"Y": "f"}, "'Y' is declared handle, the kernel takes float32"),
    ],
)
def test_check_params_names_the_variant_and_the_difference(changes, message):
    v = CastVariant("fp32", "bf16")
    with pytest.raises(SystemExit) as info:
        aot.check_params(v, _lowered(v, **changes))
    text = str(info.value)
    assert text.startswith(f"aot: {v.id}: the lowered kernel's parameters differ from CastVariant.params()")
    assert message in text, text


@dataclasses.dataclass(frozen=True)
class _MisdeclaredCast(CastVariant):
    """cast's variant with a wrong declaration: a name the kernel does not take, one dtype wrong."""

    def params(self):
        return (Param("X", "handle"), Param("Out", "handle"), Param("num_groups", "int64"))


@pytest.mark.skipif(importlib.util.find_spec("tilelang") is None, reason="lowering needs tilelang (a build dependency)")
def test_lowering_fails_on_a_mismatching_declaration(tmp_path):
    """Through aot.py's own lowering (what every build runs for every variant): the true
    declaration lowers; a wrong one stops the build with the differences."""
    good = CastVariant("fp32", "bf16")
    aot.lower_one(good, "sm_90a", tmp_path)
    assert (tmp_path / "sm_90a" / f"{good.id}.json").exists()
    with pytest.raises(SystemExit) as info:
        aot.lower_one(_MisdeclaredCast("fp32", "bf16"), "sm_90a", tmp_path / "bad")
    text = str(info.value)
    assert f"aot: {good.id}: the lowered kernel's parameters differ from _MisdeclaredCast.params()" in text
    assert "the kernel has no parameter 'Out'" in text
    assert "the kernel takes 'Y' (handle), which is not declared" in text
    assert "'num_groups' is declared int64, the kernel takes int32" in text
    assert not (tmp_path / "bad").exists()  # nothing written for the failed variant


def test_per_token_cast_picks_one_built_kernel_per_call():
    """variant_key, the one place the op chooses a kernel flavour: every combination of a call's
    options maps to a built variant, and the flavours are those the launches were written for."""
    import importlib
    import itertools

    op = importlib.import_module("tilebake.quant.per_token_cast")  # the package exports the function

    built = {dataclasses.astuple(v) for v in op.PerTokenCastVariant.all()}
    modes = (op.SF_PLAIN, op.SF_ROUND, op.SF_UE8M0, op.SF_E4M3, op.SF_PRECOMPUTED)
    for in_dtype, fmt, mode, store, stochastic in itertools.product(
        ("bf16", "fp32", "e4m3", "e2m1"), op.FMTS, modes, (0, 1), (0, 1)
    ):
        key = op.variant_key(in_dtype, fmt, 32, mode, store, stochastic)
        assert key in built, key
        plain, lean = in_dtype in ("bf16", "fp32"), store and not stochastic
        if plain and lean and fmt == "e4m3" and mode in (op.SF_PLAIN, op.SF_ROUND, op.SF_UE8M0):
            assert key[3] == ("fp32", "round", "ue8m0")[mode]
        elif plain and lean and fmt == "e2m1" and mode != op.SF_PRECOMPUTED:
            assert key[3] == "rne"
        else:
            assert key[3] == "runtime"
