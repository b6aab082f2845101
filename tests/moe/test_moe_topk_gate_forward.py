"""moe_topk_gate_forward (and its alias moe_topk_gate): the CPU path, out=, empty inputs, the
argument checks (op and reference), torch.compile, the variant set and the constants shared with
the reference; on a GPU the kernel against the reference: indices bit-exact on inputs whose top-k
boundary gaps exceed 1e-6 (plus exact ties), weights and scores within rtol 1e-5. The reference
against an independent brute force: test_moe_topk_gate_forward_reference.py."""

import math

import pytest
import torch

import tilebake
from tests.helpers import poison_, poison_allocator_
from tests.moe.gate_forward_helpers import (
    ALL,
    FUNCS,
    assert_gate_equal,
    call_both,
    make_options,
    separated_logits,
    unscored_rows,
)
from tilebake.torch import moe_topk_gate_forward_ref


def test_cpu_path_alias_out_and_empty():
    logits = torch.randn(11, 40)
    opts = make_options(11, 40, 4, 1, ALL - {"fix"})
    ref = moe_topk_gate_forward_ref(logits, 4, True, 1, 2.0, 1, **opts)
    got = tilebake.moe.moe_topk_gate_forward(logits, 4, True, 1, 2.0, 1, **opts)
    alias = tilebake.moe.moe_topk_gate(logits, 4, True, 1, 2.0, 1, **opts)
    out = (torch.empty(11, 5, dtype=torch.int64), torch.empty(11, 5))
    res = tilebake.moe.moe_topk_gate_forward(logits, 4, True, 1, 2.0, 1, **opts, out=out)
    assert res[0] is out[0] and res[1] is out[1]
    for pair in (got, alias, out):
        assert torch.equal(pair[0], ref[0]) and torch.equal(pair[1], ref[1])
    idx, w = tilebake.moe.moe_topk_gate_forward(torch.empty(0, 40), 4, True, 1, 2.0, 1)
    assert idx.shape == (0, 5) and w.shape == (0, 5)


def check_torch_compile(device, backend):
    """torch.compile(fullgraph=True) traces the op through its torch.library schema (mutating
    unmapped_topk_idx and scores, filling an out pair); same results as eager."""
    num_tokens, num_experts, k = 29, 64, 6
    logits = torch.randn(num_tokens, num_experts, device=device)
    opts = make_options(num_tokens, num_experts, k, 1, ALL, device=device)

    def run(logits, unmapped, scores, out):
        o = dict(opts, unmapped_topk_idx=unmapped)
        a = tilebake.moe.moe_topk_gate_forward(logits, k, True, 1, 2.0, 3, "softmax", scores=scores, **o)
        b = tilebake.moe.moe_topk_gate(logits, k, True, 1, 2.0, 3, "softmax", out=out, num_groups=8, num_topk_groups=2)
        return a, b

    results = []
    for f in (run, torch.compile(run, fullgraph=True, backend=backend)):
        unmapped = opts["unmapped_topk_idx"].clone()
        scores = torch.empty(num_tokens, num_experts, device=device)
        out = (
            torch.empty(num_tokens, k + 1, dtype=torch.int64, device=device),
            torch.empty(num_tokens, k + 1, device=device),
        )
        (a, b) = f(logits, unmapped, scores, out)
        results.append((a, b, unmapped, scores, out))
    (a, b, unmapped, scores, out), (ca, cb, cunmapped, cscores, cout) = results
    for x, y in (
        (a[0], ca[0]),
        (a[1], ca[1]),
        (b[0], cb[0]),
        (unmapped, cunmapped),
        (scores, cscores),
        (out[0], cout[0]),
        (out[1], cout[1]),
    ):
        assert torch.equal(x, y)
    assert torch.equal(cout[0], cb[0]) and not torch.equal(unmapped, opts["unmapped_topk_idx"])


def test_cpu_torch_compile_fullgraph_traces_without_breaks():
    check_torch_compile("cpu", "aot_eager")


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(logits=torch.randn(4, 8).double()), TypeError, "logits must be torch.float32"),
        (dict(logits=torch.randn(4, 8193)), ValueError, r"1 to 8192 experts"),
        (dict(logits=torch.randn(8, 4).t()), ValueError, "logits must have a contiguous last dimension"),
        (dict(num_topk=9), ValueError, r"num_topk must be an int in \[1, 8\]"),
        (dict(num_topk=0), ValueError, r"num_topk must be an int in \[1, 8\]"),
        (dict(num_shared_experts=3), ValueError, "num_shared_experts must be 0, 1 or 2"),
        (dict(logits=torch.randn(4, 64), num_topk=31, use_shared_as_routed=True, num_shared_experts=2), ValueError,
         "num_topk \\+ shared slots must be at most 32"),
        (dict(scoring_func="relu"), ValueError, "scoring_func must be one of"),
        (dict(ep_rank=-1), ValueError, "ep_rank must be an int"),
        (dict(routed_scaling_factor=math.inf), ValueError, "routed_scaling_factor must be finite"),
        (dict(routed_scaling_factor="2"), TypeError, "routed_scaling_factor must be a real number"),
        (dict(use_shared_as_routed=1), TypeError, "use_shared_as_routed must be a bool"),
        (dict(mask=torch.ones(4)), ValueError, "mask must be a torch.bool tensor of shape \\(4,\\)"),
        (dict(bias=torch.zeros(7)), ValueError, "bias must be a torch.float32 tensor of shape \\(8,\\)"),
        (dict(bias=torch.full((8,), math.nan)), ValueError, "bias must be finite"),
        (dict(image_bias=torch.zeros(8)), ValueError, "image_bias and image_token_mask must be given together"),
        (dict(fix_routing_mask=torch.ones(4, dtype=torch.bool)), ValueError, "fix_routing_mask requires unmapped"),
        (dict(unmapped_topk_idx=torch.zeros(4, 2, dtype=torch.int32)), ValueError,
         "unmapped_topk_idx must be a torch.int64 tensor of shape \\(4, 2\\)"),
        (dict(to_physical_map=torch.zeros(8, 2, dtype=torch.int32)), ValueError, "must be given together"),
        (dict(to_physical_map=torch.zeros(9, 2, dtype=torch.int32), logical_count=torch.ones(9, dtype=torch.int32)),
         ValueError, "to_physical_map must be a torch.int32 tensor of shape \\(8, 2\\)"),
        (dict(out=(torch.empty(4, 2, dtype=torch.int64), torch.empty(4, 3))), ValueError,
         "out\\[1\\] must be a torch.float32 tensor of shape \\(4, 2\\)"),
        (dict(scores=torch.empty(4, 7)), ValueError, "scores must be a torch.float32 tensor of shape \\(4, 8\\)"),
        (dict(num_groups=3), ValueError, "num_groups=3 must divide the 8 experts"),
        (dict(num_groups=8), ValueError, "groups of at least 2"),
        (dict(num_groups=4, num_topk_groups=5), ValueError, r"num_topk_groups must be an int in \[1, 4\]"),
        (dict(num_groups=4, num_topk_groups=1, num_topk=3), ValueError, "num_topk=3 exceeds the experts of the kept"),
        (dict(num_topk_groups=2), ValueError, "num_topk_groups must be 1 when num_groups is 1"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("fn", ["ref", "op"])
def test_bad_arguments(kwargs, error, match, fn):
    args = dict(logits=torch.randn(4, 8), num_topk=2, use_shared_as_routed=False, num_shared_experts=0,
                routed_scaling_factor=1.0, ep_rank=0)  # fmt: skip
    args.update(kwargs)
    f = moe_topk_gate_forward_ref if fn == "ref" else tilebake.moe.moe_topk_gate_forward
    with pytest.raises(error, match=match):
        f(**args)


def test_variants():
    from tilebake.moe.moe_topk_gate_forward import EXPERT_BOUNDS, MoeTopkGateForwardVariant, expert_bound

    ids = [v.id for v in MoeTopkGateForwardVariant.all()]
    assert len(ids) == 9 and len(set(ids)) == 9
    assert [expert_bound(n) for n in (1, 256, 257, 512, 513, 8192)] == [256, 256, 512, 512, 8192, 8192]
    assert EXPERT_BOUNDS[-1] == tilebake.moe._router.MAX_EXPERTS


# ---------------------------------------------------------------- GPU: kernel vs reference


GPU_SHAPES = [  # (tokens, experts, k, use_shared, num_shared, num_groups, num_topk_groups)
    (1, 8, 1, False, 0, 1, 1),
    (8001, 256, 8, True, 1, 1, 1),
    (8001, 256, 8, False, 0, 8, 4),
    (127, 512, 32, False, 0, 1, 1),
    (333, 512, 16, True, 2, 32, 4),
    (999, 72, 6, True, 2, 1, 1),
    (77, 160, 30, True, 2, 1, 1),
    (500, 64, 4, True, 1, 8, 2),
    (257, 33, 5, False, 0, 1, 1),
    (64, 12, 12, True, 1, 3, 3),
    (1000, 512, 8, False, 0, 8, 4),
    (300, 96, 5, False, 0, 3, 1),
    (513, 600, 8, True, 1, 1, 1),  # one CTA per token from here (more than 512 experts)
    (300, 1024, 32, False, 0, 8, 3),
    (129, 2000, 13, True, 2, 20, 5),  # groups of 100: not whole slots
    (257, 8192, 8, False, 0, 32, 4),
    (65, 8192, 30, True, 2, 1, 1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("which", ["none", "bias", "all"])
def test_gpu_kernel_matches_reference(func, shape, which):
    num_tokens, num_experts, k, use_shared, num_shared, groups, top_groups = shape
    shared = num_shared if use_shared else 0
    names = {"none": set(), "bias": {"bias"}, "all": ALL}[which]
    opts = make_options(num_tokens, num_experts, k, shared, names, device="cuda")
    # Separation uses the text-token bias; image tokens use their own bias: separate for both.
    logits = separated_logits(num_tokens, num_experts, k, func, opts.get("bias"), groups, top_groups)
    if "image_bias" in opts:
        img = separated_logits(num_tokens, num_experts, k, func, opts["image_bias"], groups, top_groups)
        logits = torch.where(opts["image_token_mask"].cpu()[:, None], img, logits)
    logits = logits.cuda()
    poison_allocator_("cuda")
    got, ref = call_both(
        tilebake.moe.moe_topk_gate_forward, logits, k, use_shared, num_shared, 1.5, 3, func, opts,
        num_groups=groups, num_topk_groups=top_groups,
    )  # fmt: skip
    assert_gate_equal(got, ref, zero_rows=unscored_rows(opts, num_tokens))


@pytest.mark.gpu
@pytest.mark.parametrize("func", FUNCS)
def test_gpu_non_finite_strided_and_out(func):
    num_tokens, num_experts, k = 2049, 200, 7
    wide = torch.empty(num_tokens, 264, device="cuda")
    logits = wide[:, 40:240]
    logits.copy_(separated_logits(num_tokens, num_experts, k, func).cuda())
    bad = torch.zeros(num_tokens, dtype=torch.bool)
    for t, v in ((0, math.nan), (5, math.inf), (6, -math.inf), (2048, math.nan), (77, math.nan)):
        logits[t, t % num_experts] = v
        bad[t] = True
    opts = make_options(num_tokens, num_experts, k, 2, ALL, device="cuda")
    opts["unmapped_topk_idx"] = torch.empty(num_tokens, 20, dtype=torch.int64, device="cuda")[:, 3 : 3 + k]
    opts["unmapped_topk_idx"].copy_(torch.stack([torch.randperm(num_experts)[:k] for _ in range(num_tokens)]))
    results = []
    for f in (tilebake.moe.moe_topk_gate_forward, moe_topk_gate_forward_ref):
        o = dict(opts)
        o["unmapped_topk_idx"] = opts["unmapped_topk_idx"].clone()
        out = (poison_(torch.empty(num_tokens, k + 2, dtype=torch.int64, device="cuda")),
               poison_(torch.empty(num_tokens, k + 2, device="cuda")))  # fmt: skip
        scores = poison_(torch.empty(num_tokens, 300, device="cuda"))[:, 50:250]
        idx, w = f(logits, k, True, 2, 2.0, 11, func, out=out, scores=scores, **o)
        assert idx is out[0] and w is out[1]
        results.append((idx, w, o["unmapped_topk_idx"], scores))
    assert_gate_equal(results[0], results[1], bad, unscored_rows(opts, num_tokens))
    routed = opts["mask"].cpu() & ~bad
    assert (results[0][0].cpu()[~routed] == -1).all()


@pytest.mark.gpu
def test_gpu_65536_tokens_deepseek_v3():
    num_tokens, num_experts, k = 65536, 256, 8
    bias = torch.randint(0, 3, (num_experts,)).float()
    logits = separated_logits(num_tokens, num_experts, k, "sigmoid", bias, 8, 4, ties=True).cuda()
    opts = {"bias": bias.cuda(), "unmapped_topk_idx": torch.empty(num_tokens, k, dtype=torch.int64, device="cuda")}
    fn = tilebake.moe.moe_topk_gate_forward
    got, ref = call_both(fn, logits, k, False, 0, 2.5, 0, "sigmoid", opts, num_groups=8, num_topk_groups=4)
    assert_gate_equal(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("num_experts,k", [(32, 32), (8, 8), (512, 32), (300, 3)])
def test_gpu_force_random_every_token(num_experts, k):
    num_tokens = 4097
    logits = torch.randn(num_tokens, num_experts, device="cuda")
    opts = {"force_random": torch.ones(num_tokens, dtype=torch.bool, device="cuda")}
    got, ref = call_both(tilebake.moe.moe_topk_gate_forward, logits, k, False, 0, 1.0, 123, "sqrtsoftplus", opts)
    assert_gate_equal(got, ref, zero_rows=torch.ones(num_tokens, dtype=torch.bool))
    assert all(len(set(r)) == k for r in got[0][:64].tolist())


@pytest.mark.gpu
def test_gpu_alias_empty_and_nan_bias_stays_in_bounds():
    logits = torch.randn(0, 64, device="cuda")
    idx, w = tilebake.moe.moe_topk_gate(logits, 4, True, 1, 1.0, 0)
    assert idx.shape == (0, 5) and w.shape == (0, 5)
    logits = torch.randn(100, 64, device="cuda")
    bias = torch.full((64,), math.nan, device="cuda")
    bias[:10] = 0.0
    idx, w = tilebake.moe.moe_topk_gate_forward(logits, 8, False, 0, 1.0, 0, bias=bias)
    torch.cuda.synchronize()
    assert ((idx == -1) | ((idx >= 0) & (idx < 64))).all()  # unspecified, but in range, and no hang


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    check_torch_compile("cuda", "inductor")


def test_constants_agree_with_the_reference_and_names_stay_functions():
    import importlib

    from tilebake._hash import GOLDEN
    from tilebake.moe import _router
    from tilebake.torch import gate, topk

    # One home (tilebake.moe._router): the op, its kernels and the reference share the objects.
    mod = importlib.import_module("tilebake.moe.moe_topk_gate_forward")
    assert mod.SCORING_FUNCS is topk.SCORING_FUNCS is _router.SCORING_FUNCS
    assert mod.check_gate_args is gate.check_gate_args is _router.check_gate_args
    assert (gate.DRAWS_PER_SLOT, gate.PHYSICAL_STRIDE, gate.GOLDEN) == (64, 23333, 0x9E3779B9) == (
        _router.DRAWS_PER_SLOT, _router.PHYSICAL_STRIDE, GOLDEN
    )  # fmt: skip
    assert callable(tilebake.moe.moe_topk_gate_forward) and tilebake.moe.moe_topk_gate_forward.__name__ == (
        "moe_topk_gate_forward"
    )
    assert tilebake.moe.moe_topk_gate.__name__ == "moe_topk_gate"
