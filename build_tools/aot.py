"""The ahead-of-time driver: TileLang source -> CUDA C++ + launch metadata -> manifest.

CMake calls it in three roles (see CMakeLists.txt):

  aot.py list                         variant ids, their bundles and the repository files their
                                      lowering imports
  aot.py lower ID... --out DIR --arch A
                                      lower variants for each arch A: DIR/A/ID.cu + DIR/A/ID.json,
                                      and their ops' bundles DIR/A/BUNDLE.cu (bundle.py)
  aot.py manifest --out DIR ...       hash the cubins and write DIR/manifest.json (build facts, op
                                      list) and DIR/ops/<op>.json (that op's kernels)

CMake lowers all variants of one op in one process (importing tilelang costs twice as much
as lowering a kernel). nvcc runs between `lower` and `manifest`, one command per (bundle, arch),
so ninja parallelises and a rebuild redoes only what changed. Everything the runtime loader
needs is read from the lowered IR here (../shared/notes/tilelang_aot.md), never assumed.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from build_tools.bundle import bundle_entry, bundles, write_bundle  # noqa: E402

LAUNCH_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


def variants_by_id(ops: str = "", backend: str = "cuda"):
    """Every declared variant of `backend`, or (a developer's partial build) those of the
    comma-separated `ops`."""
    from tilebake._registry import all_variants

    wanted = {op for op in ops.split(",") if op}
    variants = [v for v in all_variants(backend) if not wanted or v.op in wanted]
    unknown = wanted - {v.op for v in variants}
    if unknown:
        raise SystemExit(f"aot: TILEBAKE_OPS names unknown ops {sorted(unknown)}")
    return {v.id: v for v in variants}


# Top-level packages of the repository and the directory each lives under (sys.path above).
REPO_PACKAGES = {"tilebake": ROOT / "src", "kernels_tl": ROOT}


def module_file(name: str) -> Path | None:
    """The repository file of module `name` (a package: its __init__.py); None outside the
    repository (tilelang, torch, the standard library) or where no such file exists."""
    base = REPO_PACKAGES.get(name.split(".")[0])
    if base is None:
        return None
    path = base.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path) -> str:
    """The dotted name of a repository file (inverse of module_file)."""
    rel = path.relative_to(ROOT / "src" if path.is_relative_to(ROOT / "src") else ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def import_nodes(tree: ast.AST, into_functions: bool):
    """The import statements of `tree`, those inside function bodies only if `into_functions`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif into_functions or not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += ast.iter_child_nodes(node)


@functools.cache
def imported_files(path: Path) -> tuple[Path, ...]:
    """The repository files that importing `path` runs at lowering time: the modules its import
    statements name, the packages above each (their __init__.py runs first), and the names of
    `from pkg import name` that are submodules. In kernels_tl/ (build-time code, whose factories
    run when lowering) every import statement counts; in src/tilebake/ only those run on import,
    not those inside functions (the ops' lazy imports of the CPU references, which lowering never
    calls). Read from the code with `ast`, never imported (tilelang and torch take seconds)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    tree = ast.parse(path.read_bytes(), filename=str(path))
    names = []
    for node in import_nodes(tree, into_functions=package.split(".")[0] == "kernels_tl"):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from .x import y`: relative to this file's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return tuple(dict.fromkeys(file for name in names for file in package_files(name)))


def package_files(name: str) -> list[Path]:
    """The repository files that `import name` runs: `import a.b.c` runs a, a.b, then a.b.c."""
    parts = name.split(".")
    return [f for f in (module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1)) if f is not None]


def kernel_sources(v) -> list[str]:
    """What lowering variant `v` reads from the repository, as paths relative to it: its kernel
    source first, then, sorted, every repository module (kernels_tl/, src/tilebake/) that the
    source or the variant's declaration imports, transitively. CMake re-lowers the op when one
    changes, and the manifest's per-kernel source_sha256 covers the same files."""
    source = module_file(v.kernel_module())
    todo = [*package_files(v.kernel_module()), *package_files(type(v).__module__)]
    seen = set(todo)
    while todo:
        for file in imported_files(todo.pop()):
            if file not in seen:
                seen.add(file)
                todo.append(file)
    rest = sorted(str(p.relative_to(ROOT)) for p in seen - {source})
    return [str(source.relative_to(ROOT)), *rest]


def sources_sha256(paths) -> str:
    """sha256 over the (repository-relative) paths and their bytes."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.encode() + b"\0")
        h.update(hashlib.sha256((ROOT / path).read_bytes()).digest())
    return h.hexdigest()


def op_bundles(variants) -> dict[str, list[str]]:
    """{bundle name: its variant ids} (bundle.py) over the ops of `variants` (variants_by_id's
    dict, whose ids come in declaration order); a bundle never mixes ops."""
    by_op = {}
    for vid, v in variants.items():
        by_op.setdefault(v.op, []).append(vid)
    return {name: chunk for op, ids in by_op.items() for name, chunk in bundles(op, ids).items()}


def cmd_list(args):
    sources = {}
    variants = variants_by_id(args.ops)
    bundle_of = {vid: name for name, ids in op_bundles(variants).items() for vid in ids}
    for vid, v in variants.items():
        if v.op not in sources:
            sources[v.op] = ",".join(kernel_sources(v))
        print(f"{vid}|{bundle_of[vid]}|{sources[v.op]}")


def check_launch_expr(text: str, names: set[str]) -> str:
    """Grid and block come out as TIR expressions of runtime dims; the runtime evaluates
    them, so it accepts only integer arithmetic on parameter names (loader.launch_expr_error)."""
    from tilebake._runtime.loader import launch_expr_error

    error = launch_expr_error(text, names)
    if error:
        raise SystemExit(f"aot: {error}")
    return text


def check_params(v, params: list[dict]) -> None:
    """The lowered kernel's parameters (`params`, the manifest's {"name", "kind"} in the kernel's
    order) must be exactly those `v` declares (Variant.params(): names and dtypes; the declared
    order is the op's calling order, mapped to the kernel's by name). Any difference fails the build."""
    from tilebake._variants import PARAM_DTYPES

    declared = v.params()
    names = [p.name for p in declared]
    problems = [f"declares {n!r} twice" for n in sorted({n for n in names if names.count(n) > 1})]
    problems += [f"declares {p.name!r} with dtype {p.dtype!r}; known: {sorted(PARAM_DTYPES)}"
                 for p in declared if p.dtype not in PARAM_DTYPES]  # fmt: skip
    kinds = {p.name: PARAM_DTYPES.get(p.dtype) for p in declared}
    lowered = {p["name"]: p["kind"] for p in params}
    dtype_of = {k: d for d, k in PARAM_DTYPES.items()}  # launcher letter -> IR dtype
    problems += [f"the kernel has no parameter {n!r} (unused, or named otherwise?)" for n in kinds if n not in lowered]
    problems += [
        f"the kernel takes {n!r} ({dtype_of[k]}), which is not declared" for n, k in lowered.items() if n not in kinds
    ]
    problems += [
        f"{n!r} is declared {dtype_of.get(kinds[n], kinds[n])}, the kernel takes {dtype_of[k]}"
        for n, k in lowered.items()
        if n in kinds and kinds[n] is not None and kinds[n] != k
    ]
    if problems:
        raise SystemExit(
            f"aot: {v.id}: the lowered kernel's parameters differ from {type(v).__name__}.params():\n  "
            + "\n  ".join(problems)
            + f"\n  kernel: {', '.join(p['name'] + ':' + dtype_of[p['kind']] for p in params)}"
        )


def lower_one(v, arch: str, out_dir: Path, build_kwargs=None, stem=None):
    """Lower `v` for `arch` into out_dir/arch/<stem or v.id>.{cu,json} (build_kwargs: tuning only)."""
    import importlib

    import tilelang
    from tilelang import tvm
    from tvm.target import Target

    source = importlib.import_module(v.kernel_module())
    target = Target({"kind": "cuda", "arch": arch})  # explicit arch: bare "cuda" silently means sm_50
    with tvm.transform.PassContext(opt_level=3, config=getattr(source, "PASS_CONFIGS", {})), target:
        artifact = tilelang.lower(source.build(v, **(build_kwargs or {})), target=target)

    kernels = [(gv, f) for gv, f in artifact.device_mod.functions.items() if f.attrs.get("tirx.is_global_func")]
    if len(kernels) != 1:
        raise SystemExit(f"aot: {v.id} lowered to {len(kernels)} device kernels; one is supported")
    _, func = kernels[0]
    host = str(artifact.host_mod)
    if "tensormap" in host:
        raise SystemExit(f"aot: {v.id} uses TMA descriptors, which the launcher does not encode yet")
    from tilebake._variants import PARAM_DTYPES

    params = []
    for p in func.params:
        dtype = str(p.dtype)
        if dtype not in PARAM_DTYPES:
            raise SystemExit(f"aot: {v.id} parameter {p.name} has dtype {dtype}; supported: {sorted(PARAM_DTYPES)}")
        params.append({"name": p.name, "kind": PARAM_DTYPES[dtype]})
    check_params(v, params)
    names = {p["name"] for p in params}
    extents = func.attrs["thread_extent"]
    launch = [check_launch_expr(str(extents[a]) if a in extents else "1", names) for a in LAUNCH_AXES]
    smem = func.attrs.get("dyn_shared_memory_buf")
    if smem is not None and not isinstance(smem, (int, tvm.tirx.IntImm)):
        raise SystemExit(f"aot: {v.id} has dynamic shared memory {smem} that depends on runtime dims; make it constant")
    meta = {
        "id": v.id,
        "op": v.op,
        "family": v.family,
        "key": {k: getattr(v, k) for k in v.__dataclass_fields__},
        "backend": "cuda",
        "arch": arch,
        "entry": str(func.attrs["global_symbol"]),
        "params": params,
        "grid": launch[:3],
        "block": launch[3:],
        "dynamic_smem": int(smem) if smem is not None else 0,
        "tma_descriptors": [],
    }
    arch_dir = out_dir / arch
    arch_dir.mkdir(parents=True, exist_ok=True)
    stem = stem or v.id
    (arch_dir / f"{stem}.cu").write_text(artifact.kernel_source)
    (arch_dir / f"{stem}.json").write_text(json.dumps(meta, indent=1) + "\n")


def cmd_lower(args):
    os.environ.setdefault("TILELANG_CACHE_DIR", str(Path(args.out) / ".tilelang_cache"))  # hermetic build
    known = variants_by_id()
    for vid in args.ids:
        if vid not in known:
            raise SystemExit(f"aot: unknown variant {vid!r}; `aot.py list` prints them")
    start = time.time()
    for vid in args.ids:
        # The hash of what this lowering reads, taken before it: an edit during the build then
        # shows as a stale kernel in `manifest`, which compares it with the sources' hash then.
        digest = sources_sha256(kernel_sources(known[vid]))
        for arch in args.arch:
            lower_one(known[vid], arch, Path(args.out))
            meta_path = Path(args.out) / arch / f"{vid}.json"
            meta = json.loads(meta_path.read_text())
            meta_path.write_text(json.dumps({**meta, "source_sha256": digest}, indent=1) + "\n")
    # Every bundle of the lowered ops, from the .cu files now on disk (CMake lowers whole ops).
    ops = {known[vid].op for vid in args.ids}
    for name, ids in op_bundles({vid: v for vid, v in known.items() if v.op in ops}).items():
        for arch in args.arch:
            write_bundle(Path(args.out) / arch, name, ids)
    print(f"aot: lowered {len(args.ids)} variant(s) for {', '.join(args.arch)} in {time.time() - start:.1f}s")


def nvcc_version(nvcc: str) -> str:
    """The 'release 13.0, V13.0.88' part of `nvcc --version`."""
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next((line.split("tools, ")[-1] for line in text.splitlines() if "release" in line), "unknown")


def source_fingerprint() -> str:
    """sha256 over kernels_tl/ and the variant declarations: what the binaries were built from."""
    h = hashlib.sha256()
    for path in sorted([*ROOT.glob("kernels_tl/**/*.py"), *ROOT.glob("src/tilebake/**/*.py")]):
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cmd_manifest(args):
    # CMake runs this on every build (so the git commit is never stale): find tilelang's version
    # and directory without importing it (4 s).
    import importlib.metadata
    import importlib.util

    tilelang_dir = os.path.dirname(importlib.util.find_spec("tilelang").origin)
    out = Path(args.out)
    kernels, digests = {}, {}
    variants = variants_by_id(args.ops)
    place = {vid: (name, index) for name, ids in op_bundles(variants).items() for index, vid in enumerate(ids)}
    for vid, v in variants.items():
        if v.op not in digests:
            digests[v.op] = sources_sha256(kernel_sources(v))
        for arch in args.arch:
            meta = json.loads((out / arch / f"{vid}.json").read_text())
            if meta.get("source_sha256") != digests[v.op]:  # never ship a kernel of older sources
                raise SystemExit(
                    f"aot: {arch}/{vid} was lowered from other sources than the repository's now (a file "
                    f"`aot.py list --ops {v.op}` names changed during the build, or CMake missed it): "
                    f"remove {out / arch / vid}.json and build again"
                )
            bundle, index = place[vid]
            cubin = out / arch / f"{bundle}.cubin"
            meta["binary"] = f"{arch}/{cubin.name}"
            meta["entry"] = bundle_entry(meta["entry"], index)
            meta["sha256"] = hashlib.sha256(cubin.read_bytes()).hexdigest()
            kernels.setdefault(vid, {})[arch] = meta
    # safe.directory: a checkout owned by another user (a build container) is still read.
    git = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    by_op = {}
    for vid, per_arch in kernels.items():
        by_op.setdefault(next(iter(per_arch.values()))["op"], {})[vid] = per_arch
    from tilebake import __version__ as tilebake_version
    from tilebake._runtime.loader import MANIFEST_VERSION  # the version the runtime reads

    manifest = {
        "manifest_version": MANIFEST_VERSION,
        # The kernels and the runtime that launches them come from one commit: the runtime
        # refuses a kernel package of another version (their parameter lists may differ).
        "package": "tilebake-cuda",
        "tilebake_version": tilebake_version,
        "backends": {"cuda": {"archs": args.arch}},
        "tilelang_version": importlib.metadata.version("tilelang"),
        "nvcc_version": nvcc_version(args.nvcc),
        # Install paths would make the manifest differ between build environments.
        "nvcc_flags": args.nvcc_flags.replace(tilelang_dir, "<tilelang>"),
        "source_sha256": source_fingerprint(),
        "git_commit": git.stdout.strip() if git.returncode == 0 else "unknown",
        "partial_build_ops": sorted(filter(None, args.ops.split(","))) or None,
        "ops": sorted(by_op),
    }
    # One file per op: the first call of an op parses only its own kernels (the whole set is
    # half a megabyte of JSON, which was most of a cold start). Compact for the same reason.
    ops_dir = out / "ops"
    shutil.rmtree(ops_dir, ignore_errors=True)  # no stale op of an earlier (partial) build
    ops_dir.mkdir()
    for op, op_kernels in by_op.items():
        op_manifest = {"manifest_version": MANIFEST_VERSION, "op": op, "kernels": op_kernels}
        (ops_dir / f"{op}.json").write_text(json.dumps(op_manifest, separators=(",", ":"), sort_keys=True) + "\n")
    (out / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"aot: manifest with {len(kernels)} variants of {len(by_op)} ops x {len(args.arch)} archs")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("list")
    p.add_argument("--ops", default="", help="comma-separated ops (a partial build); empty: all")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("lower")
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--out", required=True)
    p.add_argument("--arch", action="append", required=True)
    p.set_defaults(fn=cmd_lower)
    p = sub.add_parser("manifest")
    p.add_argument("--out", required=True)
    p.add_argument("--arch", action="append", required=True)
    p.add_argument("--nvcc", default="nvcc")
    p.add_argument("--nvcc-flags", default="")
    p.add_argument("--ops", default="", help="as for list")
    p.set_defaults(fn=cmd_manifest)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main()
