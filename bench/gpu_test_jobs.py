"""Split the test suite into pytest jobs for bench/run_on_device.sh (TEST_JOBS=FILE): one line a
job, node ids separated by spaces, at most --chunk tests of one test function a job, so that the
GPU machine's cores run the host-bound GPU tests in parallel.

    python bench/gpu_test_jobs.py > .carry/test_jobs.txt      # on the build host
"""

import argparse
import subprocess
import sys
from itertools import groupby


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", type=int, default=40)
    parser.add_argument("--marker", default="gpu", help="pytest -m expression (default: gpu; '' for all)")
    parser.add_argument("paths", nargs="*", default=["tests"])
    args = parser.parse_args()
    listing = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            args.marker,
            *args.paths,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    node_ids = [line for line in listing.splitlines() if "::" in line]
    for function, group in groupby(node_ids, key=lambda n: n.split("[")[0]):
        group = list(group)
        if any(" " in n for n in group):  # ids with spaces cannot be listed: the whole function, one job
            print(function)
            continue
        for start in range(0, len(group), args.chunk):
            print(" ".join(group[start : start + args.chunk]))


if __name__ == "__main__":
    main()
