"""Keeps the benchmark honest without a GPU: it imports, enumerates the ops from the
manifest, and every op has a case with the fields the runner needs."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_every_manifest_op_has_a_benchmark_case():
    bench, cases = load("bench"), load("cases")
    ops = bench.manifest_ops()
    assert ops, "the manifest lists no ops"
    missing = [op for op in ops if op not in cases.CASES]
    assert not missing, f"ops without a benchmark case in bench/cases.py: {missing}"
    for op in ops:
        for make_case in cases.CASES[op]:
            case = make_case(cases.TOKENS[0], cases.HIDDEN[0])
            assert case["op"] == op and callable(case["make"]) and callable(case["fn"]) and callable(case["ref"])
            assert case["bytes"] > 0


def test_every_public_op_has_a_host_time_case():
    """bench/host_time.py times every public function that launches work (issue 14's table),
    and each of its calls is a valid call: run here on CPU tensors (the references)."""
    import tilebake

    host_time = load("host_time")
    host_time.DEVICE = "cpu"
    cases = host_time.cases()
    families = (tilebake.quant, tilebake.moe, tilebake.engram, tilebake.mhc, tilebake.transform, tilebake.rand)
    public = {name for m in families for name in m.__all__}
    missing = sorted(public - host_time.NOT_OPS - set(cases))
    assert not missing, f"public ops without a host-time case in bench/host_time.py: {missing}"
    for name, calls in cases.items():
        assert any(calls), name
        for call in calls:
            if call is not None:
                call()
