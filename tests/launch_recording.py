"""Which device each kernel is launched or resolved for (tests/test_launch_device.py and
tests/test_two_gpus.py): the Python path's launches (loader.Kernel.__call__) and the call plans'
kernel resolutions (plan._resolve, once per plan, kernel and device) are recorded as
(kind, variant id, device index)."""

import contextlib

from tilebake._runtime import loader, plan


@contextlib.contextmanager
def recorded_launches():
    """A list that fills with ("launch" or "plan", variant id, device index) while in the block.
    Plans are cleared on entry (so the plans built inside resolve through the recorder) and on exit
    (so none built with it outlives the block)."""
    records = []
    launch, resolve = loader.Kernel.__call__, plan._resolve

    def recorded_launch(self, device_index, *args):
        records.append(("launch", self.variant.id, device_index))
        return launch(self, device_index, *args)

    def recorded_resolve(kernel, spec, device_index):
        records.append(("plan", kernel.variant.id, device_index))
        return resolve(kernel, spec, device_index)

    loader.Kernel.__call__, plan._resolve = recorded_launch, recorded_resolve
    plan.clear_all()
    try:
        yield records
    finally:
        loader.Kernel.__call__, plan._resolve = launch, resolve
        plan.clear_all()


def not_on(records, device_index: int) -> list:
    """The records of another device than `device_index`."""
    return [r for r in records if r[2] != device_index]
