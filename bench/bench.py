"""The benchmark: every op the installed wheel contains, at the shapes users run (GPU only).

    python bench/bench.py [--ops per_token_cast,cast_back] [--shapes 16384x7168,...] [--no-compile] [--name bench]

For each op (enumerated from the manifest; bench/cases.py holds one case per op) and each
(tokens, hidden) of cases.TOKENS x cases.HIDDEN, measured in the same run: tilebake eager
(median of CUDA-event-timed calls), back-to-back eager calls, CUDA-graph replay, the
plain-torch reference and torch.compile of it, and achieved GB/s against the same run's
device-to-device copy. Then the host time of every public op at T=1, allocating and with its
outputs given (bench/host_time.py), beside torch.mul(out=), and cold
start in a fresh process. Writes bench/results/<date>-<gpu>/bench.{json,md,png}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cases  # noqa: E402
import harness  # noqa: E402
import host_time  # noqa: E402

import tilebake  # noqa: E402
from tilebake._runtime import loader  # noqa: E402


def manifest_ops() -> list[str]:
    return sorted({per_arch[next(iter(per_arch))]["op"] for per_arch in loader.manifest()["kernels"].values()})


def same_bytes(a, b) -> bool:
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(la) == len(lb) and all(
        x.shape == y.shape
        and x.dtype == y.dtype
        # reshape(-1): a dense 1-D view (or copy) whatever the strides, which view(uint8) needs.
        and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        for x, y in zip(la, lb)
    )


def measure(case: dict, copy_gbs: float, compiled_ref) -> dict:
    one = case["make"]()
    bytes_per_input = sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(one))
    inputs = [one] + [case["make"]() for _ in range(harness.rotation_count(bytes_per_input) - 1)]
    row = {k: case[k] for k in ("op", "variant", "bytes")}
    # Checked once per variant: bytes, or the case's own tolerance check where reductions differ.
    row["output_matches_reference"] = case.get("check", same_bytes)(case["fn"](*one), case["ref"](*one))
    eager = harness.time_gpu(case["fn"], inputs)
    row["eager_us"] = eager["median_us"]
    row["eager_p20_p80_us"] = [eager["p20_us"], eager["p80_us"]]
    row["back_to_back_us"] = harness.time_back_to_back(case["fn"], inputs)
    row["graph_us"] = harness.time_graph(case["fn"], inputs[:4])
    row["reference_us"] = harness.time_gpu(case["ref"], inputs, reps=10)["median_us"]
    if compiled_ref is not None:
        row["compiled_reference_us"] = harness.time_gpu(compiled_ref, inputs, warmup=3, reps=20)["median_us"]
        row["speedup_vs_compiled_reference"] = row["compiled_reference_us"] / row["eager_us"]
    for key in ("eager", "back_to_back", "graph"):
        gbs = case["bytes"] / row[f"{key}_us"] / 1e3
        row[f"{key}_gbs"] = gbs
        row[f"{key}_pct_copy"] = 100 * gbs / copy_gbs
    return row


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
print(json.dumps({"import_ms": 1e3 * (t1 - t0), "first_quant_call_ms": 1e3 * (t2 - t1),
                  "import_plus_first_quant_call_ms": 1e3 * (t2 - t0)}))
"""


def cold_start() -> dict:
    """In a fresh process, after torch and CUDA are initialised: import + first call (median of 5)."""
    runs = [
        json.loads(
            subprocess.run([sys.executable, "-c", COLD_START], capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(5)
    ]
    return {k: sorted(r[k] for r in runs)[2] for k in runs[0]}


COLUMNS = (
    "op",
    "variant",
    "T x H",
    "eager us",
    "eager GB/s",
    "% copy",
    "back-to-back GB/s",
    "graph GB/s",
    "torch ref us",
    "torch.compile ref us",
    "vs compile",
    "bytes match ref",
)


def markdown(rows, copy_gbs, host, cold, env) -> str:
    nan = float("nan")
    lines = [
        f"# tilebake benchmark: {env['gpu']}, {env['date']}, torch {env['torch']}",
        "",
        f"Command: `python {' '.join(sys.argv)}`. Device-to-device copy (read + write) in the same run: "
        f"**{copy_gbs:.0f} GB/s**.",
        "GB/s counts each input read once and each output written once. eager: median of event-timed single calls;",
        "back-to-back: many eager calls between two events (host cost shows here); graph: CUDA-graph replay.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        cells = [
            r["op"],
            r["variant"],
            f"{r['shape'][0]} x {r['shape'][1]}",
            f"{r['eager_us']:.1f}",
            f"{r['eager_gbs']:.0f}",
            f"{r['eager_pct_copy']:.1f}",
            f"{r['back_to_back_gbs']:.0f}",
            f"{r['graph_gbs']:.0f}",
            f"{r['reference_us']:.1f}",
            f"{r.get('compiled_reference_us', nan):.1f}",
            f"{r.get('speedup_vs_compiled_reference', nan):.2f}x",
            "yes" if r["output_matches_reference"] else "NO",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if not (host and cold):
        return "\n".join(lines) + "\n"
    lines += [
        "",
        *host_time.markdown(host),
        "",
        f"Cold start, fresh process after `import torch` and CUDA init (median of 5): import tilebake "
        f"{cold['import_ms']:.1f} ms, first per_token_cast {cold['first_quant_call_ms']:.1f} ms, together "
        f"{cold['import_plus_first_quant_call_ms']:.1f} ms.",
    ]
    return "\n".join(lines) + "\n"


def chart(rows, copy_gbs, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['op']}\n{r['variant'].split(',')[-1].strip()}\n{r['shape'][0]}x{r['shape'][1]}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rows)), 5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["eager_gbs"] for r in rows], 0.4, label="tilebake (eager)")
    ax.bar(
        [x + 0.2 for x in xs],
        [r["bytes"] / r["compiled_reference_us"] / 1e3 if "compiled_reference_us" in r else 0 for r in rows],
        0.4,
        label="torch.compile(reference)",
    )
    ax.axhline(copy_gbs, color="k", linestyle="--", label=f"device copy {copy_gbs:.0f} GB/s")
    ax.set_xticks(list(xs), labels, fontsize=6, rotation=90)
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", help="comma-separated subset of the manifest's ops")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile of the references")
    parser.add_argument("--shapes", help="comma-separated TxH subset, e.g. 16384x7168,4096x7168")
    parser.add_argument("--name", default="bench", help="result file stem (default: bench)")
    args = parser.parse_args()
    ops = manifest_ops()
    missing = [op for op in ops if op not in cases.CASES]
    if missing:
        sys.exit(f"bench: no benchmark case for {missing} (add them to bench/cases.py)")
    if args.ops:
        ops = [op for op in ops if op in args.ops.split(",")]

    shapes = [(t, h) for t in cases.TOKENS for h in cases.HIDDEN]
    if args.shapes:
        shapes = [tuple(int(n) for n in shape.split("x")) for shape in args.shapes.split(",")]

    env = harness.environment()
    copy_gbs = harness.copy_bandwidth_gbs()
    rows, failures = [], []
    out = harness.results_dir()
    for op in ops:
        for make_case in cases.CASES[op]:
            for num_tokens, hidden in shapes:
                case = make_case(num_tokens, hidden)
                # One static-shape compile per shape: the reference's best case (a dynamic-shape
                # compile measured 4.6x slower for per_token_cast at 16384 x 7168 on the H200).
                compiled_ref = None
                if num_tokens >= 4096 and not args.no_compile:
                    torch._dynamo.reset()
                    compiled_ref = torch.compile(case["ref"], dynamic=False)
                try:
                    row = measure(case, copy_gbs, compiled_ref)
                except Exception as e:  # one broken case must not cost the whole run its results
                    failures.append(f"{op} {case['variant']} {num_tokens}x{hidden}: {type(e).__name__}: {e}")
                    print("FAILED", failures[-1], flush=True)
                    torch.cuda.synchronize()
                    continue
                row["shape"] = (num_tokens, hidden)
                rows.append(row)
                # The rows so far, in case the run is cut short (the device has a time limit).
                harness.write_json(out / f"{args.name}.partial.json", {"environment": env, "rows": rows})
                print(
                    f"{op:16s} {row['variant']:45s} {num_tokens:6d} x {hidden:5d}: {row['eager_us']:8.1f} us "
                    f"{row['eager_gbs']:6.0f} GB/s ({row['eager_pct_copy']:5.1f}% of copy), back-to-back "
                    f"{row['back_to_back_gbs']:6.0f} GB/s",
                    flush=True,
                )
    host, cold = {}, {}
    try:
        host = host_time.measure()
        cold = cold_start()
    except Exception as e:  # the rows above are still worth writing out
        failures.append(f"host cost / cold start: {type(e).__name__}: {e}")
    harness.write_json(
        out / f"{args.name}.json",
        {
            "environment": env,
            "command": " ".join(sys.argv),
            "copy_gbs": copy_gbs,
            "rows": rows,
            "host": host,
            "cold_start": cold,
            "failures": failures,
        },
    )
    text = markdown(rows, copy_gbs, host, cold, env)
    if failures:
        text += "\n## Cases that failed\n\n" + "".join(f"- {f}\n" for f in failures)
    (out / f"{args.name}.md").write_text(text)
    chart(rows, copy_gbs, out / f"{args.name}.png")
    (out / f"{args.name}.partial.json").unlink()
    print(text)
    if failures:
        sys.exit(f"{len(failures)} benchmark case(s) failed:\n" + "\n".join(failures))


if __name__ == "__main__":
    main()
