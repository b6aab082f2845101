// A CPU model of the part of the AscendC C API that tilelang 0.1.15 emits for our Ascend 950
// kernels (SIMT vector functions, aligned GM <-> UB copies, pipe syncs): it stands in for
// tilelang's tl_templates/ascend/common.h and debug.h, so a lowered .asc compiles with g++ and
// its logic runs on the host (tests/ascend/emulator.py). A model written from the C API's
// documentation, not the hardware: copies are synchronous (every sync is a no-op), SIMT threads
// are std::threads of one vf call with a barrier for asc_syncthreads, math is glibc's. What it
// checks beyond the results: every copy's UB range inside the kernel's UB bytes, UB addresses and
// multi-row strides 32-byte aligned (the documented rule), no padding or SIMD it does not model.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __vector__
#define __aicore__
#define __gm__
#define __ubuf__
#define __simt_vf__
#define __launch_bounds__(n)

enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };
enum event_t : int {};
enum class asc_load_l2_cache_mode : int {};
enum class asc_store_l2_cache_mode : int {};

namespace cce {
struct dim3 {
  uint32_t x, y, z;
  explicit dim3(uint32_t x_, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};
}  // namespace cce

struct asc_emu_index {
  uint32_t x, y, z;
};
extern thread_local asc_emu_index threadIdx;
extern int32_t block_idx;  // the block being run (the emulator runs blocks one after another)
extern uint8_t *asc_emu_ub;  // this block's unified buffer
extern int64_t asc_emu_ub_bytes;
extern thread_local std::barrier<> *asc_emu_barrier;

// Every GM range a copy reads ('r') or writes ('w'), for the caller's bounds checks.
void asc_emu_record(char kind, const void *lo, int64_t bytes);
[[noreturn]] void asc_emu_fail(const char *what, long a, long b);

inline void asc_init() {}
inline void asc_sync_notify(pipe_t, pipe_t, event_t) {}
inline void asc_sync_wait(pipe_t, pipe_t, event_t) {}
inline void asc_sync_pipe(pipe_t) {}
inline void asc_syncthreads() {
  if (asc_emu_barrier) asc_emu_barrier->arrive_and_wait();
}

inline void asc_emu_check_ub(const uint8_t *p, int64_t bytes) {
  int64_t at = p - asc_emu_ub;
  if (at < 0 || at + bytes > asc_emu_ub_bytes) asc_emu_fail("UB range outside the kernel's UB bytes", at, bytes);
  if (at % 32) asc_emu_fail("UB address not 32-byte aligned", at, 32);
}

// rows of `len` bytes, GM pitch src_stride, UB pitch dst_stride (bytes): how tilelang 0.1.15's
// code generator uses the two last arguments (the CANN 3510 page calls them src_gap / dst_gap, the
// gap between blocks, dst_gap in 32-byte units; not verified on hardware). Either way a multi-row
// copy's UB rows must sit 32 bytes apart, which is checked.
inline void asc_copy_gm2ub_align(uint8_t *dst, uint8_t *src, uint32_t rows, uint32_t len, uint32_t left_pad,
                                 uint32_t right_pad, uint32_t const_pad, asc_load_l2_cache_mode, uint64_t src_stride,
                                 uint32_t dst_stride) {
  if (left_pad || right_pad || const_pad) asc_emu_fail("gm2ub padding is not modelled", left_pad, right_pad);
  if (rows > 1 && dst_stride % 32) asc_emu_fail("gm2ub UB row pitch not a multiple of 32 bytes", dst_stride, 32);
  if (rows == 0 || len == 0) return;
  asc_emu_check_ub(dst, int64_t(rows - 1) * dst_stride + len);
  for (uint32_t i = 0; i < rows; ++i) {
    asc_emu_record('r', src + i * src_stride, len);
    std::memcpy(dst + int64_t(i) * dst_stride, src + i * src_stride, len);
  }
}

inline void asc_copy_ub2gm_align(uint8_t *dst, uint8_t *src, uint32_t rows, uint32_t len, asc_store_l2_cache_mode,
                                 uint64_t dst_stride, uint32_t src_stride) {
  if (rows > 1 && src_stride % 32) asc_emu_fail("ub2gm UB row pitch not a multiple of 32 bytes", src_stride, 32);
  if (rows == 0 || len == 0) return;
  asc_emu_check_ub(src, int64_t(rows - 1) * src_stride + len);
  for (uint32_t i = 0; i < rows; ++i) {
    asc_emu_record('w', dst + i * dst_stride, len);
    std::memcpy(dst + i * dst_stride, src + int64_t(i) * src_stride, len);
  }
}

// One SIMT vector function over d.x threads, which may meet at asc_syncthreads.
template <auto F, typename... Args>
void asc_vf_call(cce::dim3 d, Args... args) {
  std::barrier<> barrier(d.x);
  std::vector<std::thread> threads;
  threads.reserve(d.x);
  for (uint32_t t = 0; t < d.x; ++t) {
    threads.emplace_back([&, t] {
      threadIdx = {t, 0, 0};
      asc_emu_barrier = &barrier;
      F(args...);
      // a thread that returns no longer takes part in later barriers (the others may not wait)
      barrier.arrive_and_drop();
    });
  }
  for (auto &th : threads) th.join();
}

// Scalar helpers of the SIMT C API (min/max as CUDA's: fminf/fmaxf for floats).
template <typename A, typename B>
inline auto min(A a, B b) {
  using T = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<T>) return T(std::fmin(T(a), T(b)));
  else return T(a) < T(b) ? T(a) : T(b);
}
template <typename A, typename B>
inline auto max(A a, B b) {
  using T = std::common_type_t<A, B>;
  if constexpr (std::is_floating_point_v<T>) return T(std::fmax(T(a), T(b)));
  else return T(a) < T(b) ? T(b) : T(a);
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// bfloat16: round to nearest even from fp32, NaN kept quiet.
struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) bits = uint16_t((u >> 16) | 0x40);
    else bits = uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct fp8_e4_t {
  uint8_t data;
};

namespace tl {
namespace limits {  // tilelang's tl_templates/ascend/numeric_limits.h, the fp32 ones
inline constexpr float kFloatInf = __builtin_inff();
inline constexpr float kFloatNInf = -__builtin_inff();
inline const float kFloatNaN = __builtin_nanf("");
}  // namespace limits

// OCP e4m3fn: round to nearest even, saturating to +-448 (SATFINITE), NaN -> 0x7f.
struct float_e4m3_t {
  uint8_t data;
  float_e4m3_t() = default;
  explicit float_e4m3_t(float f) {
    uint8_t sign = std::signbit(f) ? 0x80 : 0;
    float a = std::fabs(f);
    if (std::isnan(f)) { data = 0x7f; return; }
    if (a >= 448.0f) { data = sign | 0x7e; return; }
    int e;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    int exp = std::max(e - 1, -6);  // the binade, subnormals below 2^-6
    float step = std::ldexp(1.0f, exp - 3);
    float q = std::nearbyint(a / step) * step;  // the current rounding mode: nearest even
    if (q == 0.0f) { data = sign; return; }
    std::frexp(q, &e);
    exp = e - 1;
    if (exp < -6) data = sign | uint8_t(q / std::ldexp(1.0f, -9));
    else data = sign | uint8_t(((exp + 7) << 3) | (int(q / std::ldexp(1.0f, exp - 3)) - 8));
  }
  static float_e4m3_t from_bits(uint8_t b) {
    float_e4m3_t r;
    r.data = b;
    return r;
  }
  explicit operator float() const {
    int e = (data >> 3) & 0xf, m = data & 7;
    float v = (e == 0xf && m == 7) ? NAN : e ? std::ldexp(1.0f + m / 8.0f, e - 7) : std::ldexp(m / 8.0f, -6);
    return data & 0x80 ? -v : v;
  }
};
}  // namespace tl

// The launch: every block in turn over a fresh, poisoned UB (0xff: NaN floats, -1 integers, so a
// read of UB nothing wrote shows), the arguments given as 64-bit words in the kernel's order.
template <typename P>
inline P asc_emu_arg(uint64_t w) {
  if constexpr (std::is_pointer_v<P>) return reinterpret_cast<P>(w);
  else if constexpr (std::is_same_v<P, float>) {
    uint32_t u = uint32_t(w);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else return P(int64_t(w));
}

int asc_emu_guard(int32_t blocks, void (*launch)(const uint64_t *), const uint64_t *words);

template <typename... P, size_t... I>
void asc_emu_call(void (*kernel)(P...), const uint64_t *w, std::index_sequence<I...>) {
  kernel(asc_emu_arg<P>(w[I])...);
}

#define ASC_EMU_ENTRY(kernel)                                                                         \
  extern "C" int asc_emu_launch(int32_t blocks, const uint64_t *words) {                              \
    return asc_emu_guard(blocks, [](const uint64_t *w) { asc_emu_call_of(kernel, w); }, words);        \
  }

template <typename... P>
void asc_emu_call_of(void (*kernel)(P...), const uint64_t *w) {
  asc_emu_call(kernel, w, std::index_sequence_for<P...>{});
}
