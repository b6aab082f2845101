"""Check what a tilebake wheel (or an installed tilebake) ships, without importing it.

    python build_tools/check_wheel.py dist/tilebake-*.whl       # wheels (wheels.yml)
    python build_tools/check_wheel.py --installed               # the tilebake pip installed (.ci/run)

Fails (exit 1, one line per problem) unless:
- tilebake/kernels/manifest.json and one kernels/ops/<op>.json per listed op are there;
- every binary the op manifests name is there with the sha256 they record, and no cubin is
  there that no manifest names;
- no kernel or launcher source (.cu, .cuh, .c, .cc, .cpp) is shipped;
- every shared object NEEDs only glibc: no libtorch/libc10 (one wheel for every torch), no
  libcuda/libcudart (the launcher dlopens the driver), no libpython (stable ABI), nothing
  auditwheel grafted;
- each file (wheel) is under --max-mb (100 MB);
- the build is not a developer's partial build (TILEBAKE_OPS), unless --allow-partial.
"""

import argparse
import hashlib
import importlib.util
import json
import struct
import sys
import zipfile
from pathlib import Path

SOURCE_SUFFIXES = (".cu", ".cuh", ".c", ".cc", ".cpp")
# What the stable-ABI launcher may link: glibc's libraries and the dynamic loader.
ALLOWED_NEEDED = {"libc.so.6", "libdl.so.2", "libpthread.so.0", "libm.so.6", "librt.so.1"}
ALLOWED_NEEDED_PREFIXES = ("ld-linux",)
MB = 1_000_000


def elf_needed(image: bytes) -> list[str]:
    """DT_NEEDED entries of an ELF shared object (32/64-bit, either byte order)."""
    if image[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    is64 = image[4] == 2
    end = "<" if image[5] == 1 else ">"
    if is64:
        (shoff,) = struct.unpack_from(end + "Q", image, 0x28)
        shentsize, shnum = struct.unpack_from(end + "HH", image, 0x3A)
        sh_fmt, dyn_fmt = end + "IIQQQQIIQQ", end + "qQ"
    else:
        (shoff,) = struct.unpack_from(end + "I", image, 0x20)
        shentsize, shnum = struct.unpack_from(end + "HH", image, 0x2E)
        sh_fmt, dyn_fmt = end + "IIIIIIIIII", end + "iI"
    sections = [struct.unpack_from(sh_fmt, image, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for _name, sh_type, _flags, _addr, offset, size, link, _info, _align, _entsize in sections:
        if sh_type != 6:  # SHT_DYNAMIC
            continue
        strtab_offset = sections[link][4]
        step = struct.calcsize(dyn_fmt)
        for pos in range(offset, offset + size, step):
            tag, value = struct.unpack_from(dyn_fmt, image, pos)
            if tag == 0:  # DT_NULL
                break
            if tag == 1:  # DT_NEEDED
                start = strtab_offset + value
                needed.append(image[start : image.index(b"\0", start)].decode())
    return needed


def check_tree(files: dict, allow_partial: bool) -> list[str]:
    """files: {path relative to the install root ("tilebake/..."): () -> bytes}."""
    errors = []
    kdir = "tilebake/kernels/"
    if kdir + "manifest.json" not in files:
        return [f"{kdir}manifest.json is missing (a wheel without kernels?)"]
    header = json.loads(files[kdir + "manifest.json"]())
    if header.get("partial_build_ops") and not allow_partial:
        errors.append(f"partial build (TILEBAKE_OPS={','.join(header['partial_build_ops'])}): not a release wheel")
    if not header.get("ops"):
        errors.append("manifest.json lists no ops")
    named = set()
    for op in header.get("ops", []):
        op_path = f"{kdir}ops/{op}.json"
        if op_path not in files:
            errors.append(f"{op_path} is missing")
            continue
        for vid, per_arch in json.loads(files[op_path]())["kernels"].items():
            for arch, entry in per_arch.items():
                binary = kdir + entry["binary"]
                named.add(binary)
                if binary not in files:
                    errors.append(f"{vid} ({arch}): {binary} is missing")
                elif hashlib.sha256(files[binary]()).hexdigest() != entry["sha256"]:
                    errors.append(f"{vid} ({arch}): {binary} does not match its sha256")
    for path in sorted(files):
        if path.endswith(".cubin") and path not in named:
            errors.append(f"{path}: a cubin no manifest names")
        if path.endswith(SOURCE_SUFFIXES):
            errors.append(f"{path}: source file shipped")
        if path.endswith(".so") or ".so." in path.rsplit("/", 1)[-1]:
            try:
                needed = elf_needed(files[path]())
            except (ValueError, struct.error, IndexError) as exc:
                errors.append(f"{path}: unreadable ELF ({exc})")
                continue
            bad = [n for n in needed if n not in ALLOWED_NEEDED and not n.startswith(ALLOWED_NEEDED_PREFIXES)]
            if bad:
                errors.append(f"{path}: links {', '.join(bad)} (only glibc allowed)")
    if not any(p.startswith("tilebake/_runtime/_launcher") for p in files):
        errors.append("the native launcher (tilebake/_runtime/_launcher*.so) is missing")
    return errors


def wheel_files(zf: zipfile.ZipFile) -> dict:
    return {n: (lambda n=n: zf.read(n)) for n in zf.namelist() if not n.endswith("/")}


def installed_files() -> tuple[Path, dict]:
    spec = importlib.util.find_spec("tilebake")  # finds the package without importing it (no torch)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("check_wheel: tilebake is not installed in this environment")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    root = pkg.parent
    files = {}
    for p in pkg.rglob("*"):
        if p.is_file() and "__pycache__" not in p.parts:
            files[p.relative_to(root).as_posix()] = p.read_bytes
    return pkg, files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="*", type=Path)
    parser.add_argument("--installed", action="store_true", help="check the tilebake installed in this Python")
    parser.add_argument("--max-mb", type=float, default=100.0)
    parser.add_argument("--allow-partial", action="store_true", help="accept a TILEBAKE_OPS partial build")
    args = parser.parse_args(argv)
    if not args.wheels and not args.installed:
        parser.error("give wheel files or --installed")
    failed = False
    targets = []
    if args.installed:
        pkg, files = installed_files()
        targets.append((str(pkg), files, None))
    for wheel in args.wheels:
        zf = zipfile.ZipFile(wheel)
        targets.append((wheel.name, wheel_files(zf), wheel.stat().st_size))
    for name, files, size in targets:
        errors = check_tree(files, args.allow_partial)
        if size is not None and size > args.max_mb * MB:
            errors.append(f"{size / MB:.1f} MB > {args.max_mb:g} MB")
        cubins = sum(p.endswith(".cubin") for p in files)
        if errors:
            failed = True
            print(f"check_wheel: {name}: FAILED", file=sys.stderr)
            for e in errors:
                print(f"  {e}", file=sys.stderr)
        else:
            size_text = f", {size / MB:.1f} MB" if size is not None else ""
            print(f"check_wheel: {name}: ok ({cubins} cubins match the manifest{size_text})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
