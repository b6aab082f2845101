"""grad_w_reduce: the engram gate's weight gradients from engram_gate_bwd's per-CTA partials.

Validate, launch (kernels_tl/engram/grad_w_reduce.py); CPU tensors take the reference
(tilebake.torch.engram.grad_w_reduce_ref), which adds in the same order.
"""

from __future__ import annotations

import dataclasses

import torch

from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, i32, ptr
from tilebake.engram._common import check_same_device, check_tensor, check_weight_pair, dense


@dataclasses.dataclass(frozen=True)
class GradWReduceVariant(Variant):
    family = "engram"
    op = "grad_w_reduce"
    PARAMS = ptr("P", "WH", "WE", "GWH", "GWE") + i32("num_partials", "num_cols")

    weight_dtype: str  # 'bf16'

    @classmethod
    def all(cls):
        return (cls("bf16"),)


@dataclasses.dataclass(frozen=True)
class GradWReduceAscendVariant(Variant):
    """The Ascend 950 kernel (kernels_tl/ascend/engram/grad_w_reduce.py): the reference's order."""

    family = "engram"
    op = "grad_w_reduce"
    backend = "ascend"
    PARAMS = GradWReduceVariant.PARAMS

    num_vec_cores: int

    @classmethod
    def all(cls):
        return tuple(cls(cores) for cores in ASCEND_VEC_CORES)


_KERNELS = KernelTable(GradWReduceVariant)
_PLANS = plan.cache()


def grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """grad_weight_hidden += S * weight_embed and grad_weight_embed += S * weight_hidden in place,
    S the sum of grad_w_partial's (P, hc, H) fp32 partials in order (any P >= 1). Weights: bf16
    (hc, H); gradient buffers: fp32 (hc, H), contiguous."""
    if not torch.compiler.is_compiling():
        try:
            call = _PLANS["bf16"]
        except KeyError:
            pass
        else:
            if plan.run(call, grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) is None:
                return
    check_weight_pair(weight_hidden, weight_embed)
    check_tensor(grad_w_partial, "grad_w_partial", (torch.float32,), 3)
    shape = tuple(weight_hidden.shape)
    if grad_w_partial.shape[1:] != shape or grad_w_partial.shape[0] < 1:
        raise ValueError(f"grad_w_partial must be (num_partials >= 1, {shape[0]}, {shape[1]}), got {tuple(grad_w_partial.shape)}")
    for name, t in (("grad_weight_hidden", grad_weight_hidden), ("grad_weight_embed", grad_weight_embed)):
        check_tensor(t, name, (torch.float32,), 2)
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must be {shape} (the weights' shape), got {tuple(t.shape)}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned (it is updated in place)")
        check_same_device(name, t, weight_hidden, "weight_hidden")
    check_same_device("grad_w_partial", grad_w_partial, weight_hidden, "weight_hidden")
    if torch.compiler.is_compiling():
        torch.ops.tilebake.grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden,
                                         grad_weight_embed)  # fmt: skip
        return
    if weight_hidden.device.type == "npu":  # the Ascend kernel
        from tilebake.engram._engram_ascend import grad_w_reduce_npu

        grad_w_reduce_npu(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
        return
    numel = weight_hidden.numel()
    if not weight_hidden.is_cuda or numel % 4:
        from tilebake.torch.engram import grad_w_reduce_ref

        grad_w_reduce_ref(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed)
        return
    p, wh, we = dense(grad_w_partial), dense(weight_hidden), dense(weight_embed)
    _KERNELS["bf16",](wh.get_device(), p.data_ptr(), wh.data_ptr(), we.data_ptr(), grad_weight_hidden.data_ptr(),
                      grad_weight_embed.data_ptr(), p.shape[0], numel)  # fmt: skip
    torch.autograd.graph.increment_version([grad_weight_hidden, grad_weight_embed])
    plan.remember(_PLANS, "bf16", _plan, _KERNELS["bf16",], wh.get_device())


def _plan(kernel, device):
    """run(partials (P, hc, H), wh, we (hc, H) bf16, grad_wh, grad_we (hc, H) fp32): contiguous, aligned."""
    b = plan.Builder()
    p = b.tensor(0, torch.float32, ("P", "hc", "H"), strides=("hc * H", "H", 1))
    names = ("wh", "we", "gh", "ge")
    dtypes = (torch.bfloat16, torch.bfloat16, torch.float32, torch.float32)
    wh, we, gh, ge = (b.tensor(i + 1, dt, (f"{n}_r", f"{n}_c"), strides=(f"{n}_c", 1)) for i, (n, dt) in enumerate(zip(names, dtypes)))
    b.check(" and ".join(f"{n}_r == hc and {n}_c == H" for n in names))
    b.check("P >= 1 and hc >= 1 and hc <= 8 and (hc * H) % 4 == 0 and P * hc * H < 2147483648")
    b.disjoint(gh, ge)
    b.launch(kernel, device, P=p, WH=wh, WE=we, GWH=gh, GWE=ge, num_partials="P", num_cols="hc * H")
    b.bump(gh)
    b.bump(ge)
    b.returns(None)
    return b.build()


register(
    "grad_w_reduce(Tensor grad_w_partial, Tensor weight_hidden, Tensor weight_embed, Tensor(a!) grad_weight_hidden, "
    "Tensor(b!) grad_weight_embed) -> ()",
    lambda *args: grad_w_reduce(*args),
    lambda *args: None,
)
