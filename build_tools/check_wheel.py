"""Check what a tilebake wheel (or an installed tilebake) ships, without importing it.

    python build_tools/check_wheel.py dist/*.whl       # wheels (wheels.yml)
    python build_tools/check_wheel.py --installed      # what pip installed (tests/test_check_wheel.py)

A wheel is one of three packages (README, "Packages"), told apart by its contents. Fails (exit 1,
one line per problem) unless:
- the runtime (tilebake/...) has its native launcher, which NEEDs only glibc: no libtorch/libc10
  (one wheel for every torch), no libcuda/libcudart (the launcher dlopens the driver), no
  libpython (stable ABI), nothing auditwheel grafted; and it holds no kernels;
- the CUDA kernels (tilebake_cuda/...) have kernels/manifest.json and one kernels/ops/<op>.json per
  listed op; every binary the op manifests name is there with the sha256 they record; no cubin is
  there that no manifest names; no host code (shared objects); the manifest's tilebake version is
  the one the wheel's metadata requires; the wheel is py3-none-any;
- the Ascend kernels (tilebake_ascend/...) likewise, with .aibin binaries, and not a stage-1
  manifest (sources only);
- none ships a kernel or launcher source (.cu, .cuh, .c, .cc, .cpp, .asc);
- each file (wheel) is under --max-mb (100 MB);
- the build is not a developer's partial build (TILEBAKE_OPS), unless --allow-partial.
"""

import argparse
import hashlib
import importlib.util
import json
import re
import struct
import sys
import zipfile
from pathlib import Path

SOURCE_SUFFIXES = (".cu", ".cuh", ".c", ".cc", ".cpp", ".asc")
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


RUNTIME, CUDA_KERNELS, ASCEND_KERNELS = "tilebake", "tilebake_cuda", "tilebake_ascend"
BINARY_SUFFIX = {CUDA_KERNELS: ".cubin", ASCEND_KERNELS: ".aibin"}  # each kernel package's binaries


def is_shared_object(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


def check_tree(files: dict, allow_partial: bool) -> list[str]:
    """files: {path relative to the install root ("tilebake/...", "tilebake_cuda/..."): () -> bytes}
    of one package; its dist-info may be there too."""
    packages = {p.split("/", 1)[0] for p in files if not p.split("/", 1)[0].endswith((".dist-info", ".data"))}
    if packages == {RUNTIME}:
        errors = check_runtime(files)
    elif len(packages) == 1 and packages <= BINARY_SUFFIX.keys():
        errors = check_kernels(files, packages.pop(), allow_partial)
    else:
        return [f"holds {sorted(packages)}; a wheel is one of {RUNTIME}, {CUDA_KERNELS}, {ASCEND_KERNELS}, alone"]
    errors += [f"{path}: source file shipped" for path in sorted(files) if path.endswith(SOURCE_SUFFIXES)]
    return errors


def check_runtime(files: dict) -> list[str]:
    errors = []
    for path in sorted(files):
        if path.endswith(tuple(BINARY_SUFFIX.values())) or path.startswith(f"{RUNTIME}/kernels/"):
            errors.append(f"{path}: kernels in the runtime package (they are {CUDA_KERNELS}'s or {ASCEND_KERNELS}'s)")
        if is_shared_object(path):
            try:
                needed = elf_needed(files[path]())
            except (ValueError, struct.error, IndexError) as exc:
                errors.append(f"{path}: unreadable ELF ({exc})")
                continue
            bad = [n for n in needed if n not in ALLOWED_NEEDED and not n.startswith(ALLOWED_NEEDED_PREFIXES)]
            if bad:
                errors.append(f"{path}: links {', '.join(bad)} (only glibc allowed)")
    if not any(p.startswith(f"{RUNTIME}/_runtime/_launcher") for p in files):
        errors.append(f"the native launcher ({RUNTIME}/_runtime/_launcher*.so) is missing")
    return errors


def check_kernels(files: dict, package: str, allow_partial: bool) -> list[str]:
    """A kernel package (tilebake_cuda or tilebake_ascend): its manifests, and exactly the
    binaries they name, with their sha256."""
    errors = []
    kdir, suffix = f"{package}/kernels/", BINARY_SUFFIX[package]
    if kdir + "manifest.json" not in files:
        return [f"{kdir}manifest.json is missing (a kernel package without kernels?)"]
    header = json.loads(files[kdir + "manifest.json"]())
    if header.get("stage1_only"):
        errors.append("a stage-1 manifest (AscendC sources, no binaries): not a kernel package")
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
        if path.endswith(suffix) and path not in named:
            errors.append(f"{path}: a {suffix} binary no manifest names")
        if is_shared_object(path):
            errors.append(f"{path}: host code in the data-only kernel package")
    metadata = [p for p in files if p.endswith(".dist-info/METADATA")]
    if metadata:  # a wheel, or an installed package's dist-info
        requires = re.findall(r"^Requires-Dist: (.+)$", files[metadata[0]]().decode(), re.M)
        wanted = f"{RUNTIME}=={header.get('tilebake_version')}"
        if wanted not in [r.replace(" ", "") for r in requires]:
            errors.append(f"the metadata requires {requires}, not {wanted} (the manifest's runtime version)")
    return errors


def check_wheel_tag(name: str, files: dict) -> list[str]:
    """The runtime is one stable-ABI wheel per platform; the kernels, data only, one for all."""
    tag = "-".join(name.removesuffix(".whl").split("-")[-3:])
    if any(p.startswith((f"{CUDA_KERNELS}/", f"{ASCEND_KERNELS}/")) for p in files):
        return [] if tag == "py3-none-any" else [f"tagged {tag}; the data-only kernel package is py3-none-any"]
    return [] if tag.startswith("cp310-abi3-") else [f"tagged {tag}; the runtime is cp310-abi3 (stable ABI)"]


def wheel_files(zf: zipfile.ZipFile) -> dict:
    return {n: (lambda n=n: zf.read(n)) for n in zf.namelist() if not n.endswith("/")}


def installed_files(package: str) -> tuple[Path, dict]:
    """One installed package's files (and its dist-info), found without importing it (no torch)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"check_wheel: {package} is not installed in this environment")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    root = pkg.parent
    files = {}
    for p in [*pkg.rglob("*"), *root.glob(f"{package}-*.dist-info/*")]:
        if p.is_file() and "__pycache__" not in p.parts:
            files[p.relative_to(root).as_posix()] = p.read_bytes
    return pkg, files


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="*", type=Path)
    parser.add_argument("--installed", action="store_true", help="check the tilebake and tilebake-cuda installed here")
    parser.add_argument("--max-mb", type=float, default=100.0)
    parser.add_argument("--allow-partial", action="store_true", help="accept a TILEBAKE_OPS partial build")
    args = parser.parse_args(argv)
    if not args.wheels and not args.installed:
        parser.error("give wheel files or --installed")
    failed = False
    targets = []
    if args.installed:
        for package in (RUNTIME, CUDA_KERNELS):
            pkg, files = installed_files(package)
            targets.append((str(pkg), files, None))
    for wheel in args.wheels:
        zf = zipfile.ZipFile(wheel)
        targets.append((wheel.name, wheel_files(zf), wheel.stat().st_size))
    for name, files, size in targets:
        errors = check_tree(files, args.allow_partial)
        if size is not None:
            errors += check_wheel_tag(name, files)
        if size is not None and size > args.max_mb * MB:
            errors.append(f"{size / MB:.1f} MB > {args.max_mb:g} MB")
        binaries = sum(p.endswith(tuple(BINARY_SUFFIX.values())) for p in files)
        if errors:
            failed = True
            print(f"check_wheel: {name}: FAILED", file=sys.stderr)
            for e in errors:
                print(f"  {e}", file=sys.stderr)
        else:
            size_text = f", {size / MB:.1f} MB" if size is not None else ""
            print(f"check_wheel: {name}: ok ({binaries} binaries match the manifest{size_text})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
