"""moe_topk_gate_forward's test inputs and comparison, shared by its CPU and GPU tests
(test_moe_topk_gate_forward*.py), the emulated kernels' tests, the Ascend emulated router tests,
tests/test_under_load.py and bench/gate_candidates.py: random valid options, logits whose top-k
boundaries are well separated, both implementations called on their own copies, and the GPU
tolerances (indices bit-exact, weights and scores within rtol 1e-5)."""

import math

import torch

from tilebake.torch import moe_topk_gate_forward_ref

FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")
ALL = {"mask", "bias", "image", "unmapped", "fix", "random", "map"}  # every option make_options can add
# Separated inputs: no two distinct selection values (or group scores) this close at the top-k
# boundary, 10x the 1e-6 the original uses, far above the few-ulp score differences of two
# implementations (scores lie in (0, 1), bias tiers 1.0 apart).
MIN_GAP = 1e-5


# ---------------------------------------------------------------- inputs


def make_options(num_tokens, num_experts, k, shared, which, device="cpu", dup=3):
    """Optional arguments named in `which` (a set), random but valid."""
    opts = {}
    r = torch.rand
    if "mask" in which:
        opts["mask"] = r(num_tokens) > 0.2
    if "bias" in which:
        opts["bias"] = torch.randint(0, 3, (num_experts,)).float()  # tiers 1.0 apart: scores lie in (0, 1)
    if "image" in which:
        opts["image_bias"] = torch.randint(0, 3, (num_experts,)).float()
        opts["image_token_mask"] = r(num_tokens) > 0.5
    if "unmapped" in which or "fix" in which:
        opts["unmapped_topk_idx"] = torch.stack([torch.randperm(num_experts)[:k] for _ in range(num_tokens)])
    if "fix" in which:
        opts["fix_routing_mask"] = r(num_tokens) > 0.6
    if "random" in which:
        opts["force_random"] = r(num_tokens) > 0.7
    if "map" in which:
        num_logical = num_experts + shared
        opts["to_physical_map"] = torch.randint(0, 4 * num_logical, (num_logical, dup), dtype=torch.int32)
        opts["logical_count"] = torch.randint(1, dup + 1, (num_logical,), dtype=torch.int32)
    return {n: t.to(device) for n, t in opts.items()}


def separated_logits(num_tokens, num_experts, k, func, bias=None, num_groups=1, num_topk_groups=1, ties=True):
    """fp32 logits whose selection values (score + bias, float64) have no gap in (0, MIN_GAP] among
    the top k + 1 (and, grouped, among the group scores), so a last-ulp difference between two
    implementations' score arithmetic cannot reorder them; a third of the rows get an exact tie
    (a copy of the row's best logit on an expert of equal bias)."""
    bias64 = torch.zeros(num_experts, dtype=torch.float64) if bias is None else bias.double().cpu()
    # Softmax scores of E experts are ~1/E: a wider logit range keeps thousands of them separated.
    step = (5.0 if func != "softmax" else max(5.0, 0.004 * num_experts)) / num_experts

    def rows(n):
        x = -5.0 + torch.argsort(torch.rand(n, num_experts), dim=1).double() * step
        x = x + torch.rand(n, num_experts, dtype=torch.float64) * step * 0.25
        return x.float()

    def scores64(x):
        x = x.double()
        if func == "sqrtsoftplus":
            return torch.sqrt(torch.nn.functional.softplus(x))
        if func == "softmax":
            return torch.softmax(x, dim=1)
        return torch.sigmoid(x)

    def bad_gaps(v, upto):
        top = torch.sort(v, dim=1, descending=True).values[:, : upto + 1]
        gaps = top[:, :-1] - top[:, 1:]
        return ((gaps > 0) & (gaps <= MIN_GAP)).any(dim=1)

    def check(x):
        sel = scores64(x) + bias64
        if num_groups == 1:
            return bad_gaps(sel, min(k, num_experts - 1))
        size = num_experts // num_groups
        grouped = sel.view(-1, num_groups, size)
        top2 = torch.sort(grouped, dim=2, descending=True).values[:, :, :2].sum(dim=2)
        bad = bad_gaps(top2, min(num_topk_groups, num_groups - 1))
        kept = torch.sort(top2, dim=1, descending=True, stable=True).indices[:, :num_topk_groups]
        keep = torch.zeros_like(top2, dtype=torch.bool).scatter_(1, kept, True).repeat_interleave(size, dim=1)
        masked = torch.where(keep, sel, -math.inf)
        return bad | bad_gaps(masked, min(k, num_topk_groups * size - 1))

    x = rows(num_tokens)
    if ties and num_experts > 1:
        sel = scores64(x) + bias64
        best = sel.argmax(dim=1)
        for t in range(0, num_tokens, 3):
            same = (bias64 == bias64[best[t]]).nonzero()[:, 0]
            other = same[torch.randint(0, same.numel(), (1,))].item()
            x[t, other] = x[t, best[t]]
    for _ in range(50):
        bad = check(x)
        if not bad.any():
            return x
        x[bad] = rows(int(bad.sum()))
    raise AssertionError("could not build well-separated logits")


# ---------------------------------------------------------------- calling both, comparing


def call_both(fn, logits, k, use_shared, num_shared, rsf, ep_rank, func, opts, **kw):
    """(tilebake result, reference result), each with its own copies of the in/out tensors."""
    outs = []
    for f in (fn, moe_topk_gate_forward_ref):
        o = {n: (t.clone() if n in ("unmapped_topk_idx",) else t) for n, t in opts.items()}
        scores = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        idx, w = f(logits, k, use_shared, num_shared, rsf, ep_rank, func, scores=scores, **o, **kw)
        outs.append((idx, w, o.get("unmapped_topk_idx"), scores))
    return outs


def unscored_rows(opts, num_tokens):
    """The rows whose scores must be 0: masked out, or force_random (among the unmasked)."""
    rows = torch.zeros(num_tokens, dtype=torch.bool)
    if "mask" in opts:
        rows |= ~opts["mask"].cpu()
    if "force_random" in opts:
        rows |= opts["force_random"].cpu()
    return rows


def assert_gate_equal(got, ref, bad_rows=None, zero_rows=None):
    """Indices (and unmapped) bit-exact, weights and scores within rtol 1e-5; the messages name the
    first differing token and slot. bad_rows: the non-finite tokens (NaN scores rows unless in
    zero_rows); zero_rows: the rows whose scores must be exactly 0."""
    (idx, w, unmapped, scores), (r_idx, r_w, r_unmapped, r_scores) = got, ref
    diff = (idx != r_idx).nonzero()
    if diff.numel():
        t, s = diff[0].tolist()
        raise AssertionError(
            f"topk_idx: {diff.shape[0]} slots differ; first token {t} slot {s}: got {idx[t].tolist()}, "
            f"ref {r_idx[t].tolist()}"
        )
    if unmapped is not None:
        diff = (unmapped != r_unmapped).nonzero()
        if diff.numel():
            t, s = diff[0].tolist()
            got_row, ref_row = unmapped[t].tolist(), r_unmapped[t].tolist()
            raise AssertionError(f"unmapped_topk_idx: token {t}: got {got_row}, ref {ref_row}")
    assert not w.isnan().any(), f"topk_weights NaN at {w.isnan().nonzero()[:5].tolist()}"
    torch.testing.assert_close(w, r_w, rtol=1e-5, atol=1e-7, msg=lambda m: f"topk_weights: {m}")
    nan_rows = scores.isnan().all(dim=1)
    assert torch.equal(scores.isnan(), r_scores.isnan()), "scores: NaN pattern differs"
    if zero_rows is not None:
        zero_rows = zero_rows.to(scores.device)
        assert (scores[zero_rows] == 0).all(), "scores: a masked-out or random row is not 0"
        assert not (scores[~zero_rows] == 0).all(dim=1).any() or scores.shape[1] == 0, "scores: a scored row is 0"
    if bad_rows is not None:
        bad_rows = bad_rows.to(scores.device)
        if zero_rows is not None:
            bad_rows = bad_rows & ~zero_rows
        assert torch.equal(nan_rows, bad_rows), "scores: NaN rows are not the non-finite tokens"
    torch.testing.assert_close(scores, r_scores, rtol=1e-5, atol=1e-7, equal_nan=True, msg=lambda m: f"scores: {m}")
