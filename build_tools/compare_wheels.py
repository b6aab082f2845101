"""Compare two wheels byte for byte and say where they differ (build_tools/check_reproducible.sh).

    python build_tools/compare_wheels.py A.whl B.whl [--forbid TEXT ...]

Prints both sha256s. When they differ, lists the zip members that are only in one wheel, whose
bytes differ (with the first differing offset, and a line diff for text members), or whose zip
metadata (order, timestamp, permissions, compression) differs, and fails when a wheel's members
do not all carry one date (file times of the checkout would differ on another machine). `--forbid` names strings (build
and source paths) that must not occur in any member of either wheel: a path baked into a binary
or the manifest makes wheels built elsewhere differ even when two builds here agree.
Exit status: 0 identical and clean, 1 otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import sys
import zipfile


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def zip_meta(info: zipfile.ZipInfo) -> tuple:
    return (info.date_time, oct(info.external_attr >> 16), info.compress_type, info.create_system, info.extra)


def describe_difference(name: str, a: bytes, b: bytes) -> str:
    if len(a) != len(b):
        where = f"sizes {len(a)} and {len(b)}"
    else:
        first = next(i for i in range(len(a)) if a[i] != b[i])
        count = sum(x != y for x, y in zip(a, b))
        where = f"same size {len(a)}, {count} bytes differ, first at offset {first}"
    text = ""
    if name.endswith((".json", ".py", ".txt", "METADATA", "RECORD", "WHEEL")):
        try:
            # The manifest is one compact JSON line: split it so the diff shows the field.
            lines_a = a.decode().replace(",", ",\n").splitlines()
            lines_b = b.decode().replace(",", ",\n").splitlines()
            diff = list(difflib.unified_diff(lines_a, lines_b, "first", "second", n=0, lineterm=""))
            text = "\n".join("      " + line for line in diff[:20])
        except UnicodeDecodeError:
            pass
    return f"  content differs: {name} ({where})" + ("\n" + text if text else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--forbid", action="append", default=[], metavar="TEXT")
    args = parser.parse_args()

    ok = True
    hashes = [sha256(args.first), sha256(args.second)]
    print(f"sha256 {hashes[0]}  {args.first}")
    print(f"sha256 {hashes[1]}  {args.second}")
    with zipfile.ZipFile(args.first) as za, zipfile.ZipFile(args.second) as zb:
        infos_a, infos_b = za.infolist(), zb.infolist()
        names_a, names_b = [i.filename for i in infos_a], [i.filename for i in infos_b]
        for name in sorted(set(names_a) - set(names_b)):
            print(f"  only in the first: {name}")
        for name in sorted(set(names_b) - set(names_a)):
            print(f"  only in the second: {name}")
        common = [n for n in names_a if n in set(names_b)]
        if [n for n in names_b if n in set(names_a)] != common:
            print("  the members are stored in a different order")
        meta_b = {i.filename: i for i in infos_b}
        differing = 0
        for info in infos_a:
            if info.filename not in meta_b:
                continue
            other = meta_b[info.filename]
            data_a, data_b = za.read(info), zb.read(other)
            if data_a != data_b:
                differing += 1
                print(describe_difference(info.filename, data_a, data_b))
            elif zip_meta(info) != zip_meta(other):
                differing += 1
                print(f"  zip metadata differs: {info.filename}: {zip_meta(info)} vs {zip_meta(other)}")
        if set(names_a) != set(names_b) or differing:
            ok = False
        for text in filter(None, args.forbid):
            needle = text.encode()
            for z, label in ((za, "first"), (zb, "second")):
                for info in z.infolist():
                    if needle in z.read(info):
                        ok = False
                        print(f"  {label} wheel: {info.filename} contains the path {text!r}")
        # Same dates here could still be checkout dates that another clone would not share:
        # a reproducible wheel stamps every member with one date (SOURCE_DATE_EPOCH or fixed).
        for z, label in ((za, "first"), (zb, "second")):
            dates = sorted({i.date_time for i in z.infolist()})
            if len(dates) > 1:
                ok = False
                print(f"  {label} wheel: members carry {len(dates)} dates (file times leak in): {dates[:3]}")
        print(f"  {len(names_a)} and {len(names_b)} members, {differing} of the common ones differ")
    if hashes[0] != hashes[1]:
        ok = False
    print("REPRODUCIBLE: identical wheels" if ok else "NOT REPRODUCIBLE (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
