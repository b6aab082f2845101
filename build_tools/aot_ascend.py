"""The Ascend 950 ahead-of-time driver: TileLang source -> AscendC + launch metadata (stage 1, any
host, no CANN) -> .aibin binaries (stage 2, CANN's bisheng and ld.lld) -> manifest.

  aot_ascend.py list                       Ascend variant ids and the repository files their
                                           lowering reads (as aot.py list)
  aot_ascend.py lower ID... --out DIR      stage 1: DIR/dav-3510/ID.asc + ID.json
  aot_ascend.py compile ID... --out DIR    stage 2: DIR/dav-3510/ID.aibin (needs CANN: see find_cann)
  aot_ascend.py cann                       the CANN toolkit's version, or what is missing (exit 1)
  aot_ascend.py manifest --out DIR [--stage1-only]
                                           DIR/manifest.json + DIR/ops/<op>.json; --stage1-only
                                           writes it without binaries (for inspection, never shipped)

The launch metadata is read from the lowered IR (../shared/notes/ascend_aot.md): the entry symbol,
the device parameters in the kernel's own order (buffers by name, then scalars by name: not the
PrimFunc's), the block count (blockIdx.x, the variant's vector-core count) and the unified-buffer
bytes. Built and inspected here; nothing here has run on an NPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from build_tools.aot import ROOT, check_params, kernel_sources, sources_sha256, variants_by_id  # noqa: E402

ARCH = "dav-3510"  # Ascend 950: the one NPU tilelang 0.1.15's Ascend backend targets
UB_LIMIT = 216 * 1024  # a vector core's unified buffer with SIMT regions (248 KiB without)
# What the host call appends (a kernel with no unified buffer: only the block count; 0 UB bytes).
LAUNCH_PARAMS = ["blockIdx.x", "tirx.use_dyn_shared_memory"]


def lower_one(v, out_dir: Path) -> dict:
    """Lower `v` into out_dir/ARCH/<id>.{asc,json}; returns the metadata."""
    import importlib

    import tilelang
    import tilelang.ascend.debug
    from tilelang import tvm
    from tvm.target import Target

    from tilebake._variants import PARAM_DTYPES

    # Keep T.device_assert: tilelang drops it when no NPU is visible at import (the note).
    tilelang.ascend.debug._IS_ASCEND_AVAILABLE = True
    source = importlib.import_module(v.kernel_module())
    target = Target({"kind": "ascend", "arch": ARCH})  # explicit: "auto" picks ascend only on an NPU
    with tvm.transform.PassContext(opt_level=3, config=getattr(source, "PASS_CONFIGS", {})), target:
        artifact = tilelang.lower(source.build(v), target=target)
    kernels = [f for _, f in artifact.device_mod.functions.items() if f.attrs.get("tirx.is_global_func")]
    if len(kernels) != 1:
        raise SystemExit(f"aot_ascend: {v.id} lowered to {len(kernels)} device kernels; one is supported")
    func = kernels[0]
    code = artifact.kernel_source
    if str(ROOT) in code:  # a device assert's message with the build tree's path: not reproducible
        raise SystemExit(f"aot_ascend: {v.id}'s source names the build tree {ROOT}; use no_stack_info=True")
    params = []
    for p in func.params:
        if str(p.dtype) not in PARAM_DTYPES:
            raise SystemExit(f"aot_ascend: {v.id} parameter {p.name} has dtype {p.dtype}")
        params.append({"name": p.name, "kind": PARAM_DTYPES[str(p.dtype)]})
    check_params(v, params)
    if [str(a) for a in func.attrs["tirx.kernel_launch_params"]] not in (LAUNCH_PARAMS, LAUNCH_PARAMS[:1]):
        raise SystemExit(f"aot_ascend: {v.id} launch parameters {func.attrs['tirx.kernel_launch_params']}")
    extents = func.attrs["thread_extent"]
    blocks, ub = extents.get("blockIdx.x"), func.attrs.get("dyn_shared_memory_buf", 0)
    if not isinstance(blocks, (int, tvm.tirx.IntImm)) or int(blocks) != v.num_vec_cores:
        raise SystemExit(f"aot_ascend: {v.id} has {blocks} blocks; the variant declares {v.num_vec_cores}")
    if not isinstance(ub, (int, tvm.tirx.IntImm)) or not 0 <= int(ub) <= UB_LIMIT:
        raise SystemExit(f"aot_ascend: {v.id} asks for {ub} unified-buffer bytes; constant, at most {UB_LIMIT}")
    meta = {
        "id": v.id,
        "op": v.op,
        "family": v.family,
        "key": {f.name: getattr(v, f.name) for f in dataclasses.fields(v)},
        "backend": "ascend",
        "arch": ARCH,
        "entry": str(func.attrs["global_symbol"]),
        "params": params,
        "block_dim": int(blocks),
        "ub_bytes": int(ub),
    }
    arch_dir = out_dir / ARCH
    arch_dir.mkdir(parents=True, exist_ok=True)
    (arch_dir / f"{v.id}.asc").write_text(code)
    (arch_dir / f"{v.id}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def cmd_list(args):
    variants = variants_by_id(args.ops, backend="ascend")
    sources = {}
    for vid, v in variants.items():
        sources.setdefault(v.op, ",".join(kernel_sources(v)))
        print(f"{vid}|{sources[v.op]}")


def cmd_lower(args):
    known = variants_by_id(backend="ascend")
    start = time.time()
    for i, vid in enumerate(args.ids):
        if vid not in known:
            raise SystemExit(f"aot_ascend: unknown variant {vid!r}; `aot_ascend.py list` prints them")
        digest = sources_sha256(kernel_sources(known[vid]))  # before lowering: edits show as stale
        meta = lower_one(known[vid], Path(args.out))
        path = Path(args.out) / ARCH / f"{vid}.json"
        path.write_text(json.dumps({**meta, "source_sha256": digest}, indent=1) + "\n")
        print(f"[{i + 1}/{len(args.ids)}] lowered {vid}", flush=True)
    print(f"aot_ascend: lowered {len(args.ids)} variant(s) in {time.time() - start:.1f}s")


def find_cann() -> tuple[dict, str]:
    """({'bisheng', 'ld.lld', 'version'}, '') of the CANN toolkit on this host, or ({}, what is
    missing). bisheng from BISHENG_HOME/bin or PATH; ld.lld beside it or under the toolkit."""
    bisheng = shutil.which("bisheng", path=os.path.join(os.environ.get("BISHENG_HOME", ""), "bin")) or shutil.which(
        "bisheng"
    )
    if not bisheng:
        return {}, (
            "CANN's bisheng compiler (set BISHENG_HOME or put it on PATH: a CANN 9.1+ toolkit for the "
            "Ascend 950, e.g. the quay.io/ascend/cann 950 images)"
        )
    homes = [Path(bisheng).parent] + [
        Path(os.environ[k]) for k in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME") if k in os.environ
    ]
    lld = next((str(p) for h in homes for p in (h / "ld.lld", *h.glob("**/ld.lld")) if p.is_file()), None)
    if not lld:
        return {}, f"ld.lld (the CCE linker) beside {bisheng} or under ASCEND_HOME_PATH"
    version = "unknown"
    for home in homes:
        info = next(iter(home.glob("**/version.cfg")), None) or next(iter(home.glob("**/version.info")), None)
        if info:
            version = info.read_text(errors="replace").strip().splitlines()[0]
            break
    return {"bisheng": bisheng, "ld.lld": lld, "version": version}, ""


def cmd_cann(args):
    """Configure-time check (backends/ascend/CMakeLists.txt): prints the toolkit's version, or
    what is missing (exit 1)."""
    cann, missing = find_cann()
    if not cann:
        print(f"missing {missing}")
        raise SystemExit(1)
    print(cann["version"])


def cmd_compile(args):
    """Stage 2: every .asc -> .aibin, exactly the two commands tilelang runs (the note)."""
    cann, missing = find_cann()
    if not cann:
        raise SystemExit(f"aot_ascend: stage 2 needs {missing}; stage 1 (`lower`, `manifest --stage1-only`) does not")
    import importlib.util

    # tilelang's tl_templates headers, found without importing tilelang (and torch: seconds a variant)
    include = Path(importlib.util.find_spec("tilelang").origin).parent / "src"
    arch_dir = Path(args.out) / ARCH
    for vid in args.ids:
        obj, binary = arch_dir / f"{vid}.rel.o", arch_dir / f"{vid}.aibin"
        subprocess.run(
            [
                cann["bisheng"],
                "-O2",
                "-fPIC",
                "-std=c++20",
                "-mllvm",
                "-cce-aicore-dcpreload-args=false",
                f"--npu-arch={ARCH}",
                f"-I{include}",
                "--cce-aicore-only",
                str(arch_dir / f"{vid}.asc"),
                "-o",
                str(obj),
            ],
            check=True,
        )
        subprocess.run(
            [cann["ld.lld"], "-m", "aicorelinux", "-Ttext", "0", "--no-mmap-output-file", str(obj), "-o", str(binary)],
            check=True,
        )
        obj.unlink()
    (arch_dir / "cann_version.txt").write_text(cann["version"] + "\n")


def cmd_manifest(args):
    import importlib.metadata

    from tilebake import __version__ as tilebake_version
    from tilebake._runtime.loader import MANIFEST_VERSION

    out, arch_dir = Path(args.out), Path(args.out) / ARCH
    by_op, digests = {}, {}
    for vid, v in variants_by_id(args.ops, backend="ascend").items():
        digests.setdefault(v.op, sources_sha256(kernel_sources(v)))
        meta = json.loads((arch_dir / f"{vid}.json").read_text())
        if meta.get("source_sha256") != digests[v.op]:
            raise SystemExit(
                f"aot_ascend: {vid} was lowered from other sources than the repository's now: lower it again"
            )
        binary = arch_dir / f"{vid}.aibin"
        if args.stage1_only:
            meta["binary"], meta["sha256"] = None, None
        elif not binary.is_file():
            raise SystemExit(f"aot_ascend: {binary} is missing: run `aot_ascend.py compile` (stage 2) first")
        else:
            meta["binary"], meta["sha256"] = f"{ARCH}/{binary.name}", hashlib.sha256(binary.read_bytes()).hexdigest()
        by_op.setdefault(v.op, {})[vid] = {ARCH: meta}
    cann = arch_dir / "cann_version.txt"
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "package": "tilebake-ascend",
        "tilebake_version": tilebake_version,
        "backends": {"ascend": {"archs": [ARCH]}},
        "tilelang_version": importlib.metadata.version("tilelang"),
        "cann_version": None if args.stage1_only or not cann.is_file() else cann.read_text().strip(),
        "stage1_only": bool(args.stage1_only),
        "partial_build_ops": sorted(filter(None, args.ops.split(","))) or None,
        "ops": sorted(by_op),
    }
    ops_dir = out / "ops"
    shutil.rmtree(ops_dir, ignore_errors=True)
    ops_dir.mkdir(parents=True)
    for op, kernels in by_op.items():
        text = json.dumps(
            {"manifest_version": MANIFEST_VERSION, "op": op, "kernels": kernels}, separators=(",", ":"), sort_keys=True
        )
        (ops_dir / f"{op}.json").write_text(text + "\n")
    (out / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"aot_ascend: manifest with {sum(map(len, by_op.values()))} variants of {len(by_op)} ops")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list")
    p.add_argument("--ops", default="")
    p.set_defaults(fn=cmd_list)
    sub.add_parser("cann").set_defaults(fn=cmd_cann)
    for name, fn in (("lower", cmd_lower), ("compile", cmd_compile)):
        p = sub.add_parser(name)
        p.add_argument("ids", nargs="+", metavar="ID")
        p.add_argument("--out", required=True)
        p.set_defaults(fn=fn)
    p = sub.add_parser("manifest")
    p.add_argument("--out", required=True)
    p.add_argument("--ops", default="")
    p.add_argument("--stage1-only", action="store_true")
    p.set_defaults(fn=cmd_manifest)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
