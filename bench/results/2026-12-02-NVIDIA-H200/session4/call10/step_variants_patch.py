p='/work/scratch/repo_step/kernels_tl/engram/engram_sinkhorn.py'
s=open(p).read()
old_start=s.index("def _step(v):")
old_end=s.index("def _step_reduce(v):")
new='''@dataclasses.dataclass(frozen=True)
class StepConfig:
    ctas_per_sm: int  # resident CTAs a SM (tilebake.engram.engram_sinkhorn.STEP_CTAS_PER_SM)
    cs_in_smem: bool  # col_scale in shared memory (each thread its own columns) rather than registers
    acc_in_smem: bool  # the column sums of squares likewise


STEP_CONFIG = StepConfig(ctas_per_sm=STEP_CTAS_PER_SM, cs_in_smem=True, acc_in_smem=True)


def step_candidate_configs():
    """The step's search space (python bench/tune_engram.py build|run DIR step)."""
    return [StepConfig(m, c, a) for m, c, a in ((2, False, False), (3, True, False), (4, True, True), (3, True, True),
                                               (5, True, True), (6, True, True))]  # fmt: skip


def _step(v, cfg=None):
    cfg = cfg or STEP_CONFIG
    CS_SMEM, ACC_SMEM = cfg.cs_in_smem, cfg.acc_in_smem
    rows = T.dynamic("num_rows")
    cols = T.dynamic("num_cols")
    num_ctas = T.dynamic("num_ctas")

    @T.prim_func
    def step_kernel(
        M: T.Tensor((rows, cols), "float32"),
        RS: T.Tensor((rows,), "float32"),
        CS: T.Tensor((cols,), "float32"),
        NORM: T.Tensor((rows,), "float32"),
        P: T.Tensor((num_ctas, cols), "float32"),
        eps: T.float32,
    ):
        with T.Kernel(num_ctas, threads=THREADS) as c:
            T.annotate_min_blocks_per_sm(cfg.ctas_per_sm)  # all num_ctas CTAs resident at once
            tx = T.get_thread_binding(0)
            T.assume(cols % 4 == 0)
            ms = T.alloc_local((PASSES, VEC), "float32")
            cs = T.alloc_local((1 if CS_SMEM else PASSES, VEC), "float32")
            acc = T.alloc_local((1 if ACC_SMEM else PASSES, VEC), "float32")
            css = T.alloc_shared((PASSES * PASS if CS_SMEM else 1,), "float32")
            accs = T.alloc_shared((PASSES * PASS if ACC_SMEM else 1,), "float32")
            red = T.alloc_shared((2, WARPS), "float32")
            ss = T.alloc_var("float32")
            rs = T.alloc_var("float32")
            norm = T.alloc_var("float32")
            for p in T.unroll(PASSES):
                for j in T.unroll(VEC):
                    if ACC_SMEM:
                        accs[p * PASS + tx * VEC + j] = T.float32(0)
                    else:
                        acc[p, j] = T.float32(0)
                if p * PASS + tx * VEC < cols:
                    if CS_SMEM:
                        for j in T.vectorized(VEC):
                            css[p * PASS + tx * VEC + j] = CS[p * PASS + tx * VEC + j]
                    else:
                        for j in T.vectorized(VEC):
                            cs[p, j] = CS[p * PASS + tx * VEC + j]
                else:
                    for j in T.unroll(VEC):
                        if CS_SMEM:
                            css[p * PASS + tx * VEC + j] = T.float32(0)
                        else:
                            cs[p, j] = T.float32(0)
            for k in T.serial(T.ceildiv(rows - c, num_ctas)):
                r = c + k * num_ctas
                rs = RS[r]
                ss = T.float32(0)
                for p in T.unroll(PASSES):
                    if p * PASS + tx * VEC < cols:
                        for j in T.vectorized(VEC):
                            ms[p, j] = M[r, p * PASS + tx * VEC + j]
                    else:
                        for j in T.unroll(VEC):
                            ms[p, j] = T.float32(0)
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        if CS_SMEM:
                            it = T.ieee_mul(T.ieee_mul(rs, ms[p, j]), css[p * PASS + tx * VEC + j])
                            ss = T.ieee_fmaf(it, it, ss)
                        else:
                            it = T.ieee_mul(T.ieee_mul(rs, ms[p, j]), cs[p, j])
                            ss = T.ieee_fmaf(it, it, ss)
                # The CTA's sum of squares: a butterfly in each warp, then the warps' partials in
                # order (red by row parity: one barrier a row).
                for s in T.unroll(5):
                    ss = ss + T.shfl_xor(ss, 16 >> s)
                if tx % 32 == 0:
                    red[k % 2, tx // 32] = ss
                T.sync_threads()
                norm = red[k % 2, 0]
                for w in T.unroll(WARPS - 1):
                    norm = norm + red[k % 2, w + 1]
                norm = T.sqrt(norm)
                rs = rs / (norm + eps)
                if tx == 0:
                    NORM[r] = norm
                    RS[r] = rs
                for p in T.unroll(PASSES):
                    for j in T.unroll(VEC):
                        if CS_SMEM:
                            it = T.ieee_mul(T.ieee_mul(rs, ms[p, j]), css[p * PASS + tx * VEC + j])
                            if ACC_SMEM:
                                accs[p * PASS + tx * VEC + j] = T.ieee_fmaf(it, it, accs[p * PASS + tx * VEC + j])
                            else:
                                acc[p, j] = T.ieee_fmaf(it, it, acc[p, j])
                        else:
                            it = T.ieee_mul(T.ieee_mul(rs, ms[p, j]), cs[p, j])
                            if ACC_SMEM:
                                accs[p * PASS + tx * VEC + j] = T.ieee_fmaf(it, it, accs[p * PASS + tx * VEC + j])
                            else:
                                acc[p, j] = T.ieee_fmaf(it, it, acc[p, j])
            for p in T.unroll(PASSES):
                if p * PASS + tx * VEC < cols:
                    if ACC_SMEM:
                        for j in T.vectorized(VEC):
                            P[c, p * PASS + tx * VEC + j] = accs[p * PASS + tx * VEC + j]
                    else:
                        for j in T.vectorized(VEC):
                            P[c, p * PASS + tx * VEC + j] = acc[p, j]

    return step_kernel


'''
s=s[:old_start]+new+s[old_end:]
s=s.replace('''    return {"step": _step, "step_reduce": _step_reduce, "finalize": _finalize}[v.stage](v)''','''    if v.stage == "step":
        return _step(v, cfg)
    return {"step_reduce": _step_reduce, "finalize": _finalize}[v.stage](v)''')
open(p,'w').write(s)
