"""Run a lowered warp-synchronous kernel on the CPU (a development check for a GPU-less host).

The kernel's CUDA C++ (`aot.py lower` output) is compiled by g++ with a small prelude: each of
32 std::threads plays one lane, and every __shfl_sync / __shfl_xor_sync / __reduce_max_sync /
__reduce_min_sync (unsigned) is a pair of barrier waits around a shared 32-slot buffer. The
threads run every (block, warp) of the grid in turn, one warp at a time. This fits kernels whose
threads talk only through warp collectives (no shared memory, no __syncthreads) that are
warp-uniform (a divergent one deadlocks here, which is a bug on the GPU too). Math functions are
glibc's, not CUDA's: compare with the tolerances of a second implementation.

    python build_tools/warp_emu.py KERNEL.cu OUT.so
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
#define __global__
#define __launch_bounds__(...)
#define __restrict__
#define CUDART_INF_F INFINITY
using std::isfinite;
struct Dim { int x; };
thread_local Dim threadIdx, blockIdx;
static std::barrier<>* g_bar;
template <class T> struct Buf { static T a[32]; };
template <class T> T Buf<T>::a[32];
template <class T> T __shfl_sync(unsigned, T v, int src, int) {
  int lane = threadIdx.x & 31;
  Buf<T>::a[lane] = v;
  g_bar->arrive_and_wait();
  T r = Buf<T>::a[src & 31];
  g_bar->arrive_and_wait();
  return r;
}
template <class T> T __shfl_xor_sync(unsigned m, T v, int d, int w) {
  return __shfl_sync(m, v, (threadIdx.x & 31) ^ d, w);
}
inline unsigned redux(unsigned v, bool take_max) {
  int lane = threadIdx.x & 31;
  Buf<unsigned>::a[lane] = v;
  g_bar->arrive_and_wait();
  unsigned r = Buf<unsigned>::a[0];
  for (int i = 1; i < 32; ++i) {
    unsigned x = Buf<unsigned>::a[i];
    r = take_max ? (x > r ? x : r) : (x < r ? x : r);
  }
  g_bar->arrive_and_wait();
  return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) { return redux(v, true); }
inline unsigned __reduce_min_sync(unsigned, unsigned v) { return redux(v, false); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
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
    if "__shared__" in src or "__syncthreads" in src:
        raise SystemExit(f"{cu_path}: uses shared memory or block barriers, which this emulator does not model")
    params = [p.strip() for p in sig.split(",")]
    names = [p.split()[-1] for p in params]
    warps = threads_per_block // 32
    runner = f"""
extern "C" void run({sig}, int grid) {{
  std::barrier<> bar(32);
  g_bar = &bar;
  std::vector<std::thread> lanes;
  for (int lane = 0; lane < 32; ++lane) lanes.emplace_back([=] {{
    for (int b = 0; b < grid; ++b) for (int w = 0; w < {warps}; ++w) {{
      threadIdx.x = w * 32 + lane;
      blockIdx.x = b;
      {entry}({", ".join(names)});
    }}
  }});
  for (auto& t : lanes) t.join();
}}
"""
    cpp = Path(so_path + ".cpp")
    cpp.write_text(PRELUDE + src[match.start() :] + runner)
    Path(so_path + ".params").write_text("\n".join(params) + "\n")
    cmd = ["g++", "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-w", "-o", so_path, str(cpp)]
    subprocess.run(cmd, check=True)
    return params


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 128)
