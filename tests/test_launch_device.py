"""Every launch goes to the tensors' device, not the current one (issue 18's multi-device work on
one GPU; two real GPUs: tests/test_two_gpus.py). Each doctor smoke case (every op) runs on cuda:0
while torch.cuda.current_device() claims device 1: a launch, a stream or a binary taken from the
current device would name device 1 (and fail: there is none), so every kernel must be resolved and
launched for device 0 and the case's own checks must pass."""

import pytest
import torch

import tilebake
from tests.launch_recording import not_on, recorded_launches
from tilebake import _smoke

CASES = sorted(_smoke.SMOKE_CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("op", CASES)
def test_launches_use_the_tensors_device(monkeypatch, op):
    sms = tilebake.config.get_device_num_sms()
    with recorded_launches() as records:
        monkeypatch.setattr(tilebake.config, "get_device_num_sms", lambda: sms)  # (SM counts: config's)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
        try:
            for _ in range(2):  # the first call takes the Python path, the second its call plan
                _smoke.SMOKE_CASES[op](torch.device("cuda:0"))
        finally:
            monkeypatch.undo()
    wrong = not_on(records, 0)
    assert not wrong, f"{op}: kernels resolved or launched for another device than the tensors': {wrong[:5]}"
