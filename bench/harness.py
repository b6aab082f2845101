"""Timing helpers shared by the benchmarks (GPU only).

Kernel time: CUDA events around each call, warm-up first, median of many repetitions,
inputs rotated across buffers larger than the H200's 60 MB L2 so no repetition reads
from cache. Host time: wall clock over a CPU-bound loop of tiny calls.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import time
from pathlib import Path

import torch

L2_BYTES = 60 * 2**20


def rotation_count(bytes_per_input: int) -> int:
    """How many distinct input sets keep the rotation above 4x the L2 (at least 2)."""
    return max(2, -(-4 * L2_BYTES // max(bytes_per_input, 1)))


def time_gpu(fn, inputs: list, warmup: int = 5, reps: int = 50) -> dict:
    """Median and spread (us) of fn(*inputs[i % len(inputs)]) timed with CUDA events."""
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(*inputs[i % len(inputs)])
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1e3 for s, e in events)
    return {
        "median_us": statistics.median(times),
        "p20_us": times[len(times) // 5],
        "p80_us": times[4 * len(times) // 5],
    }


def time_back_to_back(fn, inputs: list, calls: int = 200) -> float:
    """us per call for `calls` consecutive eager calls between two events: host overhead
    shows here whenever a call costs more host time than its kernel takes."""
    for i in range(5):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(calls):
        fn(*inputs[i % len(inputs)])
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def time_graph(fn, inputs: list, reps: int = 50) -> float:
    """Median us per call when the calls are replayed from one captured CUDA graph."""
    for args in inputs:  # warm-up (loads kernels) outside capture
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in inputs:
            fn(*args)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(inputs))
    return statistics.median(times)


def kernel_us(fn, inputs: list, calls: int = 50) -> float:
    """GPU time per call as the sum of its kernels' own durations (CUPTI activity records through
    torch.profiler), no gaps between them: the original's harness's measure (tilelang's do_bench
    with backend='cupti', ../shared/spec/testing.md 4.3). Mean over `calls` calls on rotated inputs."""
    for args in inputs[:3]:
        fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
        torch.cuda.synchronize()
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in device) / calls


def host_us_per_call(fn, args, calls: int = 200, rounds: int = 15) -> float:
    """CPU time per call (us) of a tight loop of calls, best of `rounds`: each round starts on an
    idle GPU and stops the clock when the last call returns, before synchronising. 200 calls (of
    up to 4 launches each) stay below the driver's queue of pending launches, so a call never
    waits for the GPU: what is timed is the host's work, even for ops whose kernels take longer
    than their host work at this shape (host_time.py gives their GPU time beside)."""
    for _ in range(20):
        fn(*args)
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        best = min(best, (time.perf_counter() - start) * 1e6 / calls)
    torch.cuda.synchronize()
    return best


def compile_cubin(cu: Path) -> str:
    """Tuning builds (the build host): nvcc a lowered kernel (cu, as aot.lower_one wrote it) to the
    .cubin beside it, for sm_90a, as the wheel build compiles; returns ptxas' registers / spills line."""
    import subprocess

    import tilelang

    tl = os.path.dirname(tilelang.__file__)
    r = subprocess.run(
        ["nvcc", "--cubin", "-O3", "-std=c++20", "-w", f"-I{tl}/src", f"-I{tl}/3rdparty/cutlass/include",
         "-gencode", "arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-o", str(cu.with_suffix(".cubin")), str(cu)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return "; ".join(ln.split(":", 1)[-1].strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln)


def copy_bandwidth_gbs(nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy (bytes read + bytes written per second): the memory ceiling."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    t = time_gpu(lambda: dst.copy_(src), [()], warmup=3, reps=20)["median_us"]
    return 2 * nbytes / t / 1e3


def results_dir() -> Path:
    """bench/results/<date>-<gpu>/, or $OUT/<same> on the device machine."""
    gpu = torch.cuda.get_device_name().replace(" ", "-")
    name = f"{datetime.date.today().isoformat()}-{gpu}"
    base = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).parent / "results"
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def environment() -> dict:
    return {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")
