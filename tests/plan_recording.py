"""Helpers of the op plan tests that compare a traced plan with the op's Python kernel path:
that path runs on CPU tensors with a Recorder in place of the kernel, and the two launches'
arguments are compared with pointers named by the tensor they point at."""

import torch

from tests.plan_helpers import params_of


class Recorder:
    """A stand-in kernel: records the arguments (by name) of each call the Python path makes."""

    def __init__(self, variant):
        self.variant, self.calls = variant, []

    def __call__(self, device, *args):
        self.calls.append(dict(zip(self.variant.arg_names, args)))


class RecordingTable(dict):
    """A KernelTable stand-in: table[key](device, *args) records {name: arg} (the key's variant's
    declared order) in table.calls instead of launching, so a test runs the Python path's launch."""

    def __init__(self, variant_type):
        super().__init__()
        self.variant_type, self.calls = variant_type, []

    def __missing__(self, key):
        names = self.variant_type(*key).arg_names
        return lambda device, *args: self.calls.append(dict(zip(names, args)))


def labeled(kernel, values: dict, tensors: dict) -> dict:
    """A launch's arguments with pointers named by the tensor they point at (pointers into no
    given tensor, e.g. a work buffer's: relative to the first such), floats as fp32."""
    names, kinds = kernel.spec[:2]
    ptrs = {}
    for label, t in tensors.items():
        ptrs.setdefault(t.data_ptr(), label)
    base, out = None, {}
    for name, kind in zip(names, kinds):
        v = values[name]
        if kind == "p":
            if v in ptrs:
                v = ptrs[v]
            else:
                base = v if base is None else base
                v = ("work", v - base)
        elif kind == "f":
            v = float(torch.tensor(v, dtype=torch.float32))
        out[name] = v
    return out


def same_layout(got, want, strides=True):
    """Equal shapes, dtypes and (strides=True) strides; strides=False for the reference's
    results, whose strides of size-1 dims may differ from the kernel path's."""
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            same_layout(g, w, strides)
    else:
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
        assert got.stride() == want.stride() if strides else got.is_contiguous() == want.is_contiguous()


def check_launches(kernels, launches, recorded, plan_tensors, py_tensors):
    assert [launch[0] for launch in launches] == list(range(len(kernels)))
    for kernel, launch, rec in zip(kernels, launches, recorded):
        assert labeled(kernel, params_of(kernel, launch), plan_tensors) == labeled(kernel, rec, py_tensors)
