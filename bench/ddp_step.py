"""One data-parallel training step through tilebake's ops on two processes (issue 19).

    python bench/ddp_step.py                       # nccl, one process per GPU where 2 GPUs are; else gloo
    python bench/ddp_step.py --backend gloo        # two CPU processes (tilebake's reference path)
    torchrun --nproc-per-node 2 bench/ddp_step.py  # the same, started by torchrun

Each rank builds the same seeded weights and batch and takes its own shard of the batch. The step:

    streams = expand_from_embedding(embedding)                      tilebake.modeling.mhc
    streams = engram_gate(streams, kv, weight_hidden, weight_embed) tilebake.modeling.engram
    x, (post, comb) = mhc_pre(streams, fn, scale, base)             tilebake.modeling.mhc
    idx, w = moe_topk_gate_forward(x @ router)                      tilebake.moe (backward: moe_topk_gate_backward)
    xq = cast_back(per_token_cast(x))                               tilebake.quant (e4m3, straight-through gradient)
    y = xq * (the chosen experts' gains, weighted by w)
    loss = mse(mhc_post(y, streams, post, comb), target)            tilebake.modeling.mhc

then backward, and the gradients (fp32) are all-reduced and averaged. Checks: (a) every rank holds
bit-identical averaged gradients and loss (all_gather); (b) they equal, bit for bit, a one-process
run of the same inputs on each rank's own device (every shard's step, summed in rank order, over
the world size; bit-exact for two ranks, where the all-reduce's one addition has no order). A
JSON summary is printed by rank 0; the exit status is 1 on a mismatch. On CUDA the script also
checks that the ops' kernels ran (not the reference path).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tilebake
from tilebake.modeling import mhc
from tilebake.modeling.engram import engram_gate

HIDDEN, MULT, EXPERTS, TOPK, RSF = 256, 4, 8, 2, 1.5
CLAMP, EPS = 0.01, 1e-6  # clamp: the gate's gradient is 0 where |d| < clamp
PARAMS = ("weight_hidden", "weight_embed", "fn", "scale", "base", "router", "experts")
# Kernels a CUDA step must have loaded (a reference fallback on a GPU would hide them).
EXPECTED_KERNELS = {"per_token_cast", "cast_back", "moe_topk_gate_forward", "moe_topk_gate_backward",
                    "engram_gate_fwd", "engram_gate_bwd", "mhc_post"}  # fmt: skip
# NVLink multicast stays off on shared hosts (the device machines' rule).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def make_params(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    m3, k = MULT * (MULT + 2), MULT * HIDDEN
    return {
        "weight_hidden": (1 + 0.1 * torch.randn(MULT, HIDDEN, generator=g)).bfloat16(),
        "weight_embed": (1 + 0.1 * torch.randn(MULT, HIDDEN, generator=g)).bfloat16(),
        "fn": torch.randn(m3, k, generator=g) / k**0.5,
        "scale": torch.rand(3, generator=g) * 0.5 + 0.1,
        "base": 0.3 * torch.randn(m3, generator=g),
        "router": torch.randn(HIDDEN, EXPERTS, generator=g) / HIDDEN**0.5,
        "experts": 1 + 0.1 * torch.randn(EXPERTS, HIDDEN, generator=g),
    }


def make_shards(seed: int, world: int, tokens: int) -> list[dict]:
    """The whole batch, split in `world` shards of `tokens` tokens."""
    g = torch.Generator().manual_seed(seed + 1)
    n = world * tokens
    batch = {
        "embedding": torch.randn(n, HIDDEN, generator=g).bfloat16(),
        "kv": torch.randn(n, MULT + 1, HIDDEN, generator=g).bfloat16(),
        "target": 0.5 * torch.randn(n, MULT, HIDDEN, generator=g),
    }
    return [{name: t[r * tokens : (r + 1) * tokens] for name, t in batch.items()} for r in range(world)]


class Router(torch.autograd.Function):
    """moe_topk_gate_forward with moe_topk_gate_backward as its gradient (the indices: none)."""

    @staticmethod
    def forward(ctx, logits):
        scores = torch.empty_like(logits)
        idx, weights = tilebake.moe.moe_topk_gate_forward(logits, TOPK, False, 0, RSF, 0, "sqrtsoftplus", scores=scores)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(scores, idx, weights)
        return idx, weights

    @staticmethod
    def backward(ctx, _grad_idx, grad_weights):
        scores, idx, weights = ctx.saved_tensors
        return tilebake.moe.moe_topk_gate_backward(scores, idx, weights, grad_weights.contiguous(), RSF)


class FakeQuant(torch.autograd.Function):
    """x through e4m3 (1 x 128 blocks) and back to bf16; the gradient passes straight through."""

    @staticmethod
    def forward(ctx, x):
        return tilebake.quant.cast_back(tilebake.quant.per_token_cast(x, "e4m3", 128), "bf16", (1, 128))

    @staticmethod
    def backward(ctx, grad):
        return grad


def step(params: dict, shard: dict, device) -> torch.Tensor:
    """[loss, every parameter's gradient flattened], fp32, of one shard."""
    p = {name: t.to(device).requires_grad_() for name, t in params.items()}
    s = {name: t.to(device) for name, t in shard.items()}
    streams = mhc.expand_from_embedding(s["embedding"], MULT)
    streams = engram_gate(streams, s["kv"], p["weight_hidden"], p["weight_embed"], CLAMP, EPS)
    x, (post, comb) = mhc.mhc_pre(streams, p["fn"], p["scale"], p["base"], mhc_mult=MULT)
    idx, weights = Router.apply(x.float() @ p["router"])
    # Each token's chosen experts' weights as a dense (tokens, experts) matrix: the top-k experts
    # are distinct, so the scatter writes each element once (no accumulation order).
    combine = torch.zeros(idx.shape[0], EXPERTS, device=device).scatter(1, idx, weights)
    y = (FakeQuant.apply(x.contiguous()).float() * (combine @ p["experts"])).bfloat16()
    out = mhc.mhc_post(y, streams, post, comb)
    loss = (out.float() - s["target"]).square().mean()
    grads = torch.autograd.grad(loss, [p[name] for name in PARAMS])
    return torch.cat([loss.detach().reshape(1), *(g.float().reshape(-1) for g in grads)])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def worker(rank: int, world: int, args, init_method: str) -> bool:
    torch.set_num_threads(1)  # the CPU path: each rank and its one-process run sum in the same order
    cuda = args.backend == "nccl"
    local = int(os.environ.get("LOCAL_RANK", rank))  # torchrun's GPU index on this host
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, init_method=init_method, rank=rank, world_size=world)
    try:
        params, shards = make_params(args.seed), make_shards(args.seed, world, args.tokens)
        start = time.perf_counter()
        reduced = step(params, shards[rank], device)
        dist.all_reduce(reduced)
        reduced /= world
        if rank == args.break_rank:  # the tests' check that a mismatch is caught
            reduced[0] += 1
        if cuda:
            torch.cuda.synchronize(device)
        step_s = time.perf_counter() - start
        gathered = [torch.empty_like(reduced) for _ in range(world)]
        dist.all_gather(gathered, reduced)
        # (b) the one-process run on this rank's device: every shard's step, in rank order
        one = step(params, shards[0], device)
        for shard in shards[1:]:
            one += step(params, shard, device)
        one /= world
        summary = {
            "rank": rank,
            "device": f"cuda:{local} {torch.cuda.get_device_name(device)}" if cuda else "cpu",
            "ranks_bitwise_equal": all(same_bits(g, gathered[0]) for g in gathered),
            "matches_one_process": same_bits(reduced, one),
            "max_abs_diff_vs_one_process": float((reduced - one).abs().max()),
            "finite": bool(reduced.isfinite().all()),
            "step_s": round(step_s, 4),
            "kernels_loaded": sorted(_kernel_ops()) if cuda else [],
        }
        summaries = [None] * world
        dist.all_gather_object(summaries, summary)
    finally:
        dist.destroy_process_group()
    missing = sorted(EXPECTED_KERNELS - set(summary["kernels_loaded"])) if cuda else []
    ok = all(s["ranks_bitwise_equal"] and s["matches_one_process"] and s["finite"] for s in summaries) and not missing
    if rank == 0:
        report = {
            "ok": ok,
            "backend": args.backend,
            "world_size": world,
            "tokens_per_rank": args.tokens,
            "torch": torch.__version__,
            "tilebake": tilebake.__version__,
            "loss": float(reduced[0]),
            "grad_norms": _grad_norms(reduced[1:], params),
            "missing_kernels": missing,
            "ranks": summaries,
        }
        print(json.dumps(report, indent=1), flush=True)
    return ok


def _kernel_ops() -> set[str]:
    from tilebake._runtime import loader

    return {vid.split(".")[0] for vid in loader.loaded_variants}


def _grad_norms(flat: torch.Tensor, params: dict) -> dict:
    norms, at = {}, 0
    for name in PARAMS:
        n = params[name].numel()
        norms[name] = float(flat[at : at + n].norm())
        at += n
    return norms


def _spawned(rank: int, world: int, args, init_method: str) -> None:
    if not worker(rank, world, args, init_method):
        sys.exit(1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    two_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl" if two_gpus else "gloo")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--break-rank", type=int, default=-1, help=argparse.SUPPRESS)  # tests only
    args = parser.parse_args(argv)
    if args.backend == "nccl":
        os.environ.update(NO_MULTICAST)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        return 0 if worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, "env://") else 1
    if args.backend == "nccl" and torch.cuda.device_count() < args.world_size:
        parser.error(f"nccl: {args.world_size} processes need as many GPUs, found {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            mp.spawn(_spawned, args=(args.world_size, args, f"file://{tmp}/init"), nprocs=args.world_size)
        except mp.ProcessExitedException as e:  # a rank found a mismatch (rank 0 printed it)
            print(f"ddp_step: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
