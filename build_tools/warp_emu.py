"""Run a lowered warp-synchronous kernel on the CPU (a development check for a GPU-less host).

The kernel's CUDA C++ (`aot.py lower` output) is compiled by g++ with a small prelude: each of
the block's threads is a std::thread, and every warp collective (__shfl_sync, __shfl_xor_sync,
__reduce_{max,min,or}_sync (unsigned), __any_sync, __syncwarp) is a pair of waits on its warp's
barrier around a per-warp 32-slot buffer; __syncthreads (and __syncthreads_or) wait on a block
barrier. Shared memory (static or the dynamic `extern __shared__` array) is one static buffer:
blocks run one at a time, a block barrier between them. This fits kernels whose collectives are
warp-uniform and whose barriers are block-uniform (otherwise it deadlocks, which is a bug on the
GPU too). Math functions are glibc's, not CUDA's: compare with the tolerances of a second
implementation.

    python build_tools/warp_emu.py KERNEL.cu OUT.so [THREADS_PER_BLOCK]
builds OUT.so exporting `run(<the kernel's parameters>, int grid)` and writes OUT.so.params
(the parameter declarations in order, one a line).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PRELUDE = r"""
#include <math.h>
#include <cmath>
#include <cstdint>
#include <barrier>
#include <thread>
#include <vector>
typedef unsigned int uint;
typedef unsigned char uchar;
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n) __attribute__((aligned(n)))
#define CUDART_INF_F INFINITY
using std::isfinite;
struct Dim { int x; };
thread_local Dim threadIdx, blockIdx;
constexpr int kMaxWarps = 32;
static std::barrier<>* g_warp_bar[kMaxWarps];
static std::barrier<>* g_block_bar;
static int g_block_or;
template <class T> struct Buf { static T a[kMaxWarps][32]; };
template <class T> T Buf<T>::a[kMaxWarps][32];
inline int warp_id() { return threadIdx.x >> 5; }
inline void warp_wait() { g_warp_bar[warp_id()]->arrive_and_wait(); }
template <class T> T __shfl_sync(unsigned, T v, int src, int) {
  int lane = threadIdx.x & 31;
  Buf<T>::a[warp_id()][lane] = v;
  warp_wait();
  T r = Buf<T>::a[warp_id()][src & 31];
  warp_wait();
  return r;
}
template <class T> T __shfl_xor_sync(unsigned m, T v, int d, int w) {
  return __shfl_sync(m, v, (threadIdx.x & 31) ^ d, w);
}
inline unsigned redux(unsigned v, int op) {  // 0: max, 1: min, 2: or
  int lane = threadIdx.x & 31;
  Buf<unsigned>::a[warp_id()][lane] = v;
  warp_wait();
  unsigned r = Buf<unsigned>::a[warp_id()][0];
  for (int i = 1; i < 32; ++i) {
    unsigned x = Buf<unsigned>::a[warp_id()][i];
    r = op == 0 ? (x > r ? x : r) : op == 1 ? (x < r ? x : r) : (x | r);
  }
  warp_wait();
  return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) { return redux(v, 0); }
inline unsigned __reduce_min_sync(unsigned, unsigned v) { return redux(v, 1); }
inline unsigned __reduce_or_sync(unsigned, unsigned v) { return redux(v, 2); }
inline int __any_sync(unsigned, int p) { return redux(p ? 1u : 0u, 2) != 0; }
inline void __syncwarp(unsigned = 0xFFFFFFFFu) { warp_wait(); }
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline int __syncthreads_or(int p) {
  g_block_bar->arrive_and_wait();  // everyone has read the previous result
  if (threadIdx.x == 0) g_block_or = 0;
  g_block_bar->arrive_and_wait();
  if (p) __atomic_store_n(&g_block_or, 1, __ATOMIC_RELAXED);
  g_block_bar->arrive_and_wait();
  return __atomic_load_n(&g_block_or, __ATOMIC_RELAXED);
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline float max(float a, float b) { return fmaxf(a, b); }  // CUDA's fmaxf: a NaN operand loses
inline float min(float a, float b) { return fminf(a, b); }
"""


def build(cu_path: str, so_path: str, threads_per_block: int) -> list[str]:
    """Compile the emulator; returns the kernel's parameter declarations in order."""
    src = Path(cu_path).read_text()
    match = re.search(r'extern "C" __global__ void __launch_bounds__\([^)]*\) (\w+)\(([^)]*)\)', src)
    if match is None:
        raise SystemExit(f"{cu_path}: no __launch_bounds__ kernel definition found")
    entry, sig = match.group(1), match.group(2)
    body = src[match.start() :]
    # Shared memory: one static buffer (blocks run one at a time); the dynamic array gets 64 KiB.
    body = re.sub(
        r"extern __shared__ (__align__\(\d+\) )?(\w+) (\w+)\[\];", r"static \1\2 \3[65536 / sizeof(\2)];", body
    )
    body = body.replace("__shared__ ", "static ")
    params = [p.strip() for p in sig.split(",")]
    names = [p.split()[-1] for p in params]
    warps = threads_per_block // 32
    runner = f"""
extern "C" void run({sig}, int grid) {{
  for (int w = 0; w < {warps}; ++w) g_warp_bar[w] = new std::barrier<>(32);
  std::barrier<> block({threads_per_block});
  g_block_bar = &block;
  std::vector<std::thread> threads;
  for (int tid = 0; tid < {threads_per_block}; ++tid) threads.emplace_back([=] {{
    threadIdx.x = tid;
    for (int b = 0; b < grid; ++b) {{
      blockIdx.x = b;
      {entry}({", ".join(names)});
      g_block_bar->arrive_and_wait();  // the block's shared memory is free again
    }}
  }});
  for (auto& t : threads) t.join();
  for (int w = 0; w < {warps}; ++w) delete g_warp_bar[w];
}}
"""
    cpp = Path(so_path + ".cpp")
    cpp.write_text(PRELUDE + body + runner)
    Path(so_path + ".params").write_text("\n".join(params) + "\n")
    cmd = ["g++", "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-w", "-o", so_path, str(cpp)]
    subprocess.run(cmd, check=True)
    return params


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 128)
