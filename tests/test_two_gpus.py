"""Two GPUs of one host (issue 19). Every op (its doctor smoke case, tilebake._smoke) runs with its
tensors on one GPU while the other is the current device, both ways: every kernel is launched or
resolved for the tensors' device and the case's own checks pass, on the Python path (first call)
and through the call plan (second call); the plans built for one GPU then serve the other. Two
threads, each bound to one GPU, first-call every op at once in a fresh process: both get the right
results and each GPU loads its own binaries. (Mixed cuda:0 / cuda:1 inputs: test_mixed_devices.py.)"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.helpers import TWO_GPUS
from tests.launch_recording import not_on, recorded_launches
from tilebake import _smoke

pytestmark = [pytest.mark.gpu, TWO_GPUS]

CASES = sorted(_smoke.SMOKE_CASES)
DIRECTIONS = {"on1-current0": (1, 0), "on0-current1": (0, 1)}


@pytest.mark.parametrize("tensors,current", DIRECTIONS.values(), ids=DIRECTIONS.keys())
@pytest.mark.parametrize("op", CASES)
def test_an_op_runs_on_its_tensors_gpu(op, tensors, current):
    case = _smoke.SMOKE_CASES[op]
    with recorded_launches() as records:
        with torch.cuda.device(current):
            for _ in range(2):  # the first call takes the Python path, the second its call plan
                case(torch.device("cuda", tensors))
            torch.cuda.synchronize(tensors)
        first = list(records)
        records.clear()
        # The plans just built for one GPU, called with the other's tensors (the roles swapped).
        with torch.cuda.device(tensors):
            case(torch.device("cuda", current))
            torch.cuda.synchronize(current)
    assert first and records, f"{op}: no kernel launched or resolved"
    wrong = not_on(first, tensors)
    assert not wrong, f"{op}: tensors on cuda:{tensors}, cuda:{current} current; for another device: {wrong[:5]}"
    wrong = not_on(records, current)
    assert not wrong, f"{op}: cuda:{tensors}'s plans with cuda:{current}'s tensors; for another device: {wrong[:5]}"


# A fresh process (no binary loaded yet): one thread per GPU, each in torch.cuda.device(i), released
# together by a barrier, runs every smoke case twice (the Python path, then the call plans) in the
# same order, so that both first-call each op at about the same time.
THREADS = textwrap.dedent("""
    import json, threading, torch
    from tilebake import _smoke
    from tilebake._runtime import loader

    loaded_before = len(loader._modules)
    barrier = threading.Barrier(2)
    failures = {0: [], 1: []}

    def work(i):
        device = torch.device("cuda", i)
        with torch.cuda.device(i):
            barrier.wait()
            for round in range(2):
                for op, case in sorted(_smoke.SMOKE_CASES.items()):
                    try:
                        case(device)
                        torch.cuda.synchronize(device)
                    except Exception as e:  # every op reported, not only the first failure
                        failures[i].append(f"call {round + 1} of {op}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # loader._modules: (binary path, sha256, device index) -> the module loaded there
    binaries = {i: sorted({path for path, _, d in loader._modules if d == i}) for i in (0, 1)}
    print(json.dumps({"loaded_before": loaded_before, "failures": failures, "binaries": binaries}))
""")


def test_threads_first_call_every_op_on_their_own_gpu():
    paths = os.pathsep.join(p for p in sys.path if p)  # this tilebake and tests package, as here
    result = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": paths})  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded_before"] == 0, "binaries were loaded before the threads started"
    assert report["failures"] == {"0": [], "1": []}, report["failures"]
    on0, on1 = report["binaries"]["0"], report["binaries"]["1"]
    assert on0, "no binary loaded on cuda:0"
    assert on0 == on1, f"binaries loaded on one GPU only: {sorted(set(on0) ^ set(on1))[:5]}"
