#include "garbled_core/threehalves.h"

#include <algorithm>
#include <cstring>

#include "garbled_core/aes.h"
#include "garbled_core/halfgates.h"
#include "garbled_core/vaes.h"

namespace gc {

namespace {

#include "threehalves_tables.inc"

constexpr size_t kGroup = 8;      // instances per hash key (as in half-gates)
constexpr size_t kSpan = 2 * kGroup;  // instances per kernel step (one VAES call)

inline block all_or_nothing(bool hi, bool lo) {
  return make_block(hi ? ~0ull : 0ull, lo ? ~0ull : 0ull);
}

// [x_R | x_L]: the two halves of a label exchanged.
inline block swap_halves(block x) {
#if GC_X86
  return _mm_shuffle_epi32(x, 0x4E);
#else
  return vextq_u64(x, x, 1);
#endif
}

// [x.lo | y.lo] as (low, high).
inline block low_halves(block x, block y) {
#if GC_X86
  return _mm_unpacklo_epi64(x, y);
#else
  return vcombine_u64(vget_low_u64(x), vget_low_u64(y));
#endif
}

inline unsigned hash_bit(block h) { return (unsigned)(high64(h) & 1); }

// A coefficient row over the symbols (A_L, A_R, B_L, B_R, ...) applied as masks to the
// blocks A, swap(A), B, swap(B): the low half of the result takes lo_coef, the high half
// hi_coef.
struct HalfMasks {
  block m[4];
};

HalfMasks masks_for(unsigned lo_coef, unsigned hi_coef) {
  HalfMasks h;
  h.m[0] = all_or_nothing(hi_coef >> 1 & 1, lo_coef & 1);       // [A_L | A_R]
  h.m[1] = all_or_nothing(hi_coef & 1, lo_coef >> 1 & 1);       // [A_R | A_L]
  h.m[2] = all_or_nothing(hi_coef >> 3 & 1, lo_coef >> 2 & 1);  // [B_L | B_R]
  h.m[3] = all_or_nothing(hi_coef >> 2 & 1, lo_coef >> 3 & 1);  // [B_R | B_L]
  return h;
}

inline block apply(const HalfMasks& h, block a, block sa, block b, block sb) {
  return xor_block(xor_block(and_block(h.m[0], a), and_block(h.m[1], sa)),
                   xor_block(and_block(h.m[2], b), and_block(h.m[3], sb)));
}

// Garbler: per case, the masks of the output pairs [C0_L | C0_R], [G0 | G1], [G2 | 0].
struct GarbleCase {
  HalfMasks out[3];
};

struct GarbleTables {
  GarbleCase cases[16];
  GarbleTables() {
    for (unsigned q = 0; q < 16; ++q) {
      const ThCase& cs = kThCases[q];
      for (unsigned p = 0; p < 3; ++p)
        cases[q].out[p] = masks_for(cs.coef[2 * p], p < 2 ? cs.coef[2 * p + 1] : 0);
    }
  }
};

// Evaluator: masks by (2 i + j, r1, r2), and the selections of [G0 | G1] and G2 by 2 i + j.
struct EvalTables {
  HalfMasks r[16];
  block g01[4], g2[4];
  EvalTables() {
    for (unsigned ij = 0; ij < 4; ++ij) {
      const bool i = ij >> 1, j = ij & 1;
      g01[ij] = all_or_nothing(j, i);
      g2[ij] = all_or_nothing(i != j, i != j);
      for (unsigned rr = 0; rr < 4; ++rr) {
        unsigned m = kThRp[ij] ^ ((rr & 1) ? kThS1 : 0) ^ ((rr & 2) ? kThS2 : 0);
        r[4 * ij + rr] = masks_for(m & 15, m >> 4);
      }
    }
  }
};

const GarbleTables& garble_tables() {
  static const GarbleTables t;
  return t;
}
const EvalTables& eval_tables() {
  static const EvalTables t;
  return t;
}

// The Delta part of each case's output pairs (Delta is fixed for a call).
struct DeltaTerms {
  block out[16][3];
  alignas(64) uint64_t lo[3 * 16], hi[3 * 16];  // the same by output pair p: [16 p + q]
  explicit DeltaTerms(block delta) {
    const uint64_t dl = low64(delta), dr = high64(delta);
    auto part = [&](unsigned coef) {
      return ((coef >> 4 & 1) ? dl : 0) ^ ((coef >> 5 & 1) ? dr : 0);
    };
    for (unsigned q = 0; q < 16; ++q) {
      const ThCase& cs = kThCases[q];
      for (unsigned p = 0; p < 3; ++p) {
        out[q][p] = make_block(p < 2 ? part(cs.coef[2 * p + 1]) : 0, part(cs.coef[2 * p]));
        lo[16 * p + q] = low64(out[q][p]);
        hi[16 * p + q] = high64(out[q][p]);
      }
    }
  }
};

inline bool use_vaes() {
#if GC_X86
  return std::strcmp(and_kernels().name, "vaes") == 0;
#else
  return false;
#endif
}

// ---------------------------------------------------------------- hashing
// H(x) = AES_k(x) ^ x in place, k = salt ^ (tweak, group << 2 | which), which = 0 for the
// A-side inputs, 1 for B, 2 for A ^ B. Arrays hold, per group of the span, Per * 8 blocks
// (the garbler: 8 colour-0 then 8 colour-1 inputs; the evaluator: its 8 inputs).

inline AesKey hash_key(block salt, uint64_t tweak, uint64_t group, uint64_t which) {
  return aes_key(xor_block(salt, make_block(tweak, (group << 2) | which)));
}

template <int Per>
void hash_span_aes128(block salt, uint64_t tweak, uint64_t group, block* xa, block* xb,
                      block* xx) {
  block* arrays[3] = {xa, xb, xx};
  for (uint64_t h = 0; h < 2; ++h)
    for (uint64_t which = 0; which < 3; ++which) {
      const AesKey k = hash_key(salt, tweak, group + h, which);
      block* x = arrays[which] + h * kGroup * Per;
      block y[kGroup * Per];
      std::memcpy(y, x, sizeof(y));
      for (int t = 0; t < Per; ++t) aes_encrypt_blocks<8>(k, y + kGroup * t);
      for (size_t t = 0; t < kGroup * Per; ++t) x[t] = xor_block(x[t], y[t]);
    }
}


template <int Per>
void hash_span(block salt, uint64_t tweak, uint64_t group, block* xa, block* xb, block* xx) {
  hash_span_aes128<Per>(salt, tweak, group, xa, xb, xx);
}

// ---------------------------------------------------------------- one span of 16

void garble_span16(const block* a0, const block* b0, block* c0, uint64_t* g, uint8_t* z,
                   const uint8_t* coins, block delta, const DeltaTerms& dterms, block salt,
                   uint64_t tweak, uint64_t group) {
  const GarbleTables& tables = garble_tables();
  block abar[kSpan], bbar[kSpan], xa[2 * kSpan], xb[2 * kSpan], xx[2 * kSpan];
  unsigned cases[kSpan];
  for (size_t j = 0; j < kSpan; ++j) {
    const bool pa = lsb(a0[j]), pb = lsb(b0[j]);
    // The colour-0 labels: the ones the evaluator holds when i (or j) is 0.
    abar[j] = xor_block(a0[j], and_block(select_mask(pa), delta));
    bbar[j] = xor_block(b0[j], and_block(select_mask(pb), delta));
    const size_t h = j / kGroup, k = j % kGroup, c0i = 2 * kGroup * h + k, c1i = c0i + kGroup;
    xa[c0i] = abar[j];
    xa[c1i] = xor_block(abar[j], delta);
    xb[c0i] = bbar[j];
    xb[c1i] = xor_block(bbar[j], delta);
    xx[c0i] = xor_block(abar[j], bbar[j]);
    xx[c1i] = xor_block(xx[c0i], delta);
    cases[j] = (unsigned)pa | (unsigned)pb << 1 | (unsigned)coins[j] << 2;
  }
  hash_span<2>(salt, tweak, group, xa, xb, xx);
  for (size_t j = 0; j < kSpan; ++j) {
    const size_t h = j / kGroup, k = j % kGroup, c0i = 2 * kGroup * h + k, c1i = c0i + kGroup;
    const unsigned q = cases[j];
    const GarbleCase& masks = tables.cases[q];
    const block a = abar[j], b = bbar[j], sa = swap_halves(a), sb = swap_halves(b);
    const block t0 = xor_block(xa[c0i], xx[c0i]);  // hA0 ^ hX0
    const block t1 = xor_block(xb[c0i], xx[c0i]);  // hB0 ^ hX0
    const block t2 = xor_block(xa[c0i], xa[c1i]);  // hA0 ^ hA1
    const block t3 = xor_block(xb[c0i], xb[c1i]);  // hB0 ^ hB1
    const block t4 = xor_block(xx[c0i], xx[c1i]);  // hX0 ^ hX1
    const block p0 = xor_block(xor_block(dterms.out[q][0], apply(masks.out[0], a, sa, b, sb)),
                               low_halves(t0, t1));
    const block p1 = xor_block(xor_block(dterms.out[q][1], apply(masks.out[1], a, sa, b, sb)),
                               low_halves(t2, t3));
    const block p2 = xor_block(xor_block(dterms.out[q][2], apply(masks.out[2], a, sa, b, sb)), t4);
    c0[j] = p0;
    g[k + 3 * kGroup * h] = low64(p1);
    g[k + 3 * kGroup * h + kGroup] = high64(p1);
    g[k + 3 * kGroup * h + 2 * kGroup] = low64(p2);
    z[j] = (uint8_t)(kThCases[q].z ^ hash_bit(t0) ^ hash_bit(t1) << 1 ^ hash_bit(t2) << 2 ^
                     hash_bit(t3) << 3 ^ hash_bit(t4) << 4);
  }
}

void eval_span16(const block* a_in, const block* b_in, block* c, const uint64_t* g,
                 const uint8_t* z, block salt, uint64_t tweak, uint64_t group) {
  const EvalTables& tables = eval_tables();
  block a[kSpan], b[kSpan], ha[kSpan], hb[kSpan], hx[kSpan];
  for (size_t j = 0; j < kSpan; ++j) {
    a[j] = ha[j] = a_in[j];
    b[j] = hb[j] = b_in[j];
    hx[j] = xor_block(a[j], b[j]);
  }
  hash_span<1>(salt, tweak, group, ha, hb, hx);
  for (size_t j = 0; j < kSpan; ++j) {
    const size_t h = j / kGroup, k = j % kGroup;
    const unsigned i = lsb(a[j]), jj = lsb(b[j]), ij = 2 * i + jj, zj = z[j];
    const unsigned ix = i ^ jj, cx = hash_bit(hx[j]);
    const unsigned r1 = (zj ^ (i & zj >> 2) ^ (ix & zj >> 4) ^ hash_bit(ha[j]) ^ cx) & 1;
    const unsigned r2 = ((zj >> 1) ^ (jj & zj >> 3) ^ (ix & zj >> 4) ^ hash_bit(hb[j]) ^ cx) & 1;
    const uint64_t* row = g + 3 * kGroup * h + k;
    const block g01 = make_block(row[kGroup], row[0]);
    const block g22 = make_block(row[2 * kGroup], row[2 * kGroup]);
    block out = low_halves(xor_block(ha[j], hx[j]), xor_block(hb[j], hx[j]));
    out = xor_block(out, and_block(tables.g01[ij], g01));
    out = xor_block(out, and_block(tables.g2[ij], g22));
    out = xor_block(out, apply(tables.r[4 * ij + r1 + 2 * r2], a[j], swap_halves(a[j]), b[j],
                               swap_halves(b[j])));
    c[j] = out;
  }
}

#if GC_X86
// ---------------------------------------------------------------- VAES + AVX-512 path
// Four instances per register (one label per 128-bit lane). Per-instance choices
// (which coefficient masks apply) come from small per-case bit tables: bit n of a lane's
// case word becomes an all-ones or all-zero qword by shifting it to the top and back.

// Garbler case word: bit 8 p + 2 s + e = mask of output pair p (0: [C0_L | C0_R], 1:
// [G0 | G1], 2: [G2 | -]) for symbol block s (A, swap A, B, swap B) in half e (0 low, 1
// high); bits 24..28: the coin part of the control bits.
struct VaesGarbleTables {
  uint64_t word[16];
  VaesGarbleTables() {
    for (unsigned q = 0; q < 16; ++q) {
      const ThCase& cs = kThCases[q];
      uint64_t w = (uint64_t)cs.z << 24;
      for (unsigned p = 0; p < 3; ++p) {
        const HalfMasks h = masks_for(cs.coef[2 * p], p < 2 ? cs.coef[2 * p + 1] : 0);
        for (unsigned t = 0; t < 4; ++t) {
          w |= (uint64_t)(low64(h.m[t]) & 1) << (8 * p + 2 * t);
          w |= (uint64_t)(high64(h.m[t]) & 1) << (8 * p + 2 * t + 1);
        }
      }
      word[q] = w;
    }
  }
};

// Evaluator word by 4 (2 i + j) + r1 + 2 r2: bits 2 s + e as above for R; bit 8 / 9: G0 / G1
// selected (i / j); bit 10: G2 selected (i ^ j).
struct VaesEvalTables {
  uint64_t word[16];
  VaesEvalTables() {
    const EvalTables& et = eval_tables();
    for (unsigned idx = 0; idx < 16; ++idx) {
      const unsigned ij = idx / 4;
      uint64_t w = 0;
      for (unsigned t = 0; t < 4; ++t) {
        w |= (uint64_t)(low64(et.r[idx].m[t]) & 1) << (2 * t);
        w |= (uint64_t)(high64(et.r[idx].m[t]) & 1) << (2 * t + 1);
      }
      w |= (uint64_t)(low64(et.g01[ij]) & 1) << 8 | (uint64_t)(high64(et.g01[ij]) & 1) << 9;
      w |= (uint64_t)(low64(et.g2[ij]) & 1) << 10;
      word[idx] = w;
    }
  }
};

const VaesGarbleTables& vaes_garble_tables() {
  static const VaesGarbleTables t;
  return t;
}
const VaesEvalTables& vaes_eval_tables() {
  static const VaesEvalTables t;
  return t;
}

// All-ones qwords where bit (base + e) of the lane's word is set, e = 0 for the low qword and
// 1 for the high one.
GC_VAES_TARGET inline __m512i zbit_mask(__m512i word, int base) {
  const __m512i shift = _mm512_set_epi64(62 - base, 63 - base, 62 - base, 63 - base, 62 - base,
                                         63 - base, 62 - base, 63 - base);
  return _mm512_srai_epi64(_mm512_sllv_epi64(word, shift), 63);
}

GC_VAES_TARGET inline __m512i zswap_halves(__m512i x) {
  return _mm512_maskz_shuffle_epi32(0xffff, x, (_MM_PERM_ENUM)0x4E);
}

// The lowest bit of each lane's high qword, in both qwords.
GC_VAES_TARGET inline __m512i zhigh_bit(__m512i x) {
  const __m512i one = _mm512_set1_epi64(1);
  return _mm512_and_si512(_mm512_maskz_shuffle_epi32(0xffff, x, (_MM_PERM_ENUM)0xEE), one);
}

// Sum over the four symbol blocks of their masks (bits 8 p + 2 s + e of word) and values.
GC_VAES_TARGET inline __m512i zcombine(__m512i word, int base, __m512i a, __m512i sa, __m512i b,
                                       __m512i sb) {
  __m512i r = _mm512_and_si512(zbit_mask(word, base), a);
  r = _mm512_xor_si512(r, _mm512_and_si512(zbit_mask(word, base + 2), sa));
  r = _mm512_xor_si512(r, _mm512_and_si512(zbit_mask(word, base + 4), b));
  return _mm512_xor_si512(r, _mm512_and_si512(zbit_mask(word, base + 6), sb));
}

// H = AES(x) ^ x in place over the 16 instances of a span: x[(3 v + w) * Per + t] holds
// instances 4 v .. 4 v + 3 of hash w (0: A side, 1: B side, 2: A ^ B; Per inputs each, the
// garbler's colour 0 and 1). Instances 0-7 are group g, 8-15 group g + 1; keys: rk1 lanes
// (g, A), (g, B), (g + 1, A), (g + 1, B), rk2 lanes (g, X), (g + 1, X). Fully unrolled so
// the registers stay in registers.
// One round's six keys broadcast from their lanes (a function, not a lambda: a lambda would
// not carry the target attribute, and nothing in it would inline).
GC_VAES_TARGET inline void zround_keys(__m512i r1, __m512i r2, __m512i* k) {
  k[0] = zlane<0>(r1);
  k[1] = zlane<1>(r1);
  k[2] = zlane<2>(r1);
  k[3] = zlane<3>(r1);
  k[4] = zlane<0>(r2);
  k[5] = zlane<1>(r2);
}

template <int Per>
GC_VAES_TARGET inline void zhash(const __m512i* rk1, const __m512i* rk2, __m512i* x) {
  constexpr int N = 12 * Per;
  __m512i in[N];
#pragma GCC unroll 64
  for (int r = 0; r < N; ++r) in[r] = x[r];
  // Key index of register r: group (r / (6 Per)) and hash ((r / Per) % 3).
  auto key_of = [](int r) {
    const int grp = r / (6 * Per), w = (r / Per) % 3;
    return w < 2 ? 2 * grp + w : 4 + grp;
  };
  __m512i k[6];
  zround_keys(rk1[0], rk2[0], k);
#pragma GCC unroll 64
  for (int r = 0; r < N; ++r) x[r] = _mm512_xor_si512(x[r], k[key_of(r)]);
#pragma GCC unroll 1
  for (int round = 1; round < 10; ++round) {
    zround_keys(rk1[round], rk2[round], k);
#pragma GCC unroll 64
    for (int r = 0; r < N; ++r) x[r] = _mm512_aesenc_epi128(x[r], k[key_of(r)]);
  }
  zround_keys(rk1[10], rk2[10], k);
#pragma GCC unroll 64
  for (int r = 0; r < N; ++r)
    x[r] = _mm512_xor_si512(_mm512_aesenclast_epi128(x[r], k[key_of(r)]), in[r]);
}

// rk1 lanes: (g, A), (g, B), (g + 1, A), (g + 1, B); rk2 lanes: (g, X), (g + 1, X), again.
GC_VAES_TARGET inline void zhash_keys(block salt, uint64_t tweak, uint64_t group, __m512i* rk1,
                                      __m512i* rk2) {
  const __m512i s = _mm512_maskz_broadcast_i32x4(0xffff, salt);
  const long long t = (long long)tweak, g0 = (long long)(group << 2),
                  g1 = (long long)((group + 1) << 2);
  zexpand4(_mm512_xor_si512(s, _mm512_set_epi64(t, g1 | 1, t, g1, t, g0 | 1, t, g0)), rk1);
  zexpand4(_mm512_xor_si512(s, _mm512_set_epi64(t, g1 | 2, t, g0 | 2, t, g1 | 2, t, g0 | 2)),
           rk2);
}

// 16 instances (two hash groups): registers v = 0..3 hold instances 4 v .. 4 v + 3.
GC_VAES_TARGET void garble_span16_vaes(const block* a0, const block* b0, block* c0, uint64_t* g,
                                       uint8_t* z, const uint8_t* coins, block delta,
                                       const uint64_t* dlo, const uint64_t* dhi, block salt,
                                       uint64_t tweak, uint64_t group) {
  const VaesGarbleTables& tables = vaes_garble_tables();
  __m512i rk1[11], rk2[11];
  zhash_keys(salt, tweak, group, rk1, rk2);
  const __m512i d = _mm512_maskz_broadcast_i32x4(0xffff, delta);
  const __m512i words_lo = _mm512_loadu_si512((const void*)tables.word);
  const __m512i words_hi = _mm512_loadu_si512((const void*)(tables.word + 8));
  __m512i abar[4], bbar[4], word[4];
  // Hash inputs, per register v: A0, A1, B0, B1, X0, X1 (colour-0 and colour-1).
  __m512i h[24];  // (3 v + w) * 2 + colour
  for (int v = 0; v < 4; ++v) {
    const __m512i a = _mm512_loadu_si512((const void*)(a0 + 4 * v));
    const __m512i b = _mm512_loadu_si512((const void*)(b0 + 4 * v));
    const __m512i pa = zlsb_mask(a), pb = zlsb_mask(b);
    abar[v] = _mm512_xor_si512(a, _mm512_and_si512(pa, d));
    bbar[v] = _mm512_xor_si512(b, _mm512_and_si512(pb, d));
    const __m512i x = _mm512_xor_si512(abar[v], bbar[v]);
    h[6 * v + 0] = abar[v];
    h[6 * v + 1] = _mm512_xor_si512(abar[v], d);
    h[6 * v + 2] = bbar[v];
    h[6 * v + 3] = _mm512_xor_si512(bbar[v], d);
    h[6 * v + 4] = x;
    h[6 * v + 5] = _mm512_xor_si512(x, d);
    // Case q = pa | pb << 1 | coins << 2 in both qwords of each lane.
    const __m512i coin = _mm512_set_epi64(coins[4 * v + 3], coins[4 * v + 3], coins[4 * v + 2],
                                          coins[4 * v + 2], coins[4 * v + 1], coins[4 * v + 1],
                                          coins[4 * v], coins[4 * v]);
    const __m512i q = _mm512_or_si512(
        _mm512_or_si512(_mm512_and_si512(pa, _mm512_set1_epi64(1)),
                        _mm512_and_si512(pb, _mm512_set1_epi64(2))),
        _mm512_slli_epi64(coin, 2));
    word[v] = _mm512_permutex2var_epi64(words_lo, q, words_hi);
    // Delta terms need q too: stash it in the unused upper bits of the word.
    word[v] = _mm512_or_si512(word[v], _mm512_slli_epi64(q, 32));
  }
  zhash<2>(rk1, rk2, h);
  const __m512i dlo_a = _mm512_loadu_si512((const void*)dlo);
  const __m512i dlo_b = _mm512_loadu_si512((const void*)(dlo + 8));
  const __m512i dlo_c = _mm512_loadu_si512((const void*)(dlo + 16));
  const __m512i dlo_d = _mm512_loadu_si512((const void*)(dlo + 24));
  const __m512i dlo_e = _mm512_loadu_si512((const void*)(dlo + 32));
  const __m512i dlo_f = _mm512_loadu_si512((const void*)(dlo + 40));
  const __m512i dhi_a = _mm512_loadu_si512((const void*)dhi);
  const __m512i dhi_b = _mm512_loadu_si512((const void*)(dhi + 8));
  const __m512i dhi_c = _mm512_loadu_si512((const void*)(dhi + 16));
  const __m512i dhi_d = _mm512_loadu_si512((const void*)(dhi + 24));
  const __m512i dhi_e = _mm512_loadu_si512((const void*)(dhi + 32));
  const __m512i dhi_f = _mm512_loadu_si512((const void*)(dhi + 40));
  const __m512i dlo_v[3][2] = {{dlo_a, dlo_b}, {dlo_c, dlo_d}, {dlo_e, dlo_f}};
  const __m512i dhi_v[3][2] = {{dhi_a, dhi_b}, {dhi_c, dhi_d}, {dhi_e, dhi_f}};
  __m512i p1[4], p2[4], zv[4];
  for (int v = 0; v < 4; ++v) {
    const __m512i* hv = h + 6 * v;
    const __m512i t0 = _mm512_xor_si512(hv[0], hv[4]);  // hA0 ^ hX0
    const __m512i t1 = _mm512_xor_si512(hv[2], hv[4]);  // hB0 ^ hX0
    const __m512i t2 = _mm512_xor_si512(hv[0], hv[1]);  // hA0 ^ hA1
    const __m512i t3 = _mm512_xor_si512(hv[2], hv[3]);  // hB0 ^ hB1
    const __m512i t4 = _mm512_xor_si512(hv[4], hv[5]);  // hX0 ^ hX1
    const __m512i a = abar[v], b = bbar[v], sa = zswap_halves(a), sb = zswap_halves(b);
    const __m512i q = _mm512_srli_epi64(word[v], 32);
    __m512i dt[3];
    for (int p = 0; p < 3; ++p) {
      // The case's Delta term: its low qword from dlo[p], its high one from dhi[p].
      const __m512i lo = _mm512_permutex2var_epi64(dlo_v[p][0], q, dlo_v[p][1]);
      const __m512i hi = _mm512_permutex2var_epi64(dhi_v[p][0], q, dhi_v[p][1]);
      dt[p] = _mm512_mask_blend_epi64(0xAA, lo, hi);
    }
    const __m512i out0 = _mm512_xor_si512(_mm512_xor_si512(dt[0], zcombine(word[v], 0, a, sa, b, sb)),
                                          _mm512_unpacklo_epi64(t0, t1));
    p1[v] = _mm512_xor_si512(_mm512_xor_si512(dt[1], zcombine(word[v], 8, a, sa, b, sb)),
                             _mm512_unpacklo_epi64(t2, t3));
    p2[v] = _mm512_xor_si512(_mm512_xor_si512(dt[2], zcombine(word[v], 16, a, sa, b, sb)), t4);
    _mm512_storeu_si512((void*)(c0 + 4 * v), out0);
    // Control bits: the case's coin part and bit 64 of each hash combination.
    __m512i zz = _mm512_and_si512(_mm512_srli_epi64(word[v], 24), _mm512_set1_epi64(31));
    zz = _mm512_xor_si512(zz, zhigh_bit(t0));
    zz = _mm512_xor_si512(zz, _mm512_slli_epi64(zhigh_bit(t1), 1));
    zz = _mm512_xor_si512(zz, _mm512_slli_epi64(zhigh_bit(t2), 2));
    zz = _mm512_xor_si512(zz, _mm512_slli_epi64(zhigh_bit(t3), 3));
    zv[v] = _mm512_xor_si512(zz, _mm512_slli_epi64(zhigh_bit(t4), 4));
  }
  const __m512i even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
  for (int grp = 0; grp < 2; ++grp) {
    uint64_t* rows = g + 3 * kGroup * grp;
    const __m512i x1 = p1[2 * grp], y1 = p1[2 * grp + 1];
    _mm512_storeu_si512((void*)rows, _mm512_permutex2var_epi64(x1, even, y1));
    _mm512_storeu_si512((void*)(rows + kGroup), _mm512_permutex2var_epi64(x1, odd, y1));
    _mm512_storeu_si512((void*)(rows + 2 * kGroup),
                        _mm512_permutex2var_epi64(p2[2 * grp], even, p2[2 * grp + 1]));
    alignas(64) uint64_t zs[16];
    _mm512_store_si512((void*)zs, _mm512_permutex2var_epi64(zv[2 * grp], even, zv[2 * grp + 1]));
    for (size_t j = 0; j < kGroup; ++j) z[kGroup * grp + j] = (uint8_t)zs[j];
  }
}

GC_VAES_TARGET void eval_span16_vaes(const block* a_in, const block* b_in, block* c,
                                     const uint64_t* g, const uint8_t* z, block salt,
                                     uint64_t tweak, uint64_t group) {
  const VaesEvalTables& tables = vaes_eval_tables();
  __m512i rk1[11], rk2[11];
  zhash_keys(salt, tweak, group, rk1, rk2);
  const __m512i words_lo = _mm512_loadu_si512((const void*)tables.word);
  const __m512i words_hi = _mm512_loadu_si512((const void*)(tables.word + 8));
  __m512i a[4], b[4], h[12];  // 3 v + w
  for (int v = 0; v < 4; ++v) {
    a[v] = _mm512_loadu_si512((const void*)(a_in + 4 * v));
    b[v] = _mm512_loadu_si512((const void*)(b_in + 4 * v));
    h[3 * v] = a[v];
    h[3 * v + 1] = b[v];
    h[3 * v + 2] = _mm512_xor_si512(a[v], b[v]);
  }
  zhash<1>(rk1, rk2, h);
  const __m512i one = _mm512_set1_epi64(1);
  for (int v = 0; v < 4; ++v) {
    const __m512i ha = h[3 * v], hb = h[3 * v + 1], hx = h[3 * v + 2];
    const __m512i i = _mm512_and_si512(zlsb_mask(a[v]), one), j = _mm512_and_si512(zlsb_mask(b[v]), one);
    const __m512i ix = _mm512_xor_si512(i, j);
    const __m512i zz = _mm512_set_epi64(z[4 * v + 3], z[4 * v + 3], z[4 * v + 2], z[4 * v + 2],
                                        z[4 * v + 1], z[4 * v + 1], z[4 * v], z[4 * v]);
    const __m512i cx = zhigh_bit(hx);
    __m512i r1 = _mm512_xor_si512(zz, _mm512_and_si512(i, _mm512_srli_epi64(zz, 2)));
    r1 = _mm512_xor_si512(r1, _mm512_and_si512(ix, _mm512_srli_epi64(zz, 4)));
    r1 = _mm512_and_si512(_mm512_xor_si512(r1, _mm512_xor_si512(zhigh_bit(ha), cx)), one);
    __m512i r2 = _mm512_xor_si512(_mm512_srli_epi64(zz, 1),
                                  _mm512_and_si512(j, _mm512_srli_epi64(zz, 3)));
    r2 = _mm512_xor_si512(r2, _mm512_and_si512(ix, _mm512_srli_epi64(zz, 4)));
    r2 = _mm512_and_si512(_mm512_xor_si512(r2, _mm512_xor_si512(zhigh_bit(hb), cx)), one);
    // Table index 4 (2 i + j) + r1 + 2 r2.
    const __m512i idx = _mm512_or_si512(
        _mm512_or_si512(_mm512_slli_epi64(i, 3), _mm512_slli_epi64(j, 2)),
        _mm512_or_si512(r1, _mm512_slli_epi64(r2, 1)));
    const __m512i word = _mm512_permutex2var_epi64(words_lo, idx, words_hi);
    // [G0 | G1] and [G2 | G2] of instances 4 v .. 4 v + 3.
    const int grp = v / 2, k0 = 4 * (v % 2);
    const uint64_t* rows = g + 3 * kGroup * grp;
    const __m512i g0 = _mm512_loadu_si512((const void*)rows);
    const __m512i g1 = _mm512_loadu_si512((const void*)(rows + kGroup));
    const __m512i g2 = _mm512_loadu_si512((const void*)(rows + 2 * kGroup));
    const __m512i pick01 = _mm512_set_epi64(8 + k0 + 3, k0 + 3, 8 + k0 + 2, k0 + 2, 8 + k0 + 1,
                                            k0 + 1, 8 + k0, k0);
    const __m512i pick22 = _mm512_set_epi64(k0 + 3, k0 + 3, k0 + 2, k0 + 2, k0 + 1, k0 + 1, k0, k0);
    const __m512i g01 = _mm512_permutex2var_epi64(g0, pick01, g1);
    const __m512i g22 = _mm512_permutexvar_epi64(pick22, g2);
    __m512i out = _mm512_unpacklo_epi64(_mm512_xor_si512(ha, hx), _mm512_xor_si512(hb, hx));
    out = _mm512_xor_si512(out, _mm512_and_si512(zbit_mask(word, 8), g01));
    const __m512i g2_sel = _mm512_srai_epi64(_mm512_slli_epi64(word, 63 - 10), 63);
    out = _mm512_xor_si512(out, _mm512_and_si512(g2_sel, g22));
    out = _mm512_xor_si512(out, zcombine(word, 0, a[v], zswap_halves(a[v]), b[v],
                                         zswap_halves(b[v])));
    _mm512_storeu_si512((void*)(c + 4 * v), out);
  }
}
#endif

}  // namespace

namespace {

// A span's control bits: 5 per instance, a full group's 40 bits being 5 whole bytes (group
// start / 8 at byte 5 start / 8).
inline void pack_control(const uint8_t* z, size_t rows, uint8_t* out) {
  uint64_t bits = 0;
  for (size_t j = 0; j < rows; ++j) bits |= (uint64_t)z[j] << (5 * j);
  uint8_t packed[8];
  for (size_t t = 0; t < 8; ++t) packed[t] = (uint8_t)(bits >> (8 * t));
  std::memcpy(out, packed, (5 * rows + 7) / 8);
}

inline void unpack_control(const uint8_t* in, size_t rows, uint8_t* z) {
  uint8_t packed[8] = {};
  std::memcpy(packed, in, (5 * rows + 7) / 8);
  uint64_t bits = 0;
  for (size_t t = 0; t < 8; ++t) bits |= (uint64_t)packed[t] << (8 * t);
  for (size_t j = 0; j < kGroup; ++j) z[j] = (uint8_t)((bits >> (5 * j)) & 31);
}

}  // namespace

void garble_and_threehalves(const block* a0, const block* b0, block* c0, uint8_t* table, size_t n,
                            uint64_t first_instance, block delta, block salt, uint64_t tweak,
                            const uint8_t* coins) {
  const DeltaTerms dterms(delta);
  const bool vaes = use_vaes();
  uint64_t group = first_instance / kGroup;
  uint8_t* control = table + 24 * n;
  for (size_t i = 0; i < n; i += kSpan, group += 2) {
    const size_t m = std::min(kSpan, n - i);
    const bool full = m == kSpan;
    // A full span works on the caller's arrays and writes its rows in place (the kernels load
    // every input before they store, so c0 may alias a0 or b0); a short last span on padded
    // copies.
    block pa[kSpan], pb[kSpan], pc[kSpan];
    uint64_t rows_copy[6 * kGroup];
    if (!full) {
      std::memset(pa, 0, sizeof(pa));
      std::memset(pb, 0, sizeof(pb));
      std::memcpy(pa, a0 + i, m * sizeof(block));
      std::memcpy(pb, b0 + i, m * sizeof(block));
    }
    const block* a = full ? a0 + i : pa;
    const block* b = full ? b0 + i : pb;
    block* c = full ? c0 + i : pc;
    uint64_t* g = full ? reinterpret_cast<uint64_t*>(table + 24 * i) : rows_copy;
    uint8_t coin[kSpan] = {}, z[kSpan];
    for (size_t j = 0; j < m; ++j) coin[j] = (coins[(i + j) >> 2] >> (2 * ((i + j) & 3))) & 3;
#if GC_X86
    if (vaes)
      garble_span16_vaes(a, b, c, g, z, coin, delta, dterms.lo, dterms.hi, salt, tweak, group);
    else
#endif
      garble_span16(a, b, c, g, z, coin, delta, dterms, salt, tweak, group);
    if (!full) std::memcpy(c0 + i, pc, m * sizeof(block));
    for (size_t h = 0; h * kGroup < m; ++h) {
      const size_t start = i + h * kGroup, rows = std::min(kGroup, m - h * kGroup);
      if (!full) {
        uint8_t* dst = table + 24 * start;
        for (size_t t = 0; t < 3; ++t)
          std::memcpy(dst + 8 * rows * t, g + 3 * kGroup * h + kGroup * t, 8 * rows);
      }
      pack_control(z + h * kGroup, rows, control + 5 * (start / kGroup));
    }
  }
}

void eval_and_threehalves(const block* a, const block* b, block* c, const uint8_t* table, size_t n,
                          uint64_t first_instance, block salt, uint64_t tweak) {
  const bool vaes = use_vaes();
  uint64_t group = first_instance / kGroup;
  const uint8_t* control = table + 24 * n;
  for (size_t i = 0; i < n; i += kSpan, group += 2) {
    const size_t m = std::min(kSpan, n - i);
    const bool full = m == kSpan;
    block pa[kSpan], pb[kSpan], pc[kSpan];
    uint64_t rows_copy[6 * kGroup];
    uint8_t z[kSpan] = {};
    if (!full) {
      std::memset(pa, 0, sizeof(pa));
      std::memset(pb, 0, sizeof(pb));
      std::memset(rows_copy, 0, sizeof(rows_copy));
      std::memcpy(pa, a + i, m * sizeof(block));
      std::memcpy(pb, b + i, m * sizeof(block));
    }
    for (size_t h = 0; h * kGroup < m; ++h) {
      const size_t start = i + h * kGroup, rows = std::min(kGroup, m - h * kGroup);
      if (!full) {
        const uint8_t* src = table + 24 * start;
        for (size_t t = 0; t < 3; ++t)
          std::memcpy(rows_copy + 3 * kGroup * h + kGroup * t, src + 8 * rows * t, 8 * rows);
      }
      unpack_control(control + 5 * (start / kGroup), rows, z + h * kGroup);
    }
    const block* ai = full ? a + i : pa;
    const block* bi = full ? b + i : pb;
    block* ci = full ? c + i : pc;
    const uint64_t* g = full ? reinterpret_cast<const uint64_t*>(table + 24 * i) : rows_copy;
#if GC_X86
    if (vaes)
      eval_span16_vaes(ai, bi, ci, g, z, salt, tweak, group);
    else
#endif
      eval_span16(ai, bi, ci, g, z, salt, tweak, group);
    if (!full) std::memcpy(c + i, pc, m * sizeof(block));
  }
}

}  // namespace gc
