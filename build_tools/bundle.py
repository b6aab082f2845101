"""Kernel bundles: several variants of one op compiled by nvcc as one translation unit.

Each lowered kernel includes tilelang's CUDA templates (cute and cutlass underneath), whose
parsing is about 2 of the 2.3 s that nvcc takes for a small kernel; compiled one by one, the
wheel's 560 (variant, arch) pairs spent most of the build there. A bundle is up to BUNDLE_SIZE
variants of one op, in declaration order: one .cu that includes the templates once and defines
each variant's kernel under its own name, one nvcc run, one cubin. The manifest points each
variant at its bundle's cubin and its kernel's name there; the runtime loads a cubin once per
device and takes every variant's kernel from it. Each kernel compiles as it would alone.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

BUNDLE_SIZE = 8
_ENTRY = re.compile(r'^extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(', re.M)


def bundles(op: str, ids: list[str]) -> dict[str, list[str]]:
    """{bundle name: its variant ids} for the variant ids of `op`, in declaration order."""
    chunks = [ids[i : i + BUNDLE_SIZE] for i in range(0, len(ids), BUNDLE_SIZE)]
    return {f"{op}.bundle{k}": chunk for k, chunk in enumerate(chunks)}


def bundle_entry(entry: str, index: int) -> str:
    """The name of the kernel of the bundle's `index`-th variant, whose lowered kernel is `entry`."""
    return f"v{index}_{entry}"


def split_source(text: str, where: str) -> tuple[str, str, str]:
    """(prelude, body, entry) of a lowered kernel: the includes before its first `extern "C"`,
    the rest, and the kernel's name."""
    start = text.find('extern "C"')
    names = set(_ENTRY.findall(text))
    if start < 0 or len(names) != 1:
        raise SystemExit(f"aot: {where}: expected one extern \"C\" kernel, found {sorted(names)}")
    prelude, body = text[:start], text[start:]
    # The bundle puts the body inside a namespace: it must declare nothing for the preprocessor
    # (a #pragma such as `unroll` in a loop is the compiler's).
    if re.search(r"^\s*#\s*(?!pragma\b)", body, re.M):
        raise SystemExit(f"aot: {where}: a preprocessor line after the first kernel; cannot bundle it")
    return prelude, body, names.pop()


def write_bundle(arch_dir: Path, name: str, ids: list[str]) -> None:
    """arch_dir/<name>.cu from the lowered arch_dir/<id>.cu of `ids`: every prelude (their
    include guards make repeats free), then each body in a namespace of its own, its kernel
    renamed by a macro around it (bundle_entry)."""
    preludes, parts = [], []
    for index, vid in enumerate(ids):
        where = f"{arch_dir.name}/{vid}.cu"
        prelude, body, entry = split_source((arch_dir / f"{vid}.cu").read_text(), where)
        if entry != json.loads((arch_dir / f"{vid}.json").read_text())["entry"]:
            raise SystemExit(f"aot: {where}: its kernel {entry!r} is not the one its .json names")
        if prelude not in preludes:
            preludes.append(prelude)
        renamed = bundle_entry(entry, index)
        parts.append(
            f"// {vid}\n#define {entry} {renamed}\nnamespace tilebake_v{index} {{\n{body.rstrip()}\n}}\n#undef {entry}\n"
        )
    (arch_dir / f"{name}.cu").write_text("".join(preludes) + "\n" + "\n".join(parts))
