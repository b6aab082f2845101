"""Run a lowered kernel that uses shared memory and block barriers on the CPU (a development
check for a GPU-less host; build_tools/warp_emu.py covers kernels of warp collectives only).

The kernel's CUDA C++ (`aot.py lower` output) is compiled by g++ with a small prelude. Every
thread of a CTA is a fiber (ucontext) of one OS thread; a fiber runs until it waits at a barrier:
__syncthreads (the CTA), __syncwarp and each warp collective (__shfl*_sync, __ballot_sync,
__any_sync, __match_any_sync: a pair of waits around a 32-slot exchange buffer of its warp).
CTAs run one after another over the grid (1-D or 2-D), sharing one dynamic shared-memory buffer (its
bytes are poisoned before each CTA). Scheduling is warp-greedy: in a pseudo-random warp order
(seeded by `seed`), each warp runs as far as it can (its lanes in a random order, until each
waits at a barrier that needs another warp, or is done) before the next warp starts. So one
warp runs ahead of the others by whole phases, and a missing __syncthreads between a write and
another warp's read (either order) gives a wrong result or a stuck CTA for some seeds. As only
one fiber runs at a time, atomics are plain read-modify-writes. A barrier some thread never
reaches (a divergent __syncthreads, a warp collective in divergent code, a thread that exits
before a barrier) is reported: the run stops with the CTA and the stuck threads, where a GPU
would hang or be undefined. Races inside a warp between barriers, and memory-model questions
(caching, fences, the compiler's reordering), are not modelled: the GPU tests decide those.
Device intrinsics beyond the collectives: __byte_perm, __vmaxu2, uint4 copies, tilelang's
tl::clamp, tl::cp_async_* (each copy lands at the wait that retires its group) and the cubins' e4m3
conversion (cvt.rn.satfinite: nearest even, saturating to +-448).

    python build_tools/block_emu.py KERNEL.cu OUT.so

The grid comes from the .json `aot.py lower` writes beside the .cu (EmulatedKernel below).
"""

from __future__ import annotations

import ctypes
import json
import re
import subprocess
import sys
from pathlib import Path

PRELUDE = r"""
#include <math.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <ucontext.h>
typedef unsigned int uint;
typedef unsigned char uchar;
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define CUDART_INF_F INFINITY
using std::isfinite;
struct Dim { int x, y, z; };
static Dim threadIdx, blockIdx, blockDim, gridDim;

// --- fibers and barriers ---
struct Barrier { int need; int arrived; long gen; };
struct Fiber { ucontext_t uc; bool done; Barrier* waits; long gen; };
static ucontext_t g_sched;
static std::vector<Fiber> g_fibers;
static std::vector<char> g_stacks;
static int g_cur;
static long g_progress;
static Barrier g_block;
static std::vector<Barrier> g_warp;
static std::vector<unsigned long long> g_xchg;  // 32 slots a warp
alignas(1024) static uchar g_smem[232448];

static void wait_at(Barrier& b) {
  long gen = b.gen;
  ++g_progress;
  if (++b.arrived == b.need) { b.arrived = 0; ++b.gen; return; }
  Fiber& f = g_fibers[g_cur];
  f.waits = &b;
  f.gen = gen;
  swapcontext(&f.uc, &g_sched);  // resumed only once b.gen moved on
  f.waits = nullptr;
}
static bool runnable(const Fiber& f) { return !f.done && (!f.waits || f.waits->gen != f.gen); }
inline void __syncthreads() { wait_at(g_block); }
inline void __syncwarp(unsigned = 0xffffffffu) { wait_at(g_warp[threadIdx.x >> 5]); }

template <class T> T exchange(T v, int src) {
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned long long* buf = &g_xchg[32 * w];
  std::memcpy(&buf[lane], &v, sizeof(T));
  wait_at(g_warp[w]);
  T r;
  std::memcpy(&r, &buf[src & 31], sizeof(T));
  wait_at(g_warp[w]);
  return r;
}
template <class T> T __shfl_sync(unsigned, T v, int src, int = 32) { return exchange(v, src); }
template <class T> T __shfl_xor_sync(unsigned, T v, int d, int = 32) { return exchange(v, (threadIdx.x & 31) ^ d); }
// Every lane's value of v, into out[32] (lane order).
template <class T> void gather(T v, T* out) {
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned long long* buf = &g_xchg[32 * w];
  buf[lane] = (unsigned long long)v;
  wait_at(g_warp[w]);
  for (int i = 0; i < 32; ++i) out[i] = (T)buf[i];
  wait_at(g_warp[w]);
}
inline unsigned __ballot_sync(unsigned, int p) {
  int all[32]; gather<int>(p != 0, all);
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)(all[i] != 0) << i;
  return r;
}
inline int __any_sync(unsigned m, int p) { return __ballot_sync(m, p) != 0; }
inline int __all_sync(unsigned m, int p) { return __ballot_sync(m, p) == 0xffffffffu; }
template <class T> unsigned __match_any_sync(unsigned, T v) {
  long long all[32]; gather<long long>((long long)v, all);
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (unsigned)(all[i] == (long long)v) << i;
  return r;
}
inline unsigned redux(unsigned v, bool take_max) {
  unsigned all[32]; gather<unsigned>(v, all);
  unsigned r = all[0];
  for (int i = 1; i < 32; ++i) r = take_max ? (all[i] > r ? all[i] : r) : (all[i] < r ? all[i] : r);
  return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) { return redux(v, true); }
inline unsigned __reduce_min_sync(unsigned, unsigned v) { return redux(v, false); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline int __clz(int v) { return v == 0 ? 32 : __builtin_clz((unsigned)v); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <class T, class U> T AtomicAdd(T* p, U v) { T old = *p; *p = old + (T)v; return old; }
template <class T, class U> T atomicAdd(T* p, U v) { T old = *p; *p = old + (T)v; return old; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }  // CUDA's fmaxf: a NaN operand loses
inline float min(float a, float b) { return fminf(a, b); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }  // (CUDA's is approximate: 2 ulp)

// --- byte and vector intrinsics, tilelang's clamp, the e4m3 conversion of the cubins ---
#define __align__(n) alignas(n)
struct uint4 { uint x, y, z, w; };
struct uint2 { uint x, y; };
struct uint1 { uint x; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
// IEEE single operations, each rounded once (g++ -O1 contracts nothing without -ffp-contract=fast)
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
// div.approx on the GPU (within 2 ulp); here the rounded quotient
inline float __fdividef(float a, float b) { volatile float r = a / b; return r; }
inline float __fsqrt_rn(float a) { volatile float r = std::sqrt(a); return r; }
inline uint4 make_uint4(uint a, uint b, uint c, uint d) { return {a, b, c, d}; }
inline uint __byte_perm(uint x, uint y, uint s) {  // result byte i = byte (s >> 4i) & 7 of y:x
  unsigned long long in = ((unsigned long long)y << 32) | x;
  uint r = 0;
  for (int i = 0; i < 4; ++i) r |= (uint)((in >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
}
inline uint __vmaxu2(uint a, uint b) {  // unsigned max of each 16-bit half
  uint lo = (a & 0xFFFF) > (b & 0xFFFF) ? (a & 0xFFFF) : (b & 0xFFFF);
  uint hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return (hi << 16) | lo;
}
namespace tl {
inline float clamp(float x, float lo, float hi) { return std::isnan(x) ? x : fminf(fmaxf(x, lo), hi); }
}  // namespace tl

// --- cp.async: a thread's copies queue in commit groups and land when a wait retires their group
// (the destination poisoned until then), as late as the PTX contract allows ---
struct AsyncCopy { uchar* dst; const uchar* src; int n; bool cond; };
struct AsyncQueue { std::vector<AsyncCopy> open; std::vector<std::vector<AsyncCopy>> committed; };
static std::vector<AsyncQueue> g_async;  // one a thread
namespace tl {
template <int N> void cp_async_gs_conditional(void const* dst, void const* src, bool cond) {
  g_async[g_cur].open.push_back({(uchar*)dst, (const uchar*)src, N, cond});  // cond false: zero fill
  std::memset((void*)dst, 0xA5, N);
}
template <int N> void cp_async_gs(void const* dst, void const* src) { cp_async_gs_conditional<N>(dst, src, true); }
inline void cp_async_commit() {
  AsyncQueue& q = g_async[g_cur];
  q.committed.push_back(std::move(q.open));
  q.open.clear();
}
template <int N> void cp_async_wait() {
  AsyncQueue& q = g_async[g_cur];
  while ((int)q.committed.size() > N) {
    for (AsyncCopy& c : q.committed.front()) c.cond ? (void)std::memcpy(c.dst, c.src, c.n) : (void)std::memset(c.dst, 0, c.n);
    q.committed.erase(q.committed.begin());
  }
}
}  // namespace tl
struct fp8_e4_t {  // cvt.rn.satfinite.e4m3x2.f32: nearest even, +-448 for larger (and inf), NaN 0x7F
  uchar storage;
  fp8_e4_t() = default;
  explicit fp8_e4_t(float f) {
    uint bits;
    std::memcpy(&bits, &f, 4);
    uchar sign = (bits >> 24) & 0x80;
    float a = fabsf(f);
    if (std::isnan(f)) { storage = 0x7F; return; }
    if (a >= 448.0f) { storage = sign | 0x7E; return; }
    if (a < 0.015625f) { storage = sign | (uchar)std::nearbyint(a * 512.0f); return; }  // subnormal, or 2^-6
    int e;
    std::frexp(a, &e);  // a = 1.m * 2^(e - 1)
    int m = (int)std::nearbyint(std::ldexp(a, 4 - e));  // 8..16
    int biased = e - 1 + 7;
    if (m == 16) { m = 8; ++biased; }
    storage = sign | (uchar)(biased << 3) | (uchar)(m - 8);
  }
};
struct bfloat16_t {  // cutlass::bfloat16_t as the cubins use it: round to nearest even, NaN kept quiet
  unsigned short storage;
  bfloat16_t() = default;
  explicit bfloat16_t(float f) {
    uint bits;
    std::memcpy(&bits, &f, 4);
    if (std::isnan(f)) { storage = (unsigned short)((bits >> 16) | 0x40); return; }
    bits += 0x7FFF + ((bits >> 16) & 1);
    storage = (unsigned short)(bits >> 16);
  }
  explicit operator float() const {
    uint bits = (uint)storage << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};
"""

RUNNER = r"""
static void shuffle(int* a, int n, unsigned& seed) {  // Fisher-Yates with an LCG
  for (int i = 0; i < n; ++i) a[i] = i;
  for (int i = n - 1; i > 0; --i) {
    seed = seed * 1664525u + 1013904223u;
    int j = (int)((seed >> 8) % (unsigned)(i + 1));
    int x = a[i]; a[i] = a[j]; a[j] = x;
  }
}

static void fiber_main(int tid) {
  KERNEL_CALL;
  g_fibers[tid].done = true;
  ++g_progress;
}

extern "C" int run(SIGNATURE, int grid, int grid_y, int threads, unsigned seed) {
  const size_t stack = 256 * 1024;
  g_fibers.assign(threads, Fiber{});
  g_stacks.assign(stack * threads, 0);
  g_warp.assign((threads + 31) / 32, Barrier{32, 0, 0});
  g_xchg.assign(32 * g_warp.size(), 0);
  blockDim.x = threads;
  gridDim.x = grid;
  gridDim.y = grid_y;
  for (long b = 0; b < (long)grid * grid_y; ++b) {
    g_block = Barrier{threads, 0, 0};
    g_async.assign(threads, AsyncQueue{});
    std::memset(g_smem, 0xA5, sizeof g_smem);  // as uninitialised
    for (int t = 0; t < threads; ++t) {
      Fiber& f = g_fibers[t];
      f.done = false;
      f.waits = nullptr;
      getcontext(&f.uc);
      f.uc.uc_stack.ss_sp = &g_stacks[stack * t];
      f.uc.uc_stack.ss_size = stack;
      f.uc.uc_link = &g_sched;
      makecontext(&f.uc, (void (*)())fiber_main, 1, t);
    }
    int warps = (threads + 31) / 32;
    std::vector<int> order(warps);
    int left = threads;
    while (left) {
      long before = g_progress;
      shuffle(order.data(), warps, seed);
      for (int i = 0; i < warps; ++i) {
        int w = order[i], lanes[32], n = threads - 32 * w < 32 ? threads - 32 * w : 32;
        for (bool ran = true; ran;) {  // this warp as far as it goes
          ran = false;
          shuffle(lanes, n, seed);
          for (int l = 0; l < n; ++l) {
            int t = 32 * w + lanes[l];
            if (!runnable(g_fibers[t])) continue;
            ran = true;
            g_cur = t;
            threadIdx.x = t;
            blockIdx.x = (int)(b % grid);
            blockIdx.y = (int)(b / grid);
            swapcontext(&g_sched, &g_fibers[t].uc);
            if (g_fibers[t].done) --left;
          }
        }
      }
      if (left && g_progress == before) {
        fprintf(stderr, "block_emu: CTA %ld is stuck: %d of %d threads wait at a barrier no one else reaches"
                " (first: thread", b, left, threads);
        int shown = 0;
        for (int t = 0; t < threads && shown < 8; ++t) if (!g_fibers[t].done) { fprintf(stderr, " %d", t); ++shown; }
        fprintf(stderr, ")\n");
        return 1;
      }
    }
  }
  return 0;
}
"""


def build(cu_path: str, so_path: str) -> list[str]:
    """Compile the emulator; returns the kernel's parameter declarations in order."""
    src = Path(cu_path).read_text()
    match = re.search(r'extern "C" __global__ void __launch_bounds__\([^)]*\) (\w+)\(([^)]*)\)', src)
    if match is None:
        raise SystemExit(f"{cu_path}: no __launch_bounds__ kernel definition found")
    entry, sig = match.group(1), match.group(2)
    body = src[match.start() :]
    body = re.sub(r"extern __shared__ __align__\(\d+\) (\w+) (\w+)\[\];", r"\1* \2 = (\1*)g_smem;", body)
    body = re.sub(r"\b__shared__\b", "static", body)
    params = [p.strip() for p in sig.split(",")]
    names = [p.split()[-1] for p in params]
    runner = RUNNER.replace("SIGNATURE", sig).replace("KERNEL_CALL", f"{entry}({', '.join(names)})")
    # The kernel's parameters reach fiber_main through globals (makecontext passes ints only).
    types = [p.replace("__restrict__", "").rsplit(" ", 1)[0] for p in params]
    globals_ = "".join(f"static {t} g_{n};\n" for t, n in zip(types, names))
    runner = runner.replace(f"{entry}({', '.join(names)})", f"{entry}({', '.join('g_' + n for n in names)})")
    runner = runner.replace("unsigned seed) {\n", "unsigned seed) {\n" + "".join(f"  g_{n} = {n};\n" for n in names), 1)
    cpp = Path(so_path + ".cpp")
    cpp.write_text(PRELUDE + globals_ + body + runner)
    Path(so_path + ".params").write_text("\n".join(params) + "\n")
    cmd = ["g++", "-O1", "-std=c++20", "-shared", "-fPIC", "-w", "-o", so_path, str(cpp)]
    subprocess.run(cmd, check=True)
    return params


class EmulatedKernel:
    """Callable as tilebake's loader Kernel: kernel(device, *args) with args in `arg_names` order
    (the op's KernelTable names); grid and block from the lowering's .json, as the runtime does."""

    def __init__(self, cu_path: str, so_path: str, arg_names: tuple[str, ...]):
        params = build(cu_path, so_path)
        meta = json.loads(Path(cu_path).with_suffix(".json").read_text())
        if meta["grid"][2] != "1" or meta["block"][1:] != ["1", "1"]:
            raise SystemExit(f"{cu_path}: only 1-D blocks and 1-D or 2-D grids are emulated")
        self.lib = ctypes.CDLL(so_path)
        self.order = [p.split()[-1] for p in params]
        self.kinds = ["p" if "*" in p else "f" if p.startswith("float ") else "l" if "int64" in p else "i"
                      for p in params]  # fmt: skip
        self.arg_names = arg_names
        grid = f"lambda {', '.join(arg_names)}: ({meta['grid'][0]}, {meta['grid'][1]})"
        self.grid = eval(grid, {"__builtins__": {"min": min, "max": max}})
        self.threads = int(meta["block"][0])

    seed = 1  # the scheduling order's seed; tests may vary it

    def __call__(self, device, *args):
        given = dict(zip(self.arg_names, args, strict=True))
        c = {"p": ctypes.c_void_p, "f": ctypes.c_float, "i": ctypes.c_int, "l": ctypes.c_int64}
        grid = self.grid(*args)
        rc = self.lib.run(*[c[k](given[n]) for n, k in zip(self.order, self.kinds)], ctypes.c_int(grid[0]),
                          ctypes.c_int(grid[1]), ctypes.c_int(self.threads), ctypes.c_uint(self.seed))  # fmt: skip
        if rc:
            raise RuntimeError(f"block_emu: the kernel deadlocked (grid {grid}); see stderr")


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2])
