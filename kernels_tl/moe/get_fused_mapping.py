"""get_fused_mapping as three TileLang kernels (a deterministic counting sort), launched in order:

  count:   the flat topk_idx (numel = T * k int64) is cut into segments of 32 * seg_steps entries,
           one warp per segment; each warp counts its segment's entries per expert (shared-memory
           atomics: order-free, so deterministic) into counts[segment, expert]. The grid also fills
           pos_to_expert / pos_to_token / pos_to_token_topk with -1 (padding rows stay so).
  scan:    per expert, the exclusive prefix of counts over the segments (offsets[segment, expert])
           and the expert's total; 32 experts a CTA, 8 rows of threads splitting the segments.
  scatter: every CTA recomputes the aligned expert starts from the totals (a block scan over at
           most MAX_EXPERTS experts; CTA 0 stores expert_start / expert_end / num_tokens_per_expert);
           each warp walks its segment 32 entries at a time in ascending flat order: lanes with the
           same expert rank themselves with __match_any_sync (lower lane first), and a per-warp
           shared counter per expert (start + offsets[segment, expert]) advances by the group size.
           So an expert's rows hold its (token, slot) pairs in ascending flat index.
An entry outside [0, num_experts) is dropped (token_topk_to_pos -1), as is one whose row would be
>= num_expanded_tokens. Every size is a runtime argument; num_experts <= FAST_MAX_EXPERTS.

The wide stages (count_wide, scatter_wide: FAST_MAX_EXPERTS < num_experts <= MAX_EXPERTS) are the
same kernels with each warp's per-expert counters in global memory instead of shared memory (8
warps x 8192 counters would not fit): count_wide zeroes its row counts[segment, :] and counts with
global atomics; scatter_wide keeps the aligned starts in shared memory (the block scan covers
MAX_EXPERTS) and advances offsets[segment, expert] in place as the warp's next row (each row of
offsets belongs to one warp; __syncwarp orders the lanes' global accesses as it does shared ones).
"""

import tilelang.language as T

from tilebake.moe.get_fused_mapping import (
    FAST_MAX_EXPERTS,
    MAX_EXPERTS,
    SCAN_THREADS,
    SCAN_UNROLL,
    SEGMENT_UNROLL,
    WARPS,
    GetFusedMappingVariant,
)

THREADS = 32 * WARPS

# Shared memory is synchronised by hand (warp-level phases must not get __syncthreads).
PASS_CONFIGS = {
    "tl.disable_thread_storage_sync": True,
    "tl.disable_warp_specialized": True,
    "tl.disable_safe_memory_legalize": True,  # every access is guarded by hand
}


@T.macro
def load_segment_batch(vals, raw, topk_idx, seg, step0, lane, seg_steps, numel, num_experts):
    """vals[u] = the expert of entry seg * 32 * seg_steps + (step0 + u) * 32 + lane as int32, or -1
    where it is past the end or outside [0, num_experts); all SEGMENT_UNROLL loads issued first
    (raw: an int64 local buffer of SEGMENT_UNROLL)."""
    for u in T.unroll(SEGMENT_UNROLL):
        i = seg * (seg_steps * 32) + (step0 + u) * 32 + lane
        raw[u] = T.int64(-1)
        if i < numel:
            raw[u] = topk_idx[i]
    for u in T.unroll(SEGMENT_UNROLL):
        vals[u] = T.int32(-1)
        if raw[u] >= 0 and raw[u] < T.cast(num_experts, "int64"):
            vals[u] = T.cast(raw[u], "int32")


def build_count(wide: bool):
    numel = T.dynamic("numel")
    num_experts = T.dynamic("num_experts")
    num_segments = T.dynamic("num_segments")
    num_expanded = T.dynamic("num_expanded")

    @T.prim_func
    def get_fused_mapping_count(
        topk_idx: T.Tensor((numel,), "int64"),
        counts: T.Tensor((num_segments, num_experts), "int32"),
        pos_to_expert: T.Tensor((num_expanded,), "int32"),
        pos_to_token: T.Tensor((num_expanded,), "int32"),
        pos_to_token_topk: T.Tensor((num_expanded,), "int32"),
        seg_steps: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_segments, WARPS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            warp = tx // 32
            lane = tx % 32
            if not wide:
                hist = T.alloc_shared((WARPS, FAST_MAX_EXPERTS), "int32")
            vals = T.alloc_local((SEGMENT_UNROLL,), "int32")
            raw = T.alloc_local((SEGMENT_UNROLL,), "int64")
            seg = b * WARPS + warp
            # Every padding row is -1; the scatter overwrites the rows that hold a pair.
            for p in T.serial(b * THREADS + tx, num_expanded, T.ceildiv(num_segments, WARPS) * THREADS):
                pos_to_expert[p] = -1
                pos_to_token[p] = -1
                pos_to_token_topk[p] = -1
            if wide:
                if seg < num_segments:
                    for e in T.serial(lane, num_experts, 32):
                        counts[seg, e] = 0
                    T.sync_warp()
                    for step in T.serial(seg_steps // SEGMENT_UNROLL):
                        load_segment_batch(
                            vals, raw, topk_idx, seg, step * SEGMENT_UNROLL, lane, seg_steps, numel, num_experts
                        )
                        for u in T.unroll(SEGMENT_UNROLL):
                            if vals[u] >= 0:
                                T.atomic_add(counts[seg, vals[u]], 1)
            else:
                for e in T.serial(lane, num_experts, 32):
                    hist[warp, e] = 0
                T.sync_warp()
                if seg < num_segments:
                    for step in T.serial(seg_steps // SEGMENT_UNROLL):
                        load_segment_batch(
                            vals, raw, topk_idx, seg, step * SEGMENT_UNROLL, lane, seg_steps, numel, num_experts
                        )
                        for u in T.unroll(SEGMENT_UNROLL):
                            if vals[u] >= 0:
                                T.atomic_add(hist[warp, vals[u]], 1)
                    T.sync_warp()
                    for e in T.serial(lane, num_experts, 32):
                        counts[seg, e] = hist[warp, e]

    return get_fused_mapping_count


def build_scan():
    num_experts = T.dynamic("num_experts")
    num_segments = T.dynamic("num_segments")
    rows = SCAN_THREADS // 32

    @T.prim_func
    def get_fused_mapping_scan(
        counts: T.Tensor((num_segments, num_experts), "int32"),
        offsets: T.Tensor((num_segments, num_experts), "int32"),
        totals: T.Tensor((num_experts,), "int32"),
    ):
        # 32 experts a CTA (lane = expert: coalesced rows of counts), `rows` rows of threads
        # each owning a contiguous run of segments; loads issued SCAN_UNROLL at a time.
        with T.Kernel(T.ceildiv(num_experts, 32), threads=SCAN_THREADS) as b:
            tx = T.get_thread_binding(0)
            row = tx // 32
            col = tx % 32
            e = b * 32 + col
            partial = T.alloc_shared((rows, 32), "int32")
            vals = T.alloc_local((SCAN_UNROLL,), "int32")
            per_row = T.alloc_var("int32")
            first = T.alloc_var("int32")
            running = T.alloc_var("int32")
            per_row = T.ceildiv(num_segments, rows)
            first = row * per_row
            running = 0
            for batch in T.serial(T.ceildiv(per_row, SCAN_UNROLL)):
                for u in T.unroll(SCAN_UNROLL):
                    s = first + batch * SCAN_UNROLL + u
                    vals[u] = 0
                    if e < num_experts and s < num_segments and batch * SCAN_UNROLL + u < per_row:
                        vals[u] = counts[s, e]
                for u in T.unroll(SCAN_UNROLL):
                    running = running + vals[u]
            partial[row, col] = running
            T.sync_threads()
            running = 0
            for r in T.serial(row):
                running = running + partial[r, col]
            if e < num_experts and row == rows - 1:
                totals[e] = running + partial[row, col]
            for batch in T.serial(T.ceildiv(per_row, SCAN_UNROLL)):
                for u in T.unroll(SCAN_UNROLL):
                    s = first + batch * SCAN_UNROLL + u
                    vals[u] = 0
                    if e < num_experts and s < num_segments and batch * SCAN_UNROLL + u < per_row:
                        vals[u] = counts[s, e]
                for u in T.unroll(SCAN_UNROLL):
                    s = first + batch * SCAN_UNROLL + u
                    if e < num_experts and s < num_segments and batch * SCAN_UNROLL + u < per_row:
                        offsets[s, e] = running
                    running = running + vals[u]

    return get_fused_mapping_scan


def build_scatter(wide: bool):
    max_experts = MAX_EXPERTS if wide else FAST_MAX_EXPERTS
    per_thread = max_experts // THREADS  # experts a thread owns in the block scan
    numel = T.dynamic("numel")
    num_experts = T.dynamic("num_experts")
    num_segments = T.dynamic("num_segments")
    num_expanded = T.dynamic("num_expanded")

    @T.prim_func
    def get_fused_mapping_scatter(
        topk_idx: T.Tensor((numel,), "int64"),
        offsets: T.Tensor((num_segments, num_experts), "int32"),
        totals: T.Tensor((num_experts,), "int32"),
        pos_to_expert: T.Tensor((num_expanded,), "int32"),
        pos_to_token: T.Tensor((num_expanded,), "int32"),
        pos_to_token_topk: T.Tensor((num_expanded,), "int32"),
        token_topk_to_pos: T.Tensor((numel,), "int32"),
        expert_start: T.Tensor((num_experts,), "int32"),
        expert_end: T.Tensor((num_experts,), "int32"),
        num_tokens_per_expert: T.Tensor((num_experts,), "int32"),
        num_topk: T.int32,
        alignment: T.int32,
        seg_steps: T.int32,
    ):
        with T.Kernel(T.ceildiv(num_segments, WARPS), threads=THREADS) as b:
            tx = T.get_thread_binding(0)
            warp = tx // 32
            lane = tx % 32
            scan = T.alloc_shared((THREADS,), "int32")
            start = T.alloc_shared((max_experts,), "int32")
            if not wide:
                ctr = T.alloc_shared((WARPS, FAST_MAX_EXPERTS), "int32")
            aligned = T.alloc_local((per_thread,), "int32")
            vals = T.alloc_local((SEGMENT_UNROLL,), "int32")
            raw = T.alloc_local((SEGMENT_UNROLL,), "int64")
            acc = T.alloc_var("int32")
            step_in = T.alloc_var("int32")
            # 1. Aligned segment lengths, thread tx owning experts per_thread * tx + u, and their
            #    exclusive prefix (Hillis-Steele over the threads' sums).
            acc = 0
            for u in T.unroll(per_thread):
                e = tx * per_thread + u
                aligned[u] = 0
                if e < num_experts:
                    aligned[u] = T.ceildiv(totals[e], alignment) * alignment
                acc = acc + aligned[u]
            scan[tx] = acc
            T.sync_threads()
            for d in T.unroll(THREADS.bit_length() - 1):
                step_in = 0
                if tx >= (1 << d):
                    step_in = scan[tx - (1 << d)]
                T.sync_threads()
                scan[tx] = scan[tx] + step_in
                T.sync_threads()
            acc = scan[tx] - acc  # exclusive
            T.sync_threads()  # the lowering may place `start` over `scan`
            for u in T.unroll(per_thread):
                e = tx * per_thread + u
                if e < num_experts:
                    start[e] = acc
                    if b == 0:
                        expert_start[e] = acc
                        expert_end[e] = acc + aligned[u]
                        num_tokens_per_expert[e] = aligned[u]
                acc = acc + aligned[u]
            T.sync_threads()
            # 2. This warp's next row per expert (wide: start[e] + offsets[seg, e], read as used).
            seg = b * WARPS + warp
            if not wide:
                if seg < num_segments:
                    for e in T.serial(lane, num_experts, 32):
                        ctr[warp, e] = start[e] + offsets[seg, e]
                T.sync_warp()
            # 3. The segment in ascending flat order, 32 entries a step.
            lower_lanes = (T.uint32(1) << T.cast(lane, "uint32")) - T.uint32(1)
            if seg < num_segments:
                for batch in T.serial(seg_steps // SEGMENT_UNROLL):
                    load_segment_batch(
                        vals, raw, topk_idx, seg, batch * SEGMENT_UNROLL, lane, seg_steps, numel, num_experts
                    )
                    for u in T.unroll(SEGMENT_UNROLL):
                        i = seg * (seg_steps * 32) + (batch * SEGMENT_UNROLL + u) * 32 + lane
                        e = vals[u]
                        peers = T.match_any_sync(e)
                        rank = T.cast(T.popcount(peers & lower_lanes), "int32")
                        acc = 0
                        if wide:
                            if e >= 0:
                                acc = offsets[seg, e]
                            T.sync_warp()
                            if e >= 0 and (peers & lower_lanes) == T.uint32(0):
                                offsets[seg, e] = acc + T.cast(T.popcount(peers), "int32")
                            if e >= 0:
                                acc = start[e] + acc + rank
                        else:
                            if e >= 0:
                                acc = ctr[warp, e] + rank
                            T.sync_warp()
                            if e >= 0 and (peers & lower_lanes) == T.uint32(0):
                                ctr[warp, e] = acc + T.cast(T.popcount(peers), "int32")
                        T.sync_warp()
                        if i < numel:
                            if e >= 0 and acc < num_expanded:
                                pos_to_expert[acc] = e
                                pos_to_token[acc] = i // num_topk
                                pos_to_token_topk[acc] = i
                                token_topk_to_pos[i] = acc
                            else:
                                token_topk_to_pos[i] = -1

    return get_fused_mapping_scatter


def build(v: GetFusedMappingVariant):
    if v.stage == "scan":
        return build_scan()
    stage, _, wide = v.stage.partition("_")
    return {"count": build_count, "scatter": build_scatter}[stage](wide == "wide")
