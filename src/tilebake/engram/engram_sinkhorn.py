"""The Engram Sinkhorn optimizer helpers: the momentum update, one row-normalisation step with
its column sums of squares (per-CTA partials, then their reduction in a fixed order), and the
final scaled matrix.

Validate, allocate, launch (kernels_tl/engram/engram_sinkhorn.py, one kernel per stage); CPU
tensors take the references (tilebake.torch.engram). beta1, nesterov, eps, alpha and every size
are runtime arguments (the original compiles beta1, nesterov, eps and alpha in).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from tilebake import config
from tilebake._library import register
from tilebake._runtime import plan
from tilebake._runtime.loader import KernelTable
from tilebake._variants import ASCEND_VEC_CORES, Variant, f32, i32, ptr
from tilebake.engram._common import check_same_device, check_tensor, dense
from tilebake.utils import FORMAT_NAMES

MAX_COLS = 8192  # head_dim limit of step and finalize: a row's columns stay in registers
# The step's persistent CTAs (and partial rows) per SM: as many as fit at once (the kernel asks
# ptxas for that occupancy: a row's columns, col_scale's and the partial sums in registers).
STEP_CTAS_PER_SM = 2

_STAGE_PARAMS = {
    "momentum": ptr("G", "MB", "OUT") + f32("beta1", "one_minus_beta1") + i32("nesterov", "numel"),
    "step": ptr("M", "RS", "CS", "NORM", "P") + f32("eps") + i32("num_rows", "num_cols", "num_ctas"),
    "step_reduce": ptr("P", "OUT") + i32("num_partials", "num_cols"),
    "finalize": ptr("M", "RS", "CS", "OUT") + f32("eps", "alpha") + i32("num_rows", "num_cols"),
}


@dataclasses.dataclass(frozen=True)
class EngramSinkhornVariant(Variant):
    family = "engram"
    op = "engram_sinkhorn"

    stage: str  # 'momentum' | 'step' | 'step_reduce' | 'finalize'
    grad_dtype: str = "fp32"  # momentum: 'bf16' | 'fp32'
    momentum_dtype: str = "fp32"

    @classmethod
    def all(cls):
        momentum = [cls("momentum", g, m) for g in ("bf16", "fp32") for m in ("bf16", "fp32")]
        return (*momentum, cls("step"), cls("step_reduce"), cls("finalize"))

    def params(self):
        return _STAGE_PARAMS[self.stage]


@dataclasses.dataclass(frozen=True)
class EngramSinkhornAscendVariant(Variant):
    """The Ascend 950 kernels (kernels_tl/ascend/engram/engram_sinkhorn.py) of every stage: the
    momentum, step (rows of at most MAX_COLS columns), step_reduce and finalize."""

    family = "engram"
    op = "engram_sinkhorn"
    backend = "ascend"

    stage: str  # 'momentum' | 'step' | 'step_reduce' | 'finalize'
    grad_dtype: str
    momentum_dtype: str
    num_vec_cores: int

    @classmethod
    def all(cls):
        stages = [("momentum", g, m) for g in ("bf16", "fp32") for m in ("bf16", "fp32")]
        stages += [("step_reduce", "fp32", "fp32"), ("finalize", "fp32", "fp32"), ("step", "fp32", "fp32")]
        return tuple(cls(*stage, cores) for stage in stages for cores in ASCEND_VEC_CORES)

    def params(self):
        return _STAGE_PARAMS[self.stage]


_KERNELS = KernelTable(EngramSinkhornVariant)
# Call plans by stage and key (the scalars with their classes: 1 and True are equal keys).
_PLANS = plan.cache()
_FLOATS = (torch.bfloat16, torch.float32)


def _check_float(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    return float(value)


def engram_sinkhorn_momentum_update(
    grad: torch.Tensor, momentum_buffer: torch.Tensor, beta1: float, nesterov: bool = True
) -> torch.Tensor:
    """momentum_buffer = (1 - beta1) grad + beta1 momentum_buffer, in place (in its dtype); returns
    the fp32 Sinkhorn input: beta1 m + (1 - beta1) grad (nesterov) or m. grad and momentum_buffer:
    bf16 or fp32, the same shape (any), contiguous; each product and sum rounded to fp32 on its own."""
    if not torch.compiler.is_compiling():  # dynamo can neither hash the key nor trace the native call
        try:
            call = _PLANS["momentum", grad.dtype, momentum_buffer.dtype, beta1, beta1.__class__, nesterov,
                          nesterov.__class__, grad.ndim]  # fmt: skip
        except (KeyError, AttributeError, TypeError):
            pass
        else:
            result = plan.run(call, grad, momentum_buffer)
            if result is not NotImplemented:
                return result
    check_tensor(grad, "grad", _FLOATS)
    check_tensor(momentum_buffer, "momentum_buffer", _FLOATS)
    if momentum_buffer.shape != grad.shape:
        raise ValueError(f"momentum_buffer must have grad's shape {tuple(grad.shape)}, got {tuple(momentum_buffer.shape)}")
    check_same_device("momentum_buffer", momentum_buffer, grad, "grad")
    if not momentum_buffer.is_contiguous() or momentum_buffer.data_ptr() % 16:
        raise ValueError("momentum_buffer must be contiguous and 16-byte aligned (it is updated in place)")
    beta1 = _check_float(beta1, "beta1")
    if not isinstance(nesterov, bool):
        raise TypeError(f"nesterov must be a bool, got {nesterov!r}")
    if grad.numel() >= 2**31:
        raise ValueError(f"grad must have fewer than 2^31 elements, got {grad.numel()}")
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.engram_sinkhorn_momentum_update(grad, momentum_buffer, beta1, nesterov)
    if grad.device.type == "npu":  # the Ascend kernel
        from tilebake.engram._engram_ascend import sinkhorn_momentum_npu

        return sinkhorn_momentum_npu(grad, momentum_buffer, beta1, _one_minus(beta1), nesterov)
    if not grad.is_cuda:
        from tilebake.torch.engram import engram_sinkhorn_momentum_update_ref

        return engram_sinkhorn_momentum_update_ref(grad, momentum_buffer, beta1, nesterov)
    out = torch.empty(grad.shape, dtype=torch.float32, device=grad.device)
    if grad.numel():
        g = dense(grad)
        key = ("momentum", FORMAT_NAMES[grad.dtype], FORMAT_NAMES[momentum_buffer.dtype])
        _KERNELS[key](g.get_device(), g.data_ptr(), momentum_buffer.data_ptr(), out.data_ptr(), beta1,
                      _one_minus(beta1), int(nesterov), g.numel())  # fmt: skip
        torch.autograd.graph.increment_version(momentum_buffer)
        if grad.ndim == 1:
            plan.remember(_PLANS, ("momentum", grad.dtype, momentum_buffer.dtype, beta1, float, nesterov, bool, 1),
                          _momentum_plan, _KERNELS[key], g.get_device(), grad.dtype, momentum_buffer.dtype, beta1,
                          nesterov)  # fmt: skip
    return out


def _one_minus(beta1: float) -> float:
    """1 - beta1 rounded to fp32, as torch rounds the reference's Python scalar."""
    return float(torch.tensor(1 - beta1, dtype=torch.float32))


def _momentum_plan(kernel, device, g_dtype, m_dtype, beta1, nesterov):
    """run(grad, momentum_buffer): both (n,), contiguous, 16-byte aligned, 1 <= n < 2^31."""
    b = plan.Builder()
    g = b.tensor(0, g_dtype, ("n",), strides=(1,))
    m = b.tensor(1, m_dtype, ("n2",), strides=(1,))
    b.check("n >= 1 and n2 == n and n < 2147483648")
    b.disjoint(g, m)
    out = b.alloc(torch.float32, ("n",))
    b.launch(kernel, device, G=g, MB=m, OUT=out, beta1=beta1, one_minus_beta1=_one_minus(beta1),
             nesterov=int(nesterov), numel="n")  # fmt: skip
    b.bump(m)
    b.returns(out)
    return b.build()


def _check_matrix(matrix, row_scale, col_scale, eps):
    check_tensor(matrix, "matrix", (torch.float32,), 2)
    check_tensor(row_scale, "row_scale", (torch.float32,), 1)
    check_tensor(col_scale, "col_scale", (torch.float32,), 1)
    rows, cols = matrix.shape
    if row_scale.shape != (rows,):
        raise ValueError(f"row_scale must be ({rows},) (matrix's rows), got {tuple(row_scale.shape)}")
    if col_scale.shape != (cols,):
        raise ValueError(f"col_scale must be ({cols},) (matrix's columns), got {tuple(col_scale.shape)}")
    check_same_device("row_scale", row_scale, matrix, "matrix")
    check_same_device("col_scale", col_scale, matrix, "matrix")
    if matrix.is_cuda and (cols % 4 or not 0 < cols <= MAX_COLS):
        raise ValueError(f"matrix's columns must be a multiple of 4 in [4, {MAX_COLS}] on CUDA, got {cols}")
    if rows * cols >= 2**31:
        raise ValueError(f"matrix must have fewer than 2^31 elements, got {rows * cols}")
    return _check_float(eps, "eps")


def _num_partials(matrix) -> int:
    """The step's partial rows: its persistent CTAs on CUDA, min(2 x SMs, R); on an NPU a row a
    vector core, min(vector cores, R) (1 where the reference runs: rows over MAX_COLS columns);
    1 on the CPU or for R = 0."""
    if matrix.device.type == "cpu" or matrix.shape[0] == 0:
        return 1
    if matrix.device.type == "npu":
        if matrix.shape[1] > MAX_COLS:
            return 1
        from tilebake._runtime import ascend

        return min(ascend.vector_cores(ascend.device_index(matrix)), matrix.shape[0])
    return min(STEP_CTAS_PER_SM * config.get_num_sms(), matrix.shape[0])


def engram_sinkhorn_step(matrix, row_scale, col_scale, eps: float):
    """One Sinkhorn row step of diag(row_scale) matrix diag(col_scale) (matrix fp32 (R, D)):
    returns (row_norm (R,): each row's L2 norm before the step, col_sumsq_partial (P, D): the
    column sums of squares after it, in P partial rows, for engram_sinkhorn_step_reduce);
    row_scale /= row_norm + eps in place. P = min(2 x SMs, R) on CUDA, min(vector cores, R) on an
    NPU (1 on the CPU, for R = 0, or on an NPU for rows over MAX_COLS columns: the reference)."""
    if not torch.compiler.is_compiling():
        try:
            call = _PLANS["step", eps, eps.__class__]
        except (KeyError, TypeError):
            pass
        else:
            result = plan.run(call, matrix, row_scale, col_scale)
            if result is not NotImplemented:
                return result
    eps = _check_matrix(matrix, row_scale, col_scale, eps)
    if not row_scale.is_contiguous():
        raise ValueError("row_scale must be contiguous (it is updated in place)")
    if torch.compiler.is_compiling():
        return torch.ops.tilebake.engram_sinkhorn_step(matrix, row_scale, col_scale, eps)
    rows, cols = matrix.shape
    if matrix.device.type == "npu" and rows and cols <= MAX_COLS:  # the Ascend kernel
        from tilebake.engram._engram_ascend import sinkhorn_step_npu

        return sinkhorn_step_npu(matrix, row_scale, col_scale, eps)
    if not matrix.is_cuda or rows == 0:
        from tilebake.torch.engram import engram_sinkhorn_step_ref

        return engram_sinkhorn_step_ref(matrix, row_scale, col_scale, eps)
    num_ctas = _num_partials(matrix)
    norm = torch.empty(rows, dtype=torch.float32, device=matrix.device)
    partial = torch.empty((num_ctas, cols), dtype=torch.float32, device=matrix.device)
    m, cs = dense(matrix), dense(col_scale)
    _KERNELS["step", "fp32", "fp32"](m.get_device(), m.data_ptr(), row_scale.data_ptr(), cs.data_ptr(), norm.data_ptr(),
                                     partial.data_ptr(), eps, rows, cols, num_ctas)  # fmt: skip
    torch.autograd.graph.increment_version(row_scale)
    plan.remember(_PLANS, ("step", eps, float), _step_plan, _KERNELS["step", "fp32", "fp32"], m.get_device(), eps,
                  config.get_num_sms())  # fmt: skip
    return norm, partial


def _matrix_args(b: plan.Builder):
    """matrix (R, D) contiguous, row_scale (R,), col_scale (D,): arguments 0-2 as _check_matrix takes them."""
    m = b.tensor(0, torch.float32, ("R", "D"), strides=("D", 1))
    rs = b.tensor(1, torch.float32, ("R1",), strides=(1,), align=4)
    cs = b.tensor(2, torch.float32, ("D1",), strides=(1,))
    b.check(f"R >= 1 and R1 == R and D1 == D and D % 4 == 0 and 4 <= D and D <= {MAX_COLS} and R * D < 2147483648")
    return m, rs, cs


def _step_plan(kernel, device, eps, num_sms):
    """run(matrix, row_scale, col_scale) -> (row_norm, partials); num_sms: config's, at build."""
    b = plan.Builder()
    m, rs, cs = _matrix_args(b)
    b.let("P", f"min(R, {STEP_CTAS_PER_SM * num_sms})")
    norm = b.alloc(torch.float32, ("R",))
    partial = b.alloc(torch.float32, ("P", "D"))
    b.launch(kernel, device, M=m, RS=rs, CS=cs, NORM=norm, P=partial, eps=eps, num_rows="R", num_cols="D",
             num_ctas="P")  # fmt: skip
    b.bump(rs)
    b.returns((norm, partial))
    return b.build()


def engram_sinkhorn_step_reduce(col_sumsq_partial: torch.Tensor, col_sumsq: torch.Tensor) -> None:
    """col_sumsq (D,) = the sum of col_sumsq_partial's (P, D) rows, in one fixed order (in place):
    tilebake.torch.engram.sum_partials."""
    if not torch.compiler.is_compiling():
        try:
            call = _PLANS["step_reduce"]
        except KeyError:
            pass
        else:
            if plan.run(call, col_sumsq_partial, col_sumsq) is None:
                return
    check_tensor(col_sumsq_partial, "col_sumsq_partial", (torch.float32,), 2)
    check_tensor(col_sumsq, "col_sumsq", (torch.float32,), 1)
    parts, cols = col_sumsq_partial.shape
    if col_sumsq.shape != (cols,):
        raise ValueError(f"col_sumsq must be ({cols},) (the partials' columns), got {tuple(col_sumsq.shape)}")
    check_same_device("col_sumsq", col_sumsq, col_sumsq_partial, "col_sumsq_partial")
    if torch.compiler.is_compiling():
        torch.ops.tilebake.engram_sinkhorn_step_reduce(col_sumsq_partial, col_sumsq)
        return
    if col_sumsq.device.type == "npu" and parts and col_sumsq.is_contiguous():  # the Ascend kernel
        from tilebake.engram._engram_ascend import sinkhorn_step_reduce_npu

        sinkhorn_step_reduce_npu(col_sumsq_partial, col_sumsq)
        return
    if not col_sumsq.is_cuda or cols % 4 or parts == 0 or not col_sumsq.is_contiguous() or col_sumsq.data_ptr() % 16:
        from tilebake.torch.engram import engram_sinkhorn_step_reduce_ref

        if parts == 0:
            col_sumsq.zero_()
        else:
            engram_sinkhorn_step_reduce_ref(col_sumsq_partial, col_sumsq)
        return
    p = dense(col_sumsq_partial)
    _KERNELS["step_reduce", "fp32", "fp32"](p.get_device(), p.data_ptr(), col_sumsq.data_ptr(), parts, cols)
    torch.autograd.graph.increment_version(col_sumsq)
    plan.remember(_PLANS, "step_reduce", _step_reduce_plan, _KERNELS["step_reduce", "fp32", "fp32"], p.get_device())


def _step_reduce_plan(kernel, device):
    """run(partials (P, D), col_sumsq (D,)): contiguous, 16-byte aligned, P >= 1, D % 4 == 0."""
    b = plan.Builder()
    p = b.tensor(0, torch.float32, ("P", "D"), strides=("D", 1))
    out = b.tensor(1, torch.float32, ("D1",), strides=(1,))
    b.check("P >= 1 and D1 == D and D >= 4 and D % 4 == 0 and P * D < 2147483648")
    b.launch(kernel, device, P=p, OUT=out, num_partials="P", num_cols="D")
    b.bump(out)
    b.returns(None)
    return b.build()


def engram_sinkhorn_finalize(matrix, row_scale, col_scale, eps: float, alpha: float,
                             out: Optional[torch.Tensor] = None) -> torch.Tensor:  # fmt: skip
    """alpha * diag(row_scale / (row_norm + eps)) matrix diag(col_scale), row_norm the L2 norms of
    diag(row_scale) matrix diag(col_scale)'s rows: fp32 (R, D), into `out` when given (returned)."""
    if not torch.compiler.is_compiling():
        try:
            call = _PLANS["finalize", eps, eps.__class__, alpha, alpha.__class__, out is None]
        except (KeyError, TypeError):
            pass
        else:
            result = plan.run(call, matrix, row_scale, col_scale, out)
            if result is not NotImplemented:
                return result
    eps = _check_matrix(matrix, row_scale, col_scale, eps)
    alpha = _check_float(alpha, "alpha")
    if out is not None:
        check_tensor(out, "out", (torch.float32,), 2)
        if out.shape != matrix.shape:
            raise ValueError(f"out must have matrix's shape {tuple(matrix.shape)}, got {tuple(out.shape)}")
        check_same_device("out", out, matrix, "matrix")
    if torch.compiler.is_compiling():
        result = torch.ops.tilebake.engram_sinkhorn_finalize(matrix, row_scale, col_scale, eps, alpha)
        return result if out is None else out.copy_(result)
    if matrix.device.type == "npu":  # the Ascend kernel
        from tilebake.engram._engram_ascend import sinkhorn_finalize_npu

        return sinkhorn_finalize_npu(matrix, row_scale, col_scale, eps, alpha, out)
    if not matrix.is_cuda:
        from tilebake.torch.engram import engram_sinkhorn_finalize_ref

        return engram_sinkhorn_finalize_ref(matrix, row_scale, col_scale, eps, alpha, out)
    rows, cols = matrix.shape
    target = out if out is not None and out.is_contiguous() and out.data_ptr() % 16 == 0 else None
    result = target if target is not None else torch.empty((rows, cols), dtype=torch.float32, device=matrix.device)
    if rows:
        m, rs, cs = dense(matrix), dense(row_scale), dense(col_scale)
        _KERNELS["finalize", "fp32", "fp32"](m.get_device(), m.data_ptr(), rs.data_ptr(), cs.data_ptr(),
                                             result.data_ptr(), eps, alpha, rows, cols)  # fmt: skip
    if out is None or target is not None:
        plan.remember(_PLANS, ("finalize", eps, float, alpha, float, out is None), _finalize_plan,
                      _KERNELS["finalize", "fp32", "fp32"], matrix.get_device(), eps, alpha, out is not None)  # fmt: skip
    if out is None:
        return result
    if target is None:
        out.copy_(result)
    else:
        torch.autograd.graph.increment_version(out)
    return out


def _finalize_plan(kernel, device, eps, alpha, given):
    """run(matrix, row_scale, col_scale, out): out None, or (given) (R, D) contiguous and aligned."""
    b = plan.Builder()
    m, rs, cs = _matrix_args(b)
    if given:
        out = b.tensor(3, torch.float32, ("R3", "D3"), strides=("D3", 1))
        b.check("R3 == R and D3 == D")
    else:
        out = b.alloc(torch.float32, ("R", "D"))
    b.launch(kernel, device, M=m, RS=rs, CS=cs, OUT=out, eps=eps, alpha=alpha, num_rows="R", num_cols="D")
    if given:
        b.bump(out)
    b.returns(out)
    return b.build()


# --- torch.library: lets torch.compile(fullgraph=True) trace each call as one op ---

register(
    "engram_sinkhorn_momentum_update(Tensor grad, Tensor(a!) momentum_buffer, float beta1, bool nesterov) -> Tensor",
    lambda g, m, beta1, nesterov: engram_sinkhorn_momentum_update(g, m, beta1, nesterov),
    lambda g, m, beta1, nesterov: torch.empty(g.shape, dtype=torch.float32, device=g.device),
)
register(
    "engram_sinkhorn_step(Tensor matrix, Tensor(a!) row_scale, Tensor col_scale, float eps) -> (Tensor, Tensor)",
    lambda m, rs, cs, eps: engram_sinkhorn_step(m, rs, cs, eps),
    lambda m, rs, cs, eps: (m.new_empty(m.shape[:1]), m.new_empty((_num_partials(m), m.shape[1]))),
)
register(
    "engram_sinkhorn_step_reduce(Tensor col_sumsq_partial, Tensor(a!) col_sumsq) -> ()",
    lambda p, c: engram_sinkhorn_step_reduce(p, c),
    lambda p, c: None,
)
register(
    "engram_sinkhorn_finalize(Tensor matrix, Tensor row_scale, Tensor col_scale, float eps, float alpha) -> Tensor",
    lambda m, rs, cs, eps, alpha: engram_sinkhorn_finalize(m, rs, cs, eps, alpha),
    lambda m, rs, cs, eps, alpha: torch.empty_like(m),
)
