"""Launch-config candidates of an op's kernels, timed through the op's own call path: build them
here, then, on the GPU machine, put one in place of its variant's sm_90a binary in an installed
tilebake_cuda and run any benchmark (bench/anchors.py) against that install.

python bench/candidates.py build OP DIR       # build host: lower + nvcc each variant of OP with
                                              # each config of its kernel module's candidate_configs(variant)
python bench/candidates.py swap SITE CANDIDATE  # GPU machine: SITE the --target install, CANDIDATE
                                              # a DIR/sm_90a/<stem>.json of the build (its .cubin beside)

The swap rewrites the variant's entry in SITE/tilebake_cuda/kernels/ops/<op>.json (entry name,
parameters, grid, block, shared memory, sha256): the loader then loads the candidate as it would
the shipped binary. Work on a copy of the install: the swap is not undone.
"""

import dataclasses
import hashlib
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(op: str, out: Path) -> None:
    sys.path[:0] = [str(ROOT / "build_tools"), str(ROOT), str(ROOT / "src"), str(ROOT / "bench")]
    import aot
    import harness

    from tilebake._registry import all_variants

    variants = [v for v in all_variants() if v.op == op]
    source = importlib.import_module(f"kernels_tl.{variants[0].family}.{op}")
    for v in variants:
        for cfg in source.candidate_configs(v):
            stem = v.id + "." + ".".join(f"{k}{val}" for k, val in dataclasses.asdict(cfg).items())
            aot.lower_one(v, "sm_90a", out, build_kwargs={"cfg": cfg}, stem=stem)
            print("built", stem, harness.compile_cubin(out / "sm_90a" / f"{stem}.cu"), flush=True)


def swap(site: Path, candidate: Path) -> None:
    meta = json.loads(candidate.read_text())
    image = candidate.with_suffix(".cubin").read_bytes()
    ops_file = site / "tilebake_cuda" / "kernels" / "ops" / f"{meta['op']}.json"
    kernels = json.loads(ops_file.read_text())
    entry = kernels["kernels"][meta["id"]]["sm_90a"]
    (site / "tilebake_cuda" / "kernels" / entry["binary"]).write_bytes(image)
    entry.update({k: meta[k] for k in ("entry", "params", "grid", "block", "dynamic_smem")})
    entry["sha256"] = hashlib.sha256(image).hexdigest()
    ops_file.write_text(json.dumps(kernels))
    print(f"{meta['id']} (sm_90a) <- {candidate.stem}")


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], Path(sys.argv[3]))
    else:
        swap(Path(sys.argv[2]), Path(sys.argv[3]))
