/* The plain SF c / 448 as the cast kernel computes it (div_fmt_max in
   kernels_tl/quant/norm_forward_and_per_token_cast.py): q = c * RN(1/448), corrected by
   q + fma(-q, 448, c) * RN(1/448), against the correctly rounded division, for every fp32 bit
   pattern in [0, inf). Build host (x86-64, FMA): gcc -O2 -mfma div_fmt_max_check.c -lm && ./a.out
   2026-12-01: "mismatches 599186 first 0x000002a0 (9.41673e-43) last 0x037ffff1 (7.52316e-37)",
   i.e. exact for every c >= 2^-120 (0x03800000); the kernel divides below that and for inf. */
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
static float f(uint32_t u){float x; memcpy(&x,&u,4); return x;}
static uint32_t b(float x){uint32_t u; memcpy(&u,&x,4); return u;}
int main(void){
  const float d = 448.0f, r = 1.0f / 448.0f;
  uint64_t bad = 0; uint32_t first = 0, last = 0;
  for (uint64_t u = 0; u < 0x7f800000u; u++) {
    float c = f((uint32_t)u);
    float want = c / d;
    float q0 = c * r;
    float rem = fmaf(-q0, d, c);
    float q1 = fmaf(rem, r, q0);
    if (b(q1) != b(want)) { if (!bad) first = (uint32_t)u; bad++; last = (uint32_t)u; }
  }
  printf("mismatches %llu first 0x%08x (%g) last 0x%08x (%g)\n", (unsigned long long)bad, first, f(first), last, f(last));
  return 0;
}
