"""moe_topk_gate_forward: time kernel candidates at the benchmark shape and check them bit for bit.

python bench/gate_candidates.py build OUT [NAME...]  # build host: lower + nvcc the CANDIDATES (sm_90a)
python bench/gate_candidates.py run OUT [OLD_DIR]    # GPU, with the wheel under test installed

`run` times the installed op's kernel and every OUT/sm_90a/*.cubin (and OLD_DIR's, e.g. the
kernels of an earlier build, which take the same arguments) on the case of bench/cases.py (16384
tokens, 256 experts, top-8, sqrtsoftplus, bias): bare launches over rotated inputs replayed from
a CUDA graph, three interleaved rounds, the best median of each. Then every candidate against
the installed op over the options (same indices, weights, unmapped_topk_idx, score bits), and
the installed op against OLD_DIR's sqrtsoftplus / softmax / sigmoid kernels (the same, except the
scores rows that now read 0).
"""

import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = {  # stem suffix -> build keyword arguments of kernels_tl/moe/moe_topk_gate_forward.build
    "w4": dict(warps=4),
    "w4_select": dict(warps=4, select_softplus=True),
    "w4_t2": dict(warps=4, tpw=2),
    "w4_t4": dict(warps=4, tpw=4),
    "w4_t2_select": dict(warps=4, tpw=2, select_softplus=True),
    "w4_t4_select": dict(warps=4, tpw=4, select_softplus=True),
    "w4_t2_b9": dict(warps=4, tpw=2, min_blocks=9),
    "w4_t2_select_b9": dict(warps=4, tpw=2, select_softplus=True, min_blocks=9),
    "w4_select_b12": dict(warps=4, select_softplus=True, min_blocks=12),
    "w2_t4": dict(warps=2, tpw=4),
    "w8_t2": dict(warps=8, tpw=2),
}
T, E, K = 16384, 256, 8


def build(out: Path, *only):

    sys.path[:0] = [str(ROOT / "build_tools"), str(ROOT), str(ROOT / "src")]
    import aot
    import harness

    from tilebake.moe.moe_topk_gate_forward import MoeTopkGateForwardVariant

    v = MoeTopkGateForwardVariant("sqrtsoftplus", 256)
    for name, kwargs in CANDIDATES.items():
        if only and name not in only:
            continue
        stem = f"{v.id}.{name}"
        aot.lower_one(v, "sm_90a", out, build_kwargs=kwargs, stem=stem)
        harness.compile_cubin(out / "sm_90a" / f"{stem}.cu")
        print("built", stem, flush=True)


class _Raw:
    """A cubin launched with the op's argument list (tilebake.moe.moe_topk_gate_forward._KERNELS order)."""

    def __init__(self, cubin: Path, launcher, loader, arg_names):
        import torch

        meta = json.loads(cubin.with_suffix(".json").read_text())
        self.smem = int(meta["dynamic_smem"])
        self.handle = launcher.load(cubin.read_bytes(), meta["entry"], 0, self.smem)
        params = [p["name"] for p in meta["params"]]
        self.sig = "".join(p["kind"] for p in meta["params"]).encode()
        self.grid = loader._compile_grid(meta["grid"], tuple(arg_names), cubin.name)
        self.block = tuple(int(b) for b in meta["block"])
        self.pick = [arg_names.index(n) for n in params]
        self.launcher, self.torch = launcher, torch

    def __call__(self, device, *args):
        a = tuple(args[i] for i in self.pick)
        stream = self.torch.cuda.current_stream().cuda_stream
        self.launcher.launch(self.handle, self.grid(*args), self.block, self.smem, stream, self.sig, a)


class _Table(dict):
    """The op's kernel table stand-in: every key gets the kernel of its scoring function."""

    def __init__(self, by_func):
        super().__init__()
        self.by_func = by_func

    def __missing__(self, key):
        return self.by_func[key[0]]


class _Capture(dict):
    """A kernel table stand-in that records the launch arguments instead of launching."""

    def __missing__(self, key):
        return lambda device, *args: self.__setitem__("args", args)


def _call(kernels, logits, k, use_shared, num_shared, func, opts, scores=None, groups=(1, 1)):
    from tilebake.moe import moe_topk_gate_forward as op
    from tilebake.moe._router import check_gate_args

    names = ("mask", "bias", "image_bias", "image_token_mask", "fix_routing_mask", "to_physical_map",
             "logical_count", "unmapped_topk_idx", "force_random")  # fmt: skip
    t = [opts.get(n) for n in names]
    sizes = check_gate_args(logits, k, use_shared, num_shared, 1.5, 3, func, *t, None, scores, *groups)
    mod = importlib.import_module("tilebake.moe.moe_topk_gate_forward")
    if kernels is None:
        return op(logits, k, use_shared, num_shared, 1.5, 3, func, *t, None, scores, num_groups=groups[0],
                  num_topk_groups=groups[1])  # fmt: skip
    return mod._forward(logits, k, use_shared, num_shared, 1.5, 3, func, *t, None, scores, *groups, *sizes,
                        kernels=kernels)  # fmt: skip


def _graph_us(kern, launches, reps=20):
    """us per launch, median over `reps` replays of one CUDA graph of every input's launch."""
    import torch

    for args, _ in launches:
        kern(0, *args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args, _ in launches:
            kern(0, *args)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(launches))
    return sorted(times)[len(times) // 2]


def _same(a, b):
    """Same indices, weights, unmapped_topk_idx and scores bits (NaN included)."""
    import torch

    return all(
        (x is None and y is None) or torch.equal(x.view(torch.int32) if x.dtype == torch.float32 else x,
                                                 y.view(torch.int32) if y.dtype == torch.float32 else y)
        for x, y in zip(a, b)
    )  # fmt: skip


def _run_config(kern, logits, opts, k, sh, func, groups):
    import torch

    o = {m: (x.clone() if m == "unmapped_topk_idx" else x) for m, x in opts.items()}
    scores = torch.empty(logits.shape, device=logits.device)
    idx, w = _call(kern, logits, k, sh > 0, sh, func, o, scores, groups)
    return idx, w, o.get("unmapped_topk_idx"), scores


def run(out: Path, old_dir: str = ""):
    import torch

    sys.path[:0] = [str(ROOT / "bench"), str(ROOT)]
    import harness

    from tests.moe.gate_forward_helpers import ALL, make_options, unscored_rows
    from tilebake._runtime import loader

    launcher = loader._native()
    mod = importlib.import_module("tilebake.moe.moe_topk_gate_forward")
    arg_names = list(mod.MoeTopkGateForwardVariant("sqrtsoftplus", 256).arg_names)
    copy = harness.copy_bandwidth_gbs()
    print(f"copy {copy:.0f} GB/s", flush=True)
    bias = torch.randn(E, device="cuda") * 0.1
    inputs = [(torch.randn(T, E, device="cuda"), bias) for _ in range(harness.rotation_count(T * E * 4))]
    nbytes = T * E * 4 + T * K * 12
    # Each input's kernel arguments (pointers into its own outputs), captured from the op's own
    # argument code: the timed launches are bare, and replayed from CUDA graphs.
    launches = []
    for x, b in inputs:
        cap = _Capture()
        outs = mod._forward(x, K, False, 0, 2.5, 0, "sqrtsoftplus", None, b, *[None] * 7, None, None, 1, 1, T, E, K, 0,
                            kernels=cap)  # fmt: skip
        launches.append((cap["args"], outs))
    kernels = {"installed op's kernel": mod._KERNELS[("sqrtsoftplus", 256)]}
    cubins = sorted((out / "sm_90a").glob("*sqrtsoftplus*.cubin"))
    if old_dir:
        cubins += sorted(Path(old_dir).glob("*sqrtsoftplus*.cubin"))
    for cubin in cubins:
        kernels[cubin.name] = _Raw(cubin, launcher, loader, arg_names)
    want = tilebake_op(inputs[0])
    best = {}
    for _ in range(3):  # interleaved rounds: the minimum of each kernel's medians
        for name, kern in kernels.items():
            us = _graph_us(kern, launches)
            best[name] = min(best.get(name, us), us)
    for name, kern in kernels.items():
        kern(0, *launches[0][0])
        torch.cuda.synchronize()
        same = all(torch.equal(p, q) for p, q in zip(launches[0][1], want))
        gbs = nbytes / best[name] / 1e3
        print(
            f"{name:82s} {best[name]:6.1f} us {gbs:6.0f} GB/s {100 * gbs / copy:5.1f}% {'same' if same else 'DIFFERS'}"
        )
    # Every candidate against the installed op over the options (the candidates are sqrtsoftplus, <= 256 experts).
    cand = {n: _Table({"sqrtsoftplus": k}) for n, k in kernels.items() if n.endswith(".cubin") and "max_experts" in n}
    differ = {n: 0 for n in cand}
    for n_tok, e, k, sh, groups in ((2049, 256, 8, 2, (1, 1)), (1025, 256, 8, 0, (8, 4)), (999, 72, 6, 1, (1, 1)),
                                    (300, 33, 5, 0, (1, 1)), (129, 256, 32, 0, (1, 1))):  # fmt: skip
        for which in (set(), {"bias"}, ALL, ALL - {"fix"}):
            opts = make_options(n_tok, e, k, sh, which, device="cuda")
            logits = torch.randn(n_tok, e, device="cuda") * 2
            logits[::97, 1] = float("nan")
            ref = _run_config(None, logits, opts, k, sh, "sqrtsoftplus", groups)
            for n, kern in cand.items():
                differ[n] += not _same(_run_config(kern, logits, opts, k, sh, "sqrtsoftplus", groups), ref)
    for n, d in differ.items():
        print(f"candidate equivalence {n}: {d} of 20 configurations differ", flush=True)
    if not old_dir:
        return
    old = _Table({f: _Raw(Path(old_dir) / f"moe_topk_gate_forward.scoring_func-{f}.cubin", launcher, loader,
                          arg_names) for f in ("sqrtsoftplus", "softmax", "sigmoid")})  # fmt: skip
    bad = 0
    for func in ("sqrtsoftplus", "softmax", "sigmoid"):
        for n, e, k, sh, groups in (
            (8001, 256, 8, 2, (1, 1)),
            (4097, 256, 8, 0, (8, 4)),
            (999, 72, 6, 1, (1, 1)),
            (777, 512, 32, 0, (1, 1)),
            (513, 512, 16, 2, (32, 4)),
            (300, 33, 5, 0, (1, 1)),
        ):
            for which in (set(), {"bias"}, ALL, ALL - {"fix"}):
                opts = make_options(n, e, k, sh, which, device="cuda")
                logits = torch.randn(n, e, device="cuda") * 2
                logits[::97, 1] = float("nan")
                a = _run_config(None, logits, opts, k, sh, func, groups)
                b = list(_run_config(old, logits, opts, k, sh, func, groups))
                b[3] = torch.where(unscored_rows(opts, n).cuda()[:, None], 0.0, b[3])  # the rows that now read 0
                ok = _same(a, b)
                bad += not ok
                if not ok:
                    print("DIFFERS from the old kernel:", func, n, e, k, sh, groups, sorted(which), flush=True)
    print(f"old-kernel equivalence: {bad} of 72 configurations differ", flush=True)


def tilebake_op(inp):
    import tilebake

    x, b = inp
    return tilebake.moe.moe_topk_gate_forward(x, K, False, 0, 2.5, 0, bias=b)


if __name__ == "__main__":
    {"build": build, "run": run}[sys.argv[1]](Path(sys.argv[2]), *sys.argv[3:])
