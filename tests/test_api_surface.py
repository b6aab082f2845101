"""`import tilebake as tile_kernels` works for TileKernels 2.1.0's users: every public name of its
catalogue exists here, and every function whose signature the catalogue gives takes the same
parameters in the same order with the same defaults (more parameters only after them, each with a
default). tests/api_2_1_0.txt holds the catalogue's names and signatures, read from the team's
spec (../shared/spec/api.md); where that file is present the two are checked to agree, and
`python -m tests.test_api_surface` prints the list anew."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT.parent / "shared" / "spec" / "api.md"
CATALOGUE = Path(__file__).resolve().parent / "api_2_1_0.txt"


def _closing_paren(text: str) -> int:
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced: {text}")


def _split_params(text: str) -> list[str]:
    """text split at its top-level commas."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return parts + ([current.strip()] if current.strip() else [])


def _names(segment: str) -> list[str]:
    """`a, b_fwd/bwd, c` -> a, b_fwd, b_bwd, c."""
    out = []
    for name in (n.strip() for n in segment.split(",")):
        if "/" in name:
            first, second = name.split("/")
            out += [first, first.rsplit("_", 1)[0] + "_" + second]
        elif re.fullmatch(r"\w+", name):
            out.append(name)
    return out


def extract(spec: str) -> list[str]:
    """The catalogue's lines: 'exports MODULE: NAME, ...' (the sections' export lists and the names
    their tables give) and 'MODULE.NAME(PARAMS)' (MODULE empty for the top level), from api.md's
    sections 1.1 to 1.9."""
    spec = spec[: spec.index("### 1.10")]
    lines, exports = [], {}
    sections = re.split(r"\n(?=#{3} 1\.\d+ )", spec)[1:]
    for section in sections:
        module = re.match(r"#{3} 1\.\d+ `tile_kernels(?:\.(\w+))?`", section)
        module = module.group(1) or "" if module else None
        if module is None or module == "modeling":  # (the layers: tests/modeling)
            continue
        for found in re.finditer(r"Exports[^:]*: `([^`]+)`", section):
            exports.setdefault(module, []).extend(_names(found.group(1)))
        utils = re.search(r"`tile_kernels/utils.py`: `([^`]+)`", section)
        if utils:
            exports.setdefault("utils", []).extend(_names(utils.group(1)))
        for line in section.splitlines():
            if not line.startswith("| `"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            names = re.findall(r"`(\w+)(?:\([^`]*\))?`", cells[0].split(" (`")[0])
            names = [names[0].rsplit("_", 1)[0] + n if n.startswith("_") else n for n in names]
            # the top level re-exports its config functions, all but reset_runtime_config
            exports.setdefault("config" if "not re-exported" in line else module, []).extend(names)
            signatures = [s for s in re.findall(r"`([^`]*)`", cells[1]) if s.startswith("(")]
            for name, signature in zip(names, signatures):
                lines.append(f"{module + '.' if module else ''}{name}{signature[: _closing_paren(signature) + 1]}")
    torch_part = spec[spec.index("`torch/__init__.py` exports:") : spec.index("Naming is inconsistent")]
    for segment in re.findall(r"`([^`]+)`", torch_part)[1:]:
        if "/" not in segment and "." not in segment:
            exports.setdefault("torch", []).extend(_names(segment))
    unique = {m: list(dict.fromkeys(n)) for m, n in exports.items()}
    return [f"exports {m}: {', '.join(n)}" for m, n in unique.items()] + lines


def catalogue() -> tuple[dict, list[tuple[str, str, str]]]:
    exports, signatures = {}, []
    for line in CATALOGUE.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith("exports "):
            module, names = line[len("exports ") :].split(":", 1)
            exports[module] = [n.strip() for n in names.split(",")]
        else:
            path, params = line.split("(", 1)
            module, _, name = path.rpartition(".")
            signatures.append((module, name, params[:-1]))
    return exports, signatures


def _module(name: str):
    return importlib.import_module("tilebake" + (f".{name}" if name else ""))


def test_the_catalogue_agrees_with_the_spec():
    if not SPEC.exists():
        pytest.skip(f"{SPEC} is not beside this checkout (the catalogue file is checked alone)")
    wanted = CATALOGUE.read_text().splitlines()
    assert [line for line in wanted if not line.startswith("#")] == extract(SPEC.read_text())


@pytest.mark.parametrize("module, names", [pytest.param(m, n, id=m or "top") for m, n in catalogue()[0].items()])
def test_every_public_name_exists(module, names):
    missing = [name for name in names if not hasattr(_module(module), name)]
    assert not missing, f"tilebake{'.' + module if module else ''} lacks {missing}"


NOT_LITERAL = object()  # a default the catalogue writes in words (e.g. 'fp32'): not compared


def _parameter(text: str) -> tuple[str, bool, object]:
    """(name or its prefix where the spec abbreviates it with '…', abbreviated, default:
    inspect.Parameter.empty where it has none, NOT_LITERAL where it is not a Python literal)."""
    found = re.match(r"(\*{0,2}\w+)(…)?(?:\s*:[^=]*|\s+[\w/]+)?(?:\s*=\s*(.+))?$", text)
    assert found, f"unreadable parameter {text!r}"
    name, abbreviated, default = found.groups()
    if default is None:
        return name, bool(abbreviated), inspect.Parameter.empty
    try:
        return name, bool(abbreviated), ast.literal_eval(default)
    except ValueError:
        return name, bool(abbreviated), NOT_LITERAL


@pytest.mark.parametrize("module, name, params", [pytest.param(*s, id=f"{s[0]}.{s[1]}") for s in catalogue()[1]])
def test_signature_matches_the_original(module, name, params):
    ours = list(inspect.signature(getattr(_module(module), name)).parameters.values())
    theirs = [_parameter(p) for p in _split_params(params)]
    assert len(ours) >= len(theirs), f"{name}: {len(ours)} parameters, the original has {len(theirs)}"
    for i, ((want, abbreviated, default), got) in enumerate(zip(theirs, ours)):
        stars = {got.VAR_POSITIONAL: "*", got.VAR_KEYWORD: "**"}.get(got.kind, "")
        got_name = stars + got.name
        assert got_name.startswith(want) if abbreviated else got_name == want, f"{name}: parameter {i} is {got_name}"
        if default is not inspect.Parameter.empty and default is not NOT_LITERAL:
            assert got.default == default and type(got.default) is type(default), (
                f"{name}({want}=...): default {got.default!r}, the original's {default!r}"
            )
    extra = [
        p.name for p in ours[len(theirs) :] if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    assert not extra, f"{name}: parameters beyond the original's must have defaults: {extra}"


if __name__ == "__main__":
    print("# TileKernels 2.1.0's public names and signatures, read from ../shared/spec/api.md by")
    print("# tests/test_api_surface.py (python -m tests.test_api_surface > tests/api_2_1_0.txt)")
    print("\n".join(extract(SPEC.read_text())))
