"""Benchmark of the quant ops on a GPU: achieved bandwidth against the same run's copy
bandwidth, CUDA-graph replay, the plain-torch reference and torch.compile of it, and
host cost per call beside torch.mul(out=).

    python bench/bench_quant.py            # writes bench/results/<date>-<gpu>/quant.{json,md}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import tilebake  # noqa: E402

SHAPES = [(16384, 7168), (4096, 7168), (4096, 4096), (128, 7168), (1, 7168)]


def per_token_cast_case(num_tokens, hidden):
    def make():
        return (torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16),)

    nbytes = num_tokens * hidden * (2 + 1) + num_tokens * (hidden // 128) * 4
    return {
        "op": "per_token_cast",
        "variant": "bf16->e4m3, 1x128, fp32 SF",
        "make": make,
        "fn": lambda x: tilebake.quant.per_token_cast(x, "e4m3", 128),
        "ref": lambda x: tilebake.torch.cast(x, "e4m3", (1, 128)),
        "bytes": nbytes,
    }


def per_token_cast_packed_case(num_tokens, hidden):
    case = per_token_cast_case(num_tokens, hidden)
    case.update(
        variant="bf16->e4m3, 1x128, UE8M0 packed col-major SF",
        fn=lambda x: tilebake.quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True, round_sf=True,
                                                   use_packed_ue8m0=True),
        ref=lambda x: tilebake.torch.cast(x, "e4m3", (1, 128), use_tma_aligned_col_major_sf=True, round_sf=True,
                                          use_packed_ue8m0=True),
        bytes=num_tokens * hidden * 3 + num_tokens * (hidden // 512) * 4,
    )
    return case


def cast_back_case(num_tokens, hidden):
    def make():
        x = torch.randn(num_tokens, hidden, device="cuda").to(torch.bfloat16)
        return (tilebake.quant.per_token_cast(x, "e4m3", 128),)

    return {
        "op": "cast_back",
        "variant": "e4m3 1x128 fp32 SF -> bf16",
        "make": make,
        "fn": lambda q: tilebake.quant.cast_back(q, "bf16", (1, 128)),
        "ref": lambda q: tilebake.torch.cast_back(q, "e4m3", (1, 128)),
        "bytes": num_tokens * hidden * (1 + 2) + num_tokens * (hidden // 128) * 4,
    }


CASES = [per_token_cast_case, per_token_cast_packed_case, cast_back_case]


def measure(case, copy_gbs, with_compile: bool) -> dict:
    one = case["make"]()
    bytes_per_input = sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(one))
    inputs = [one] + [case["make"]() for _ in range(harness.rotation_count(bytes_per_input) - 1)]
    row = {k: case[k] for k in ("op", "variant", "bytes")}
    eager = harness.time_gpu(case["fn"], inputs)
    row["eager_us"] = eager["median_us"]
    row["eager_p20_p80_us"] = [eager["p20_us"], eager["p80_us"]]
    row["back_to_back_us"] = harness.time_back_to_back(case["fn"], inputs)
    row["graph_us"] = harness.time_graph(case["fn"], inputs[:4])
    row["reference_us"] = harness.time_gpu(case["ref"], inputs, reps=10)["median_us"]
    if with_compile:
        compiled = torch.compile(case["ref"])
        row["compiled_reference_us"] = harness.time_gpu(compiled, inputs, warmup=3, reps=20)["median_us"]
    for key in ("eager", "back_to_back", "graph"):
        gbs = case["bytes"] / row[f"{key}_us"] / 1e3
        row[f"{key}_gbs"] = gbs
        row[f"{key}_pct_copy"] = 100 * gbs / copy_gbs
    if with_compile:
        row["speedup_vs_compiled_reference"] = row["compiled_reference_us"] / row["eager_us"]
    return row


def host_cost() -> dict:
    x = torch.randn(1, 7168, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    mul = harness.host_us_per_call(lambda: torch.mul(x, 2, out=y), ())
    cast = harness.host_us_per_call(lambda: tilebake.quant.per_token_cast(x, "e4m3", 128), ())
    q = tilebake.quant.per_token_cast(x, "e4m3", 128)
    back = harness.host_us_per_call(lambda: tilebake.quant.cast_back(q, "bf16", (1, 128)), ())
    # Where the host time goes: the same call with preallocated outputs, the two
    # allocations alone, and the bare launch through the loader.
    cast_out = harness.host_us_per_call(lambda: tilebake.quant.per_token_cast(x, "e4m3", 128, out=q), ())
    alloc = harness.host_us_per_call(
        lambda: (x.new_empty((1, 7168), dtype=torch.float8_e4m3fn), x.new_empty((1, 56), dtype=torch.float32)), ())
    kernel = sys.modules["tilebake.quant.per_token_cast"]._KERNELS["bf16", 128, False, False]
    d, s = q
    launch = harness.host_us_per_call(
        lambda: kernel(0, x.data_ptr(), d.data_ptr(), s.data_ptr(), 1e-4, 1, 7168, 7168, 7168, 56, 1), ())
    return {"torch_mul_out_us": mul, "per_token_cast_us": cast, "per_token_cast_ratio": cast / mul,
            "cast_back_us": back, "cast_back_ratio": back / mul, "per_token_cast_out_us": cast_out,
            "two_allocations_us": alloc, "bare_launch_us": launch}


COLD_START = r"""
import json, time, torch
x = torch.randn(128, 7168, device="cuda").to(torch.bfloat16)
torch.cuda.synchronize()
t0 = time.perf_counter()
import tilebake
t1 = time.perf_counter()
q = tilebake.quant.per_token_cast(x, "e4m3", 128)
torch.cuda.synchronize()
t2 = time.perf_counter()
tilebake.quant.cast_back(q, "bf16", (1, 128))
torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps({"import_ms": 1e3 * (t1 - t0), "first_per_token_cast_ms": 1e3 * (t2 - t1),
                  "first_cast_back_ms": 1e3 * (t3 - t2), "import_plus_first_call_ms": 1e3 * (t2 - t0)}))
"""


def cold_start() -> dict:
    """In a fresh process, after torch and CUDA are initialised: import + first calls."""
    import subprocess

    runs = [json.loads(subprocess.run([sys.executable, "-c", COLD_START], capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for _ in range(3)]
    return {k: sorted(r[k] for r in runs)[1] for k in runs[0]}  # median of 3


def markdown(rows, copy_gbs, host, env, cold) -> str:
    lines = [
        f"# quant benchmark: {env['gpu']}, {env['date']}, torch {env['torch']}",
        "",
        f"Device-to-device copy (read + write): **{copy_gbs:.0f} GB/s**. Command: `python bench/bench_quant.py`.",
        "",
        "| op | variant | T x H | eager us | GB/s | % copy | back-to-back GB/s | graph GB/s | torch ref us | torch.compile ref us | vs compile |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['op']} | {r['variant']} | {r['shape'][0]} x {r['shape'][1]} | {r['eager_us']:.1f} | {r['eager_gbs']:.0f} | "
            f"{r['eager_pct_copy']:.1f} | {r['back_to_back_gbs']:.0f} | {r['graph_gbs']:.0f} | {r['reference_us']:.1f} | "
            f"{r.get('compiled_reference_us', float('nan')):.1f} | {r.get('speedup_vs_compiled_reference', float('nan')):.2f}x |"
        )
    lines += [
        "",
        f"Host cost per public call at T=1 (wall clock, CPU-bound loop): torch.mul(x, 2, out=y) {host['torch_mul_out_us']:.2f} us; "
        f"per_token_cast {host['per_token_cast_us']:.2f} us ({host['per_token_cast_ratio']:.2f}x); "
        f"cast_back {host['cast_back_us']:.2f} us ({host['cast_back_ratio']:.2f}x).",
        f"Breakdown: per_token_cast with out= {host['per_token_cast_out_us']:.2f} us; its two output allocations alone "
        f"{host['two_allocations_us']:.2f} us; the bare loader launch {host['bare_launch_us']:.2f} us.",
        "",
        f"Cold start (fresh process, after `import torch` and CUDA init, median of 3): import tilebake "
        f"{cold['import_ms']:.1f} ms; first per_token_cast {cold['first_per_token_cast_ms']:.1f} ms; "
        f"import + first call {cold['import_plus_first_call_ms']:.1f} ms; first cast_back {cold['first_cast_back_ms']:.1f} ms.",
    ]
    return "\n".join(lines) + "\n"


def main():
    with_compile = "--no-compile" not in sys.argv
    env = harness.environment()
    copy_gbs = harness.copy_bandwidth_gbs()
    rows = []
    for make_case in CASES:
        for shape in SHAPES:
            row = measure(make_case(*shape), copy_gbs, with_compile and shape[0] >= 4096)
            row["shape"] = shape
            rows.append(row)
            print(f"{row['op']:16s} {shape}: {row['eager_us']:.1f} us, {row['eager_gbs']:.0f} GB/s "
                  f"({row['eager_pct_copy']:.1f}% of copy), back-to-back {row['back_to_back_gbs']:.0f} GB/s", flush=True)
    host = host_cost()
    cold = cold_start()
    out = harness.results_dir()
    harness.write_json(out / "quant.json", {"environment": env, "copy_gbs": copy_gbs, "rows": rows, "host": host,
                                            "cold_start": cold})
    text = markdown(rows, copy_gbs, host, env, cold)
    (out / "quant.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
