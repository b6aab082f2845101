"""bench/sanitize.sh's report: the sanitizer's errors (the sum of its per-process ERROR SUMMARY
lines, and the first few error lines), the replayed calls that raised, and, from the variant logs,
the compiled variants of the installed kernel package for this GPU's arch that no call loaded
(GPU only).

    python3 bench/sanitize_report.py TOOL LOG VARIANT_LOG...
"""

import collections
import re
import sys
from pathlib import Path

import torch

from tilebake._runtime import loader


def main():
    tool, log, variant_logs = sys.argv[1], Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
    text = log.read_text(errors="replace")
    # memcheck / initcheck / synccheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: H
    # hazards displayed (N errors, W warnings)" (its warnings counted as errors here too).
    summaries = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", text)]
    race = r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)"
    summaries += [int(e) + int(w) for e, w in re.findall(race, text)]
    kinds = r"=+ (Invalid|Race|Uninitialized|Barrier|Error|Warning)"
    errors = [line for line in text.splitlines() if re.search(kinds, line)]
    arch = loader.device_arch(torch.cuda.current_device())
    built = {vid for vid, entries in loader.manifest()["kernels"].items() if arch in entries}
    reached = {line.strip() for p in variant_logs if p.exists() for line in p.read_text().splitlines() if line.strip()}
    missing = sorted(built - reached)
    by_op = collections.Counter(v.split(".")[0] for v in missing)
    print(f"# compute-sanitizer {tool}: {sum(summaries)} errors in {len(summaries)} processes\n")
    for line in errors[:20]:
        print(f"    {line}")
    raised = [line for line in text.splitlines() if line.startswith("FAILED ")]
    print(f"\n{len(raised)} replayed calls raised")
    for line in raised[:20]:
        print(f"    {line}")
    loaded = len(reached & built)
    print(f"\nVariants ({arch}): {len(built)} built, {loaded} loaded, {len(missing)} not reached")
    for op, count in sorted(by_op.items()):
        print(f"- {op}: {count} not reached")
    for v in missing:
        print(f"    {v}")


if __name__ == "__main__":
    main()
