"""build_tools/bundle.py: how variants are grouped into one nvcc translation unit, and the bundle
source (each kernel under its own name, nothing else changed)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not (ROOT / "build_tools" / "bundle.py").exists(), reason="needs a source checkout")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PRELUDE = "#include <tl_templates/cuda/reduce.h>\n#ifdef ENABLE_BF16\n#include <x.cuh>\n#endif\n\n"


def kernel_source(entry: str, value: int, prelude: str = PRELUDE) -> str:
    decl = f'extern "C" __global__ void {entry}(int* __restrict__ out, int n)'
    body = f"{{\n  #pragma unroll\n  for (int i = 0; i < 2; ++i) out[i] = {value};\n}}\n"
    return f"{prelude}{decl};\n{decl.replace('void ', 'void __launch_bounds__(128, 1) ')} {body}"


def lowered(tmp_path: Path, sources: dict[str, str], entries: dict[str, str] | None = None) -> Path:
    arch_dir = tmp_path / "sm_90a"
    arch_dir.mkdir()
    for vid, text in sources.items():
        (arch_dir / f"{vid}.cu").write_text(text)
        entry = (entries or {}).get(vid) or re.search(r"void (\w+)\(", text).group(1)
        (arch_dir / f"{vid}.json").write_text(json.dumps({"entry": entry}))
    return arch_dir


def test_bundles_chunk_one_op_in_declaration_order():
    from build_tools.bundle import BUNDLE_SIZE, bundles

    ids = [f"op_a.n-{i}" for i in range(2 * BUNDLE_SIZE + 3)]
    grouped = bundles("op_a", ids)
    assert list(grouped) == ["op_a.bundle0", "op_a.bundle1", "op_a.bundle2"]
    assert [len(chunk) for chunk in grouped.values()] == [BUNDLE_SIZE, BUNDLE_SIZE, 3]
    assert [vid for chunk in grouped.values() for vid in chunk] == ids
    assert bundles("op_a", []) == {}


def test_every_declared_variant_is_in_exactly_one_bundle_of_its_op():
    sys.path.insert(0, str(ROOT / "src"))
    from build_tools.aot import op_bundles, variants_by_id

    variants = variants_by_id()
    grouped = op_bundles(variants)
    members = [vid for ids in grouped.values() for vid in ids]
    assert sorted(members) == sorted(variants)
    for name, ids in grouped.items():
        assert {variants[vid].op for vid in ids} == {name.split(".")[0]}, name


def test_bundle_renames_each_kernel_and_keeps_its_code(tmp_path):
    from build_tools.bundle import bundle_entry, write_bundle

    sources = {"op_a.n-1": kernel_source("op_a_kernel", 1), "op_a.n-2": kernel_source("op_a_kernel", 2)}
    arch_dir = lowered(tmp_path, sources)
    write_bundle(arch_dir, "op_a.bundle0", list(sources))
    text = (arch_dir / "op_a.bundle0.cu").read_text()
    assert text.count(PRELUDE) == 1  # the same includes once
    for index, (vid, source) in enumerate(sources.items()):
        body = source[len(PRELUDE) :].rstrip()
        block = (
            f"// {vid}\n#define op_a_kernel {bundle_entry('op_a_kernel', index)}\n"
            f"namespace tilebake_v{index} {{\n{body}\n}}\n#undef op_a_kernel\n"
        )
        assert block in text, text
    assert bundle_entry("op_a_kernel", 1) == "v1_op_a_kernel"


def test_bundle_keeps_every_distinct_prelude(tmp_path):
    from build_tools.bundle import write_bundle

    other = "#include <tl_templates/cuda/math.h>\n\n"
    sources = {"op_a.n-1": kernel_source("k", 1), "op_a.n-2": kernel_source("k", 2, prelude=other)}
    arch_dir = lowered(tmp_path, sources)
    write_bundle(arch_dir, "op_a.bundle0", list(sources))
    text = (arch_dir / "op_a.bundle0.cu").read_text()
    assert text.startswith(PRELUDE + other)


@pytest.mark.parametrize(
    "defect, message",
    [
        ("two_kernels", "expected one extern \"C\" kernel"),
        ("macro_in_body", "a preprocessor line after the first kernel"),
        ("other_entry", "is not the one its .json names"),
    ],
)
def test_bundle_refuses_what_it_cannot_rename_safely(tmp_path, defect, message):
    from build_tools.bundle import write_bundle

    source, entries = kernel_source("k", 1), None
    if defect == "two_kernels":
        source += kernel_source("k2", 2, prelude="")
    elif defect == "macro_in_body":
        source += "#define N 4\n"
    else:
        entries = {"op_a.n-1": "k_other"}
    arch_dir = lowered(tmp_path, {"op_a.n-1": source}, entries)
    with pytest.raises(SystemExit, match=message):
        write_bundle(arch_dir, "op_a.bundle0", ["op_a.n-1"])
