// GF(2^128) arithmetic for the consistency checks of maliciously secure OT (KOS):
// elements are blocks, bit i of the 128-bit integer (low64 bit i for i < 64) the
// coefficient of x^i, reduced modulo p(x) = x^128 + x^7 + x^2 + x + 1 (irreducible; GCM's
// polynomial without GCM's bit reflection). Sums of products are taken unreduced (256 bits)
// and reduced once: reduction is linear.
// Header-only so that the check's loop inlines the carry-less multiply.
#pragma once

#include <cstdint>

#include "garbled_core/block.h"

namespace gc {

// A 256-bit carry-less product, not yet reduced.
struct Wide {
  block lo, hi;
};

#if GC_X86
inline Wide clmul_wide(block a, block b) {
  block t0 = _mm_clmulepi64_si128(a, b, 0x00);
  block t1 = _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x10), _mm_clmulepi64_si128(a, b, 0x01));
  block t3 = _mm_clmulepi64_si128(a, b, 0x11);
  return {_mm_xor_si128(t0, _mm_slli_si128(t1, 8)), _mm_xor_si128(t3, _mm_srli_si128(t1, 8))};
}

// x^128 = x^7 + x^2 + x + 1 (0x87) mod p: the high half times 0x87 folds in twice (the
// first fold spills at most 7 bits above bit 127).
inline block gf128_reduce(const Wide& w) {
  const block poly = _mm_set_epi64x(0, 0x87);
  block upper = _mm_clmulepi64_si128(w.hi, poly, 0x01);  // hi's upper 64 bits * 0x87
  block lower = _mm_clmulepi64_si128(w.hi, poly, 0x00);  // hi's lower 64 bits * 0x87
  block r = _mm_xor_si128(w.lo, _mm_xor_si128(lower, _mm_slli_si128(upper, 8)));
  return _mm_xor_si128(r, _mm_clmulepi64_si128(_mm_srli_si128(upper, 8), poly, 0x00));
}
#else
namespace detail {
// 64 x 64 -> 128 carry-less multiply, bit by bit (the portable path).
inline void clmul64(uint64_t a, uint64_t b, uint64_t& lo, uint64_t& hi) {
  lo = hi = 0;
  for (int i = 0; i < 64; ++i)
    if ((b >> i) & 1) {
      lo ^= a << i;
      if (i) hi ^= a >> (64 - i);
    }
}
}  // namespace detail

inline Wide clmul_wide(block a, block b) {
  uint64_t a0 = low64(a), a1 = high64(a), b0 = low64(b), b1 = high64(b);
  uint64_t l0, h0, l1, h1, l2, h2, l3, h3;
  detail::clmul64(a0, b0, l0, h0);
  detail::clmul64(a1, b0, l1, h1);
  detail::clmul64(a0, b1, l2, h2);
  detail::clmul64(a1, b1, l3, h3);
  uint64_t mid_lo = l1 ^ l2, mid_hi = h1 ^ h2;
  return {make_block(h0 ^ mid_lo, l0), make_block(h3, l3 ^ mid_hi)};
}

inline block gf128_reduce(const Wide& w) {
  uint64_t r0 = low64(w.lo), r1 = high64(w.lo), h0 = low64(w.hi), h1 = high64(w.hi);
  uint64_t l, h;
  detail::clmul64(h1, 0x87, l, h);  // x^192.. terms: land at bits 64.. (+ spill h above 127)
  r1 ^= l;
  uint64_t spill = h;
  detail::clmul64(h0, 0x87, l, h);
  r0 ^= l;
  r1 ^= h;
  detail::clmul64(spill, 0x87, l, h);
  r0 ^= l;
  return make_block(r1, r0);
}
#endif

inline Wide xor_wide(const Wide& a, const Wide& b) { return {xor_block(a.lo, b.lo), xor_block(a.hi, b.hi)}; }

inline block gf128_mul(block a, block b) { return gf128_reduce(clmul_wide(a, b)); }

}  // namespace gc
