"""Call plans (tilebake/_runtime/plan.py) of the router ops: topk_gate, normalize_weight,
moe_topk_gate_forward, moe_topk_gate_backward. Each repeats its op's CUDA path for one call key:
the same checks (or stricter: those calls take the Python path), allocations, kernel arguments
and result. Built by the op after its Python path launched with that key."""

from __future__ import annotations

import torch

from tilebake._runtime import plan
from tilebake.moe.moe_topk_gate_forward import (
    FLAG_BIAS,
    FLAG_FIX,
    FLAG_IMAGE,
    FLAG_MAP,
    FLAG_MASK,
    FLAG_RANDOM,
    FLAG_SCORES,
    FLAG_UNMAPPED,
)


def rows(b, arg, dtype, shape, name: str):
    """A 2-D tensor of `shape` whose last dim is contiguous (where it has more than one
    element), any row stride: binds `name` to the row stride."""
    t = b.tensor(arg, dtype, shape, strides=(name, f"{name}_c"), align=dtype.itemsize)
    b.check(f"{shape[1]} == 1 or {name}_c == 1")
    return t


def contiguous(b, arg, dtype, shape, name: str):
    """A contiguous 1-D or 2-D tensor (torch's is_contiguous: dims of size 1 take any stride)."""
    strides = (f"{name}_0", f"{name}_1")[: len(shape)]
    t = b.tensor(arg, dtype, shape, strides=strides, align=dtype.itemsize)
    if len(shape) == 1:
        b.check(f"{shape[0]} == 1 or {name}_0 == 1")
    else:
        b.check(f"({shape[1]} == 1 or {name}_1 == 1) and ({shape[0]} == 1 or {name}_0 == {shape[1]})")
    return t


def topk_gate_plan(kernel, device, num_experts: int, num_topk: int):
    """topk_gate(scores, num_topk) with scores of num_experts columns."""
    b = plan.Builder()
    s = rows(b, 0, torch.float32, ("T", num_experts), "ss")
    b.check("T >= 1")
    out = b.alloc(torch.int64, ("T", num_topk))
    b.launch(
        kernel, device, S=s, Out=out, num_tokens="T", num_experts=num_experts, num_topk=num_topk, scores_stride="ss"
    )
    b.returns(out)
    return b.build()


def normalize_weight_plan(kernel, device):
    b = plan.Builder()
    w = rows(b, 0, torch.float32, ("T", "K"), "ws")
    b.check("T >= 1 and K >= 1 and K <= 32")
    denominator = b.alloc(torch.float32, ("T",))
    normalized = b.alloc(torch.float32, ("T", "K"))
    b.launch(kernel, device, W=w, D=denominator, N=normalized, num_tokens="T", num_topk="K", w_stride="ws")
    b.returns((denominator, normalized))
    return b.build()


def backward_plan(kernel, device, num_experts, rsf: float, scoring: int, has_mask, has_aux, given_out):
    """moe_topk_gate_backward(scores, topk_idx, topk_weights, grad_topk_weights, rsf, func, mask,
    grad_scores_sum, out): run() takes the five tensors (None where absent)."""
    E = num_experts
    b = plan.Builder()
    u = rows(b, 0, torch.float32, ("T", E), "us")
    idx = rows(b, 1, torch.int64, ("T", "K"), "is")
    b.check(f"T >= 1 and K >= 1 and K <= {min(E, 32)}")
    tw = rows(b, 2, torch.float32, ("T", "K"), "ws")
    g = rows(b, 3, torch.float32, ("T", "K"), "gs")
    mask = u
    if has_mask:
        mask = b.tensor(4, torch.bool, ("T",), strides=("ms",), align=1)
        b.check("T == 1 or ms == 1")
    h = u  # absent: a valid dummy pointer, never read
    if has_aux:
        h = rows(b, 5, torch.float32, ("S", E), "hs")
        b.check("S >= 1 and T % S == 0")
    else:
        b.let("S", 1)
        b.let("hs", "us")
    if given_out:
        dx = rows(b, 6, torch.float32, ("T", E), "os")
    else:
        dx = b.alloc(torch.float32, ("T", E))
        b.let("os", E)
    b.launch(
        kernel, device, U=u, IDX=idx, TW=tw, G=g, MASK=mask, H=h, DX=dx, routed_scaling_factor=rsf,
        scoring=scoring, has_mask=int(has_mask), has_aux=int(has_aux), tokens_per_seq="T // S", num_tokens="T",
        num_experts=E, num_topk="K", num_seqs="S", scores_stride="us", idx_stride="is", w_stride="ws",
        g_stride="gs", h_stride="hs", out_stride="os",
    )  # fmt: skip
    if given_out:
        b.bump(dx)
    b.returns(dx)
    return b.build()


# moe_topk_gate_forward's optional tensors, in run()'s argument order after logits:
# (name, dtype, shape kind, flag). Shape kinds: 'T' bool (T,), 'E' fp32 (E,), 'L' int32 (E + shared,).
FORWARD_OPTIONAL = (
    ("mask", FLAG_MASK), ("bias", FLAG_BIAS), ("image_bias", FLAG_IMAGE), ("image_token_mask", FLAG_IMAGE),
    ("fix_routing_mask", FLAG_FIX), ("to_physical_map", FLAG_MAP), ("logical_count", FLAG_MAP),
    ("unmapped_topk_idx", FLAG_UNMAPPED), ("force_random", FLAG_RANDOM), ("scores", FLAG_SCORES),
)  # fmt: skip


def forward_plan(kernel, device, num_experts, k, shared, rsf, ep_rank, num_groups, num_topk_groups, present,
                 given_out):  # fmt: skip
    """moe_topk_gate_forward: run(plan, logits, (mask, bias, image_bias, image_token_mask,
    fix_routing_mask, to_physical_map, logical_count, unmapped_topk_idx, force_random, scores),
    out). present: the names of the optional tensors given."""
    E, W = num_experts, k + shared
    b = plan.Builder()
    logits = rows(b, 0, torch.float32, ("T", E), "ls")
    b.check("T >= 1")
    refs, flags = {}, 0
    for i, (name, flag) in enumerate(FORWARD_OPTIONAL):
        if name not in present:
            continue
        flags |= flag
        arg = (1, i)
        if name in ("mask", "image_token_mask", "fix_routing_mask", "force_random"):
            refs[name] = contiguous(b, arg, torch.bool, ("T",), name)
        elif name in ("bias", "image_bias"):
            refs[name] = contiguous(b, arg, torch.float32, (E,), name)
        elif name == "logical_count":
            refs[name] = contiguous(b, arg, torch.int32, (E + shared,), name)
        elif name == "to_physical_map":
            refs[name] = rows(b, arg, torch.int32, (E + shared, "dup"), "map_s")
            b.check("dup >= 1")
        elif name == "unmapped_topk_idx":
            refs[name] = rows(b, arg, torch.int64, ("T", k), "u_s")
        else:  # scores
            refs[name] = rows(b, arg, torch.float32, ("T", E), "s_s")
    if given_out:
        idx = contiguous(b, (2, 0), torch.int64, ("T", W), "oi")
        weights = contiguous(b, (2, 1), torch.float32, ("T", W), "ow")
    else:
        idx = b.alloc(torch.int64, ("T", W))
        weights = b.alloc(torch.float32, ("T", W))
    for sym in ("dup", "map_s", "u_s", "s_s"):
        if sym not in b.regs:
            b.let(sym, 1 if sym == "dup" else 0)

    def ptr(name):  # an absent tensor's pointer: logits' (never read: its flag is off)
        return refs.get(name, logits)

    b.launch(
        kernel, device, L=logits, Bias=ptr("bias"), ImageBias=ptr("image_bias"), Mask=ptr("mask"),
        ImageMask=ptr("image_token_mask"), FixMask=ptr("fix_routing_mask"), Random=ptr("force_random"),
        Map=ptr("to_physical_map"), Count=ptr("logical_count"), Unmapped=ptr("unmapped_topk_idx"), OutIdx=idx,
        OutW=weights, Scores=ptr("scores"), flags=flags, scaling=rsf, ep_rank=ep_rank, num_groups=num_groups,
        num_topk_groups=num_topk_groups, num_tokens="T", num_experts=E, num_topk=k, width=W, dup="dup",
        l_stride="ls", s_stride="s_s", u_stride="u_s", map_stride="map_s",
    )  # fmt: skip
    for t in forward_written(refs, idx, weights, given_out):
        b.bump(t)
    b.returns((idx, weights))
    return b.build()


def forward_written(refs, idx, weights, given_out):
    """The given tensors the forward writes: out, unmapped_topk_idx (unless every row is
    fixed: counted anyway), scores."""
    written = [idx, weights] if given_out else []
    return written + [refs[n] for n in ("unmapped_topk_idx", "scores") if n in refs]
