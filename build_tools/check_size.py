"""Size gate: fail when any distribution file (wheel or sdist) is over the limit.

    python build_tools/check_size.py [--max-mb 100] dist/*

PyPI's default file limit is 100 MB; a payload wheel that grows past it has to be split, so
CI stops it before a release does. Prints every file's size either way.
"""

import argparse
import sys
from pathlib import Path

MB = 1_000_000


def oversized(paths: list[Path], max_mb: float) -> list[str]:
    """One message per file over the limit (empty: all pass)."""
    return [
        f"{p.name}: {p.stat().st_size / MB:.1f} MB > {max_mb:g} MB" for p in paths if p.stat().st_size > max_mb * MB
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--max-mb", type=float, default=100.0)
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        print(f"check_size: not files: {', '.join(missing)}", file=sys.stderr)
        return 2
    for p in args.files:
        print(f"{p.stat().st_size / MB:9.2f} MB  {p.name}")
    errors = oversized(args.files, args.max_mb)
    for e in errors:
        print(f"check_size: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
