// Shared pieces of the VAES + AVX-512 AES paths (half-gates and three-halves
// kernels): compiled through target attributes, used only after a run-time
// CPU check, so the build itself needs only the baseline ISA.
#pragma once

#include "garbled_core/block.h"

#if GC_X86
namespace gc {

#define GC_VAES_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,vaes,aes,sse4.1")))

// AES-128 key expansion of four keys at once, one per 128-bit lane.
// SubWord(RotWord(w3)) comes from AESENCLAST on a vector whose four words all
// hold RotWord(w3): with equal columns ShiftRows does nothing, so what is
// left is SubBytes plus the round constant.
GC_VAES_TARGET inline void zexpand4(__m512i key, __m512i* rk) {
  const __m512i rot_w3 = _mm512_maskz_broadcast_i32x4(
      0xffff, _mm_setr_epi8(13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12, 13, 14, 15, 12));
  static const int rcon[10] = {0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36};
  rk[0] = key;
  for (int r = 0; r < 10; ++r) {
    __m512i t = _mm512_shuffle_epi8(key, rot_w3);
    t = _mm512_aesenclast_epi128(t, _mm512_set1_epi32(rcon[r]));
    key = _mm512_xor_si512(key, _mm512_bslli_epi128(key, 4));
    key = _mm512_xor_si512(key, _mm512_bslli_epi128(key, 8));
    key = _mm512_xor_si512(key, t);
    rk[r + 1] = key;
  }
}

// Broadcasts lane L of v to all four lanes.
template <int L>
GC_VAES_TARGET inline __m512i zlane(__m512i v) {
  return _mm512_maskz_shuffle_i64x2(0xff, v, v, L * 0x55);
}

// Lane L of the 512-bit value at p in all four lanes, as a broadcast load: a load-port uop,
// where zlane of a register is a shuffle on the port the AES kernels' other work needs.
template <int L>
GC_VAES_TARGET inline __m512i zlane_load(const __m512i* p) {
  // maskz form: the unmasked intrinsic trips a GCC 12 -Wuninitialized bug.
  return _mm512_maskz_broadcast_i32x4(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p) + L));
}

// All-ones in each 128-bit lane whose lowest bit is set.
GC_VAES_TARGET inline __m512i zlsb_mask(__m512i x) {
  const __m512i one = _mm512_set_epi64(0, 1, 0, 1, 0, 1, 0, 1);
  __m512i t = _mm512_sub_epi64(_mm512_setzero_si512(), _mm512_and_si512(x, one));
  // maskz forms: the unmasked intrinsics trip a GCC 12 -Wuninitialized bug.
  return _mm512_maskz_shuffle_epi32(0xffff, t, (_MM_PERM_ENUM)0x44);
}

// True when this CPU has VAES, AVX-512F, BW and DQ.
inline bool cpu_has_vaes() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("vaes") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
}

}  // namespace gc
#endif
