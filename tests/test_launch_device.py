"""Every launch goes to the tensors' device, not the current one (issue 18's multi-device work on
one GPU; two real GPUs: issue 19). Each doctor smoke case (every op) runs on cuda:0 while
torch.cuda.current_device() claims device 1: a launch, a stream or a binary taken from the current
device would name device 1 (and fail: there is none), so every kernel must be resolved and launched
for device 0 and the case's own checks must pass."""

import pytest
import torch

import tilebake
from tilebake import _smoke
from tilebake._runtime import loader, plan

CASES = sorted(_smoke.SMOKE_CASES)


@pytest.mark.gpu
@pytest.mark.parametrize("op", CASES)
def test_launches_use_the_tensors_device(monkeypatch, op):
    devices = []
    launch = loader.Kernel.__call__

    def recorded_launch(self, device_index, *args):
        devices.append(("launch", self.variant.id, device_index))
        return launch(self, device_index, *args)

    resolve = plan._resolve

    def recorded_resolve(kernel, spec, device_index):  # a call plan's kernel, per call's device
        devices.append(("plan", kernel.variant.id, device_index))
        return resolve(kernel, spec, device_index)

    sms = tilebake.config.get_device_num_sms()
    monkeypatch.setattr(loader.Kernel, "__call__", recorded_launch)
    monkeypatch.setattr(plan, "_resolve", recorded_resolve)
    monkeypatch.setattr(tilebake.config, "get_device_num_sms", lambda: sms)  # (SM counts: config's)
    plan.clear_all()  # plans built from here resolve through the recording function
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    try:
        for _ in range(2):  # the first call takes the Python path, the second its call plan
            _smoke.SMOKE_CASES[op](torch.device("cuda:0"))
    finally:
        monkeypatch.undo()
        plan.clear_all()
    wrong = [d for d in devices if d[2] != 0]
    assert not wrong, f"{op}: kernels resolved or launched for another device than the tensors': {wrong[:5]}"
