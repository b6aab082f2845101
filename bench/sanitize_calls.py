"""Every compiled variant under compute-sanitizer, cheaply: record the GPU tests' own calls, then
replay the small ones in one sanitized process (bench/sanitize.sh).

Running the whole GPU suite under a sanitizer is slow (torch's reference kernels get instrumented
too) and, with each tensor its own cudaMalloc so that a read past a tensor's end is caught, it ran
the H200 out of memory. Instead:

  record   the GPU tests run normally with this module as a pytest plugin and
           TILEBAKE_RECORD_CALLS=DIR: each call of a public op of tilebake.quant / moe / transform /
           engram / mhc whose tensors' storages total at most 32 MiB is snapshotted before it runs
           (whole storages, so strided views and shared buffers come back as they were; the
           runtime config too); a snapshot is kept when it gives a variant it launched one of its
           RECORDS_PER_VARIANT smallest distinct calls. Call plans are turned off so that every
           launch passes through loader.Kernel.__call__, which names the variants a call ran.
               TILEBAKE_RECORD_CALLS=DIR PYTHONPATH=bench:... python3 -m pytest -p sanitize_calls -m gpu tests
  replay   python3 bench/sanitize_calls.py replay DIR [--variant-log FILE]: the kept calls, per
           variant its smallest ones, each tensor restored into its own allocation (run it with
           PYTORCH_NO_CUDA_MEMORY_CACHING=1), synchronised after each call; prints what each call
           raised (nothing should) and writes the variants loaded (for sanitize_report.py).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
import threading
from pathlib import Path

import torch

FAMILIES = ("quant", "moe", "transform", "engram", "mhc")
RECORD_LIMIT_BYTES = 32 << 20
RECORDS_PER_VARIANT = 3
_local = threading.local()


# --- snapshots: nested args with each tensor as ("__tensor__", storage index, view) ---


def _storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes(), str(t.device))


def snapshot(args, kwargs, copy: bool = True):
    """(structure, storages, bytes): args and kwargs with tensors replaced by references into a list
    of CPU copies of their storages (each shared storage once); copy=False: the storages themselves
    (the signature and size of a call, before deciding to copy it)."""
    storages, index = [], {}

    def walk(x):
        if isinstance(x, torch.Tensor):
            key = _storage_key(x)
            if key not in index:
                index[key] = len(storages)
                storages.append((x.untyped_storage(), x.device))
            view = (x.dtype, tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.requires_grad)
            return ("__tensor__", index[key], view)
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # named tuples
            return ("__named__", type(x), [walk(v) for v in x])
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x

    structure = walk((args, kwargs))
    nbytes = sum(s.nbytes() for s, _ in storages)
    if copy:
        storages = [copy_storage(s, device) for s, device in storages]
    return structure, storages, nbytes


def copy_storage(storage, device: torch.device):
    """A storage's bytes on the CPU, and its device type."""
    raw = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
    return raw.to("cpu", copy=True), device.type  # (a CPU storage too: the op may write into it)


def restore(structure, storages, device: str = "cuda"):
    """The args and kwargs of a snapshot, each storage in a fresh allocation on `device` (CUDA
    storages; CPU ones stay on the CPU)."""
    live = [raw.to(device if kind == "cuda" else "cpu") for raw, kind in storages]

    def walk(x):
        if isinstance(x, tuple) and len(x) == 3 and x[0] == "__tensor__":
            raw = live[x[1]]
            dtype, shape, stride, offset, requires_grad = x[2]
            t = torch.empty(0, dtype=dtype, device=raw.device).set_(raw.untyped_storage(), offset, shape, stride)
            return t.requires_grad_() if requires_grad else t
        if isinstance(x, tuple) and len(x) == 3 and x[0] == "__named__":
            return x[1](*(walk(v) for v in x[2]))
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        return x

    return walk(structure)


def signature(structure) -> str:
    """A call's shapes, strides, dtypes and options, as text (identical calls: one snapshot)."""
    return repr(structure)[:4000]


# --- recording ---


def _config_state() -> dict:
    from tilebake import config

    return {"amax_clamp": dict(config._amax_clamp), "token_alignment": config._token_alignment,
            "num_sms": config._num_sms, "deterministic": config._deterministic}  # fmt: skip


def _set_config(state: dict) -> None:
    from tilebake import config

    config.reset_runtime_config()
    for (fmt, e4m3_sf), value in state["amax_clamp"].items():
        config.set_amax_clamp_for_quant(fmt, e4m3_sf, value)
    config.set_token_alignment(state["token_alignment"])
    if state["num_sms"] is not None:
        config.set_num_sms(state["num_sms"])
    config.use_deterministic_algorithms(state["deterministic"])


class Recorder:
    def __init__(self, out: Path):
        self.out = out
        self.out.mkdir(parents=True, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        self.prefix = worker
        self.index_path = out / f"index_{worker}.json"
        self.seen: set[tuple[str, str]] = set()
        self.kept: dict[str, list] = {}  # variant -> [(bytes, signature, file)]
        self.count = 0
        self.lock = threading.Lock()

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            if getattr(_local, "depth", 0) or _capturing():
                return fn(*args, **kwargs)  # nested in another recorded call, or a graph capture
            snap = self._snapshot_if_new(name, args, kwargs)
            _local.depth, _local.launched = 1, []
            try:
                result = fn(*args, **kwargs)
            finally:
                launched, _local.depth, _local.launched = _local.launched, 0, []
            if snap is not None and launched:
                self._keep(name, snap, sorted(set(launched)))
            return result

        return recorded

    def _snapshot_if_new(self, name, args, kwargs):
        if not _has_cuda((args, kwargs)):
            return None
        structure, storages, nbytes = snapshot(args, kwargs, copy=False)
        key = (name, signature(structure))
        with self.lock:
            if key in self.seen or nbytes > RECORD_LIMIT_BYTES:
                return None
            self.seen.add(key)
        try:
            storages = [copy_storage(s, device) for s, device in storages]
        except RuntimeError:  # e.g. a storage this process cannot copy
            return None
        return structure, storages, nbytes, key[1]

    def _keep(self, name, snap, variants):
        structure, storages, nbytes, sig = snap
        with self.lock:
            wanted = [v for v in variants if self._improves(v, nbytes, sig)]
            if not wanted:
                return
            self.count += 1
            path = self.out / f"{self.prefix}_{self.count}.pt"
            call = {"fn": name, "structure": structure, "storages": storages, "config": _config_state(),
                    "variants": variants, "bytes": nbytes}  # fmt: skip
            try:
                torch.save(call, path)
            except Exception:  # an argument that does not pickle: no record
                path.unlink(missing_ok=True)
                return
            for v in wanted:
                entries = sorted([*self.kept.get(v, []), (nbytes, sig, path.name)])
                self.kept[v] = entries[:RECORDS_PER_VARIANT]
            self.index_path.write_text(json.dumps(self.kept))

    def _improves(self, variant, nbytes, sig) -> bool:
        entries = self.kept.get(variant, [])
        if any(s == sig for _, s, _ in entries):
            return False
        return len(entries) < RECORDS_PER_VARIANT or nbytes < entries[-1][0]


def _capturing() -> bool:
    """A CUDA graph capture or a torch.compile trace: no snapshot (no host copy may run there)."""
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _has_cuda(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.is_cuda
    if isinstance(x, (list, tuple)):
        return any(_has_cuda(v) for v in x)
    if isinstance(x, dict):
        return any(_has_cuda(v) for v in x.values())
    return False


def _public_functions():
    """(family package, name, function) of every public op."""
    for family in FAMILIES:
        package = importlib.import_module(f"tilebake.{family}")
        for name in package.__all__:
            fn = getattr(package, name)
            if inspect.isfunction(fn):  # (not QuantTensor, a type alias)
                yield package, name, fn


def _count_launches():
    from tilebake._runtime import loader

    call = loader.Kernel.__call__

    def counted(self, device_index, *args):
        launched = getattr(_local, "launched", None)
        if launched is not None:
            launched.append(self.variant.id)
        return call(self, device_index, *args)

    loader.Kernel.__call__ = counted


def install(out: Path) -> Recorder:
    from tilebake._runtime import plan

    plan.available = lambda: False  # every launch through Kernel.__call__ (plans launch natively)
    _count_launches()
    recorder = Recorder(out)
    for package, name, fn in _public_functions():
        setattr(package, name, recorder.wrap(f"{package.__name__}.{name}", fn))
    return recorder


def pytest_configure(config):
    out = os.environ.get("TILEBAKE_RECORD_CALLS")
    if out:
        install(Path(out))


# --- replay ---


def choose(out: Path) -> list[Path]:
    """Per variant its RECORDS_PER_VARIANT smallest distinct calls over every worker's index, in
    rounds (every variant's smallest first: a replay stopped by a time limit has covered the most)."""
    best: dict[str, list] = {}
    for index in sorted(out.glob("index_*.json")):
        for variant, entries in json.loads(index.read_text()).items():
            best.setdefault(variant, []).extend(entries)
    per_variant = []
    for entries in best.values():
        picked, sigs = [], set()
        for nbytes, sig, name in sorted(entries):
            if sig not in sigs and len(picked) < RECORDS_PER_VARIANT:
                sigs.add(sig)
                picked.append((nbytes, name))
        per_variant.append(picked)
    order, chosen = [], set()
    for r in range(RECORDS_PER_VARIANT):
        for nbytes, name in sorted(p[r] for p in per_variant if len(p) > r):
            if name not in chosen:
                chosen.add(name)
                order.append(out / name)
    return order


def replay(out: Path, variant_log: Path | None, device: str = "cuda") -> int:
    import tilebake  # noqa: F401  (the packages the records name)
    from tilebake._runtime import loader

    files = choose(out)
    failures = 0
    for path in files:
        call = torch.load(path, weights_only=False)
        module, _, name = call["fn"].rpartition(".")
        fn = getattr(importlib.import_module(module), name)
        _set_config(call["config"])
        args, kwargs = restore(call["structure"], call["storages"], device)
        try:
            fn(*args, **kwargs)
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:  # a recorded call ran in the tests: it must run here too
            failures += 1
            print(f"FAILED {path.name} {call['fn']}: {type(e).__name__}: {str(e)[:300]}")
        del args, kwargs
        if variant_log:  # after each call: a run stopped by its time limit keeps its coverage
            variant_log.write_text("".join(f"{v}\n" for v in sorted(loader.loaded_variants)))
    print(f"replayed {len(files)} recorded calls ({failures} raised); {len(loader.loaded_variants)} variants loaded")
    return 1 if failures else 0


def main(argv):
    if len(argv) < 2 or argv[0] != "replay":
        print(__doc__)
        return 2
    log = Path(argv[argv.index("--variant-log") + 1]) if "--variant-log" in argv else None
    return replay(Path(argv[1]), log)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
