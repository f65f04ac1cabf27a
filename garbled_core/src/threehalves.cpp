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

inline bool use_vaes() {
#if GC_X86
  return and_kernels().wide;
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
                   const uint8_t* coins, const ThreeHalvesDelta& dterms, block salt,
                   uint64_t tweak, uint64_t group) {
  const block delta = dterms.delta;
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
      // The hash feed-forward of t0 = hA0 ^ hX0 (Bbar) and t1 = hB0 ^ hX0 (Abar): C0_L gets
      // Bbar_L (symbol B, low half), C0_R gets Abar_L (symbol swap A, high half).
      w ^= (uint64_t)1 << (2 * 2 + 0) | (uint64_t)1 << (2 * 1 + 1);
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
      // The hash feed-forward of hA ^ hX (B) and hB ^ hX (A): C_L gets B_L (symbol B, low
      // half), C_R gets A_L (symbol swap A, high half).
      w ^= (uint64_t)1 << (2 * 2 + 0) | (uint64_t)1 << (2 * 1 + 1);
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

// Masked (maskz, all lanes) forms of the AVX-512 operations used below: GCC 12's unmasked
// intrinsics pass an undefined vector that trips -Wuninitialized (vaes.h does the same).
GC_VAES_TARGET inline __m512i zsrli(__m512i x, unsigned n) { return _mm512_maskz_srli_epi64(0xff, x, n); }
GC_VAES_TARGET inline __m512i zslli(__m512i x, unsigned n) { return _mm512_maskz_slli_epi64(0xff, x, n); }
GC_VAES_TARGET inline __m512i zsrlv(__m512i x, __m512i n) { return _mm512_maskz_srlv_epi64(0xff, x, n); }
GC_VAES_TARGET inline __m512i zsllv(__m512i x, __m512i n) { return _mm512_maskz_sllv_epi64(0xff, x, n); }
GC_VAES_TARGET inline __m512i zunpacklo(__m512i x, __m512i y) {
  return _mm512_maskz_unpacklo_epi64(0xff, x, y);
}
GC_VAES_TARGET inline __m512i zpermutexvar(__m512i idx, __m512i x) {
  return _mm512_maskz_permutexvar_epi64(0xff, idx, x);
}
// OR of the 8 qwords.
GC_VAES_TARGET inline uint64_t zor_qwords(__m512i x) {
  const __m256i y = _mm256_or_si256(_mm512_maskz_extracti64x4_epi64(0xff, x, 0),
                                    _mm512_maskz_extracti64x4_epi64(0xff, x, 1));
  const __m128i z = _mm_or_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1));
  return (uint64_t)_mm_cvtsi128_si64(z) | (uint64_t)_mm_extract_epi64(z, 1);
}

GC_VAES_TARGET inline __m512i zswap_halves(__m512i x) {
  return _mm512_maskz_shuffle_epi32(0xffff, x, (_MM_PERM_ENUM)0x4E);
}

// Each lane's high qword, in both qwords.
GC_VAES_TARGET inline __m512i zhigh_qword(__m512i x) {
  return _mm512_maskz_shuffle_epi32(0xffff, x, (_MM_PERM_ENUM)0xEE);
}

// AES(x) in place (the caller adds the feed-forward x of H(x) = AES(x) ^ x where it needs
// it, or folds it into its tables) over the 16 instances of a span: x[(3 v + w) * Per + t] holds
// instances 4 v .. 4 v + 3 of hash w (0: A side, 1: B side, 2: A ^ B; Per inputs each, the
// garbler's colour 0 and 1). Instances 0-7 are group g, 8-15 group g + 1; keys: rk1 lanes
// (g, A), (g, B), (g + 1, A), (g + 1, B), rk2 lanes (g, X), (g + 1, X). Fully unrolled so
// the registers stay in registers.
// One round's six keys broadcast from their lanes (a function, not a lambda: a lambda would
// not carry the target attribute, and nothing in it would inline).
GC_VAES_TARGET inline void zround_keys(const __m512i* r1, const __m512i* r2, __m512i* k) {
  k[0] = zlane_load<0>(r1);
  k[1] = zlane_load<1>(r1);
  k[2] = zlane_load<2>(r1);
  k[3] = zlane_load<3>(r1);
  k[4] = zlane_load<0>(r2);
  k[5] = zlane_load<1>(r2);
}

template <int Per>
GC_VAES_TARGET inline void zaes(const __m512i* rk1, const __m512i* rk2, __m512i* x) {
  constexpr int N = 12 * Per;
  // Key index of register r: group (r / (6 Per)) and hash ((r / Per) % 3).
  auto key_of = [](int r) {
    const int grp = r / (6 * Per), w = (r / Per) % 3;
    return w < 2 ? 2 * grp + w : 4 + grp;
  };
  __m512i k[6];
  zround_keys(rk1, rk2, k);
#pragma GCC unroll 64
  for (int r = 0; r < N; ++r) x[r] = _mm512_xor_si512(x[r], k[key_of(r)]);
#pragma GCC unroll 1
  for (int round = 1; round < 10; ++round) {
    zround_keys(rk1 + round, rk2 + round, k);
#pragma GCC unroll 64
    for (int r = 0; r < N; ++r) x[r] = _mm512_aesenc_epi128(x[r], k[key_of(r)]);
  }
  zround_keys(rk1 + 10, rk2 + 10, k);
#pragma GCC unroll 64
  for (int r = 0; r < N; ++r) x[r] = _mm512_aesenclast_epi128(x[r], k[key_of(r)]);
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

// AES only (no feed-forward) of the 12 garbler hash inputs of one group (registers 6 u + 2 w
// + colour for its two registers u = 0, 1, hash w = A, B, X): keys (group, A) and (group, B)
// from lanes 2 grp, 2 grp + 1 of rk1, (group, X) from lane grp of rk2. The garbler folds the
// feed-forward into its tables (ThreeHalvesDelta::vlo / vhi / vz, VaesGarbleTables).
template <int Grp>
GC_VAES_TARGET inline void zgroup_keys(const __m512i* r1, const __m512i* r2, __m512i* k) {
  k[0] = zlane_load<2 * Grp>(r1);
  k[1] = zlane_load<2 * Grp + 1>(r1);
  k[2] = zlane_load<Grp>(r2);
}

template <int Grp>
GC_VAES_TARGET inline void zaes_group(const __m512i* rk1, const __m512i* rk2, __m512i* x) {
  __m512i k[3];
  zgroup_keys<Grp>(rk1, rk2, k);
#pragma GCC unroll 16
  for (int r = 0; r < 12; ++r) x[r] = _mm512_xor_si512(x[r], k[(r % 6) / 2]);
#pragma GCC unroll 1
  for (int round = 1; round < 10; ++round) {
    zgroup_keys<Grp>(rk1 + round, rk2 + round, k);
#pragma GCC unroll 16
    for (int r = 0; r < 12; ++r) x[r] = _mm512_aesenc_epi128(x[r], k[(r % 6) / 2]);
  }
  zgroup_keys<Grp>(rk1 + 10, rk2 + 10, k);
#pragma GCC unroll 16
  for (int r = 0; r < 12; ++r) x[r] = _mm512_aesenclast_epi128(x[r], k[(r % 6) / 2]);
}

// The qword pattern (bit n in the low qword, bit n + 1 in the high one) in every lane:
// vptestmq against it gives the lanes' per-half masks of bits n / n + 1 of a case word.
#define GC_TH_PAIR(n) \
  _mm512_set_epi64(2ll << (n), 1ll << (n), 2ll << (n), 1ll << (n), 2ll << (n), 1ll << (n), \
                   2ll << (n), 1ll << (n))

// acc ^ the four symbol blocks (A, swap A, B, swap B) under the masks of bits 8 p + 2 s + e.
template <int P>
GC_VAES_TARGET inline __m512i zcombine_k(__m512i acc, __m512i word, __m512i a, __m512i sa,
                                         __m512i b, __m512i sb) {
  acc = _mm512_mask_xor_epi64(acc, _mm512_test_epi64_mask(word, GC_TH_PAIR(8 * P + 0)), acc, a);
  acc = _mm512_mask_xor_epi64(acc, _mm512_test_epi64_mask(word, GC_TH_PAIR(8 * P + 2)), acc, sa);
  acc = _mm512_mask_xor_epi64(acc, _mm512_test_epi64_mask(word, GC_TH_PAIR(8 * P + 4)), acc, b);
  return _mm512_mask_xor_epi64(acc, _mm512_test_epi64_mask(word, GC_TH_PAIR(8 * P + 6)), acc, sb);
}

// 16 instances (two hash groups): registers v = 0..3 hold instances 4 v .. 4 v + 3. coins:
// bits 2 j, 2 j + 1 are instance j's two coins. zbits[h]: the control bits of group h packed
// as in the table (bit 5 k + t = z_t of instance 8 h + k), all 8 instances.
template <int Grp>
GC_VAES_TARGET inline void garble_group_vaes(const block* a0, const block* b0, block* c0,
                                             uint64_t* rows, uint64_t* zbits, uint32_t coins,
                                             __m512i d, const ThreeHalvesDelta& dterms,
                                             const __m512i* rk1, const __m512i* rk2) {
  const VaesGarbleTables& tables = vaes_garble_tables();
  const __m512i words_lo = _mm512_loadu_si512((const void*)tables.word);
  const __m512i words_hi = _mm512_loadu_si512((const void*)(tables.word + 8));
  const __m512i one = _mm512_set1_epi64(1), two = _mm512_set1_epi64(2);
  const __m512i coin_word = _mm512_set1_epi64((long long)((uint64_t)coins << 2));
  // Hash inputs, per register u: A0, A1, B0, B1, X0, X1 (colour-0 and colour-1 labels); the
  // colour-0 labels, the case q and its word wait (in memory) while the AES runs.
  __m512i h[12], abars[2], bbars[2], qs[2], words[2];
  for (int u = 0; u < 2; ++u) {
    const int v = 2 * Grp + u;
    const __m512i a = _mm512_loadu_si512((const void*)(a0 + 4 * v));
    const __m512i b = _mm512_loadu_si512((const void*)(b0 + 4 * v));
    const __m512i pa = zlsb_mask(a), pb = zlsb_mask(b);
    const __m512i abar = _mm512_ternarylogic_epi64(a, pa, d, 0x78);  // a ^ (m & d)
    const __m512i bbar = _mm512_ternarylogic_epi64(b, pb, d, 0x78);
    // Case q = pa | pb << 1 | coins << 2 in both qwords of each lane.
    const __m512i cshift = _mm512_set_epi64(8 * v + 6, 8 * v + 6, 8 * v + 4, 8 * v + 4,
                                            8 * v + 2, 8 * v + 2, 8 * v, 8 * v);
    const __m512i cq = _mm512_and_si512(zsrlv(coin_word, cshift), _mm512_set1_epi64(12));
    qs[u] = _mm512_or_si512(
        _mm512_ternarylogic_epi64(_mm512_and_si512(pa, one), pb, two, 0xF8), cq);  // A | B & C
    words[u] = _mm512_permutex2var_epi64(words_lo, qs[u], words_hi);
    abars[u] = abar;
    bbars[u] = bbar;
    const __m512i x = _mm512_xor_si512(abar, bbar);
    h[6 * u + 0] = abar;
    h[6 * u + 1] = _mm512_xor_si512(abar, d);
    h[6 * u + 2] = bbar;
    h[6 * u + 3] = _mm512_xor_si512(bbar, d);
    h[6 * u + 4] = x;
    h[6 * u + 5] = _mm512_xor_si512(x, d);
  }
  zaes_group<Grp>(rk1, rk2, h);
  const __m512i zbase = _mm512_set1_epi64((long long)dterms.vz);
  __m512i p1[2], p2[2], zv[2];
  for (int u = 0; u < 2; ++u) {
    const int v = 2 * Grp + u;
    const __m512i a = abars[u], b = bbars[u], q = qs[u], word = words[u];
    const __m512i sa = zswap_halves(a), sb = zswap_halves(b);
    const __m512i* e = h + 6 * u;  // AES of A0, A1, B0, B1, X0, X1
    const __m512i e0 = _mm512_xor_si512(e[0], e[4]);  // t0 = hA0 ^ hX0 = e0 ^ Bbar
    const __m512i e1 = _mm512_xor_si512(e[2], e[4]);  // t1 = hB0 ^ hX0 = e1 ^ Abar
    const __m512i e2 = _mm512_xor_si512(e[0], e[1]);  // t2 = hA0 ^ hA1 = e2 ^ Delta
    const __m512i e3 = _mm512_xor_si512(e[2], e[3]);  // t3 = hB0 ^ hB1 = e3 ^ Delta
    const __m512i e4 = _mm512_xor_si512(e[4], e[5]);  // t4 = hX0 ^ hX1 = e4 ^ Delta
    __m512i dt[3];
    for (int p = 0; p < 3; ++p) {
      // The case's Delta term: its low qword from vlo[p], its high one from vhi[p].
      const __m512i lo = _mm512_permutex2var_epi64(
          _mm512_loadu_si512((const void*)(dterms.vlo + 16 * p)), q,
          _mm512_loadu_si512((const void*)(dterms.vlo + 16 * p + 8)));
      const __m512i hi = _mm512_permutex2var_epi64(
          _mm512_loadu_si512((const void*)(dterms.vhi + 16 * p)), q,
          _mm512_loadu_si512((const void*)(dterms.vhi + 16 * p + 8)));
      dt[p] = _mm512_mask_blend_epi64(0xAA, lo, hi);
    }
    const __m512i out0 = zcombine_k<0>(
        _mm512_xor_si512(dt[0], zunpacklo(e0, e1)), word, a, sa, b, sb);
    p1[u] = zcombine_k<1>(_mm512_xor_si512(dt[1], zunpacklo(e2, e3)), word, a, sa,
                          b, sb);
    p2[u] = zcombine_k<2>(_mm512_xor_si512(dt[2], e4), word, a, sa, b, sb);
    _mm512_storeu_si512((void*)(c0 + 4 * v), out0);
    // Control bits (in the high qword of each lane): the case's coin part, the Delta_R part,
    // and bit 64 of t0 .. t4. zz ^ (x & bit) is ternary-logic function 0x78.
    __m512i zz = _mm512_ternarylogic_epi64(zsrli(word, 24), _mm512_set1_epi64(31),
                                           zbase, 0x6A);  // (A & B) ^ C
    zz = _mm512_ternarylogic_epi64(zz, _mm512_xor_si512(e0, b), one, 0x78);
    zz = _mm512_ternarylogic_epi64(zz, zslli(_mm512_xor_si512(e1, a), 1), two, 0x78);
    zz = _mm512_ternarylogic_epi64(zz, zslli(e2, 2), _mm512_set1_epi64(4), 0x78);
    zz = _mm512_ternarylogic_epi64(zz, zslli(e3, 3), _mm512_set1_epi64(8), 0x78);
    zv[u] = _mm512_ternarylogic_epi64(zz, zslli(e4, 4), _mm512_set1_epi64(16), 0x78);
  }
  const __m512i even = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
  _mm512_storeu_si512((void*)rows, _mm512_permutex2var_epi64(p1[0], even, p1[1]));
  _mm512_storeu_si512((void*)(rows + kGroup), _mm512_permutex2var_epi64(p1[0], odd, p1[1]));
  _mm512_storeu_si512((void*)(rows + 2 * kGroup), _mm512_permutex2var_epi64(p2[0], even, p2[1]));
  const __m512i zk = _mm512_permutex2var_epi64(zv[0], odd, zv[1]);
  *zbits = zor_qwords(
      zsllv(zk, _mm512_set_epi64(35, 30, 25, 20, 15, 10, 5, 0)));
}

// 16 instances (two hash groups): registers v = 0..3 hold instances 4 v .. 4 v + 3, group
// Grp the registers 2 Grp, 2 Grp + 1. coins: bits 2 j, 2 j + 1 are instance j's two coins.
// zbits[h]: the control bits of group h packed as in the table (bit 5 k + t = z_t of instance
// 8 h + k), all 8 instances.
GC_VAES_TARGET void garble_span16_vaes(const block* a0, const block* b0, block* c0, uint64_t* g,
                                       uint64_t* zbits, uint32_t coins,
                                       const ThreeHalvesDelta& dterms, block salt, uint64_t tweak,
                                       uint64_t group) {
  __m512i rk1[11], rk2[11];
  zhash_keys(salt, tweak, group, rk1, rk2);
  const __m512i d = _mm512_maskz_broadcast_i32x4(0xffff, dterms.delta);
  garble_group_vaes<0>(a0, b0, c0, g, zbits, coins, d, dterms, rk1, rk2);
  garble_group_vaes<1>(a0, b0, c0, g + 3 * kGroup, zbits + 1, coins, d, dterms, rk1, rk2);
}

GC_VAES_TARGET void eval_span16_vaes(const block* a_in, const block* b_in, block* c,
                                     const uint64_t* g, const uint64_t* zbits, block salt,
                                     uint64_t tweak, uint64_t group) {
  const VaesEvalTables& tables = vaes_eval_tables();
  __m512i rk1[11], rk2[11];
  zhash_keys(salt, tweak, group, rk1, rk2);
  __m512i h[12];  // 3 v + w: AES of A, B, A ^ B
  for (int v = 0; v < 4; ++v) {
    const __m512i a = _mm512_loadu_si512((const void*)(a_in + 4 * v));
    const __m512i b = _mm512_loadu_si512((const void*)(b_in + 4 * v));
    h[3 * v] = a;
    h[3 * v + 1] = b;
    h[3 * v + 2] = _mm512_xor_si512(a, b);
  }
  zaes<1>(rk1, rk2, h);
  const __m512i words_lo = _mm512_loadu_si512((const void*)tables.word);
  const __m512i words_hi = _mm512_loadu_si512((const void*)(tables.word + 8));
  const __m512i one = _mm512_set1_epi64(1), two = _mm512_set1_epi64(2);
  for (int v = 0; v < 4; ++v) {
    const int grp = v / 2, k0 = 4 * (v % 2);
    // Inputs again (loaded before c + 4 v is stored, so c may alias a_in or b_in).
    const __m512i a = _mm512_loadu_si512((const void*)(a_in + 4 * v));
    const __m512i b = _mm512_loadu_si512((const void*)(b_in + 4 * v));
    const __m512i mi = zlsb_mask(a), mj = zlsb_mask(b);  // all-ones where i (j) is 1
    const __m512i u1 = _mm512_xor_si512(h[3 * v], h[3 * v + 2]);      // hA ^ hX = u1 ^ B
    const __m512i u2 = _mm512_xor_si512(h[3 * v + 1], h[3 * v + 2]);  // hB ^ hX = u2 ^ A
    // z of the lane's instance (both qwords): bits 5 k .. 5 k + 4 of the group's word.
    const __m512i zz = _mm512_and_si512(
        zsrlv(_mm512_set1_epi64((long long)zbits[grp]),
                          _mm512_set_epi64(5 * (k0 + 3), 5 * (k0 + 3), 5 * (k0 + 2),
                                           5 * (k0 + 2), 5 * (k0 + 1), 5 * (k0 + 1), 5 * k0,
                                           5 * k0)),
        _mm512_set1_epi64(31));
    // r1 (bit 0) and r2 (bit 1), valid in the high qword (the hash bits are bit 64):
    // r1 = z0 ^ i z2 ^ (i ^ j) z4 ^ bit64(hA ^ hX), r2 = z1 ^ j z3 ^ (i ^ j) z4 ^ bit64(hB ^ hX).
    // bit 0: i, bit 1: j (C ? A : B with C = 1; the bits above are not used).
    const __m512i ij2 = _mm512_ternarylogic_epi64(mi, mj, one, 0xE4);
    __m512i r = _mm512_ternarylogic_epi64(zz, zsrli(zz, 2), ij2, 0x78);
    const __m512i t = _mm512_ternarylogic_epi64(mi, mj, zsrli(zz, 4), 0x28);  // (A^B)&C
    r = _mm512_ternarylogic_epi64(r, t, zslli(t, 1), 0x96);  // A ^ B ^ C
    r = _mm512_ternarylogic_epi64(r, _mm512_xor_si512(u1, b), one, 0x78);
    r = _mm512_ternarylogic_epi64(r, zslli(_mm512_xor_si512(u2, a), 1), two, 0x78);
    // Table index 4 (2 i + j) + r1 + 2 r2, from the high qword into both.
    const __m512i idx = _mm512_ternarylogic_epi64(
        _mm512_and_si512(mi, _mm512_set1_epi64(8)), _mm512_and_si512(mj, _mm512_set1_epi64(4)),
        _mm512_and_si512(zhigh_qword(r), _mm512_set1_epi64(3)), 0xFE);  // A | B | C
    const __m512i word = _mm512_permutex2var_epi64(words_lo, idx, words_hi);
    // [G0 | G1] and [G2 | G2] of instances 4 v .. 4 v + 3.
    const uint64_t* rows = g + 3 * kGroup * grp;
    const __m512i g0 = _mm512_loadu_si512((const void*)rows);
    const __m512i g1 = _mm512_loadu_si512((const void*)(rows + kGroup));
    const __m512i pick01 = _mm512_set_epi64(8 + k0 + 3, k0 + 3, 8 + k0 + 2, k0 + 2, 8 + k0 + 1,
                                            k0 + 1, 8 + k0, k0);
    const __m512i pick22 = _mm512_set_epi64(k0 + 3, k0 + 3, k0 + 2, k0 + 2, k0 + 1, k0 + 1, k0, k0);
    const __m512i g01 = _mm512_permutex2var_epi64(g0, pick01, g1);
    const __m512i g22 =
        zpermutexvar(pick22, _mm512_loadu_si512((const void*)(rows + 2 * kGroup)));
    // G0 where i (low half), G1 where j (high half), G2 where i ^ j.
    __m512i out = zunpacklo(u1, u2);
    out = _mm512_ternarylogic_epi64(out, _mm512_mask_blend_epi64(0xAA, mi, mj), g01, 0x78);
    out = _mm512_ternarylogic_epi64(out, _mm512_xor_si512(mi, mj), g22, 0x78);
    out = zcombine_k<0>(out, word, a, zswap_halves(a), b, zswap_halves(b));
    _mm512_storeu_si512((void*)(c + 4 * v), out);
  }
}
#endif

}  // namespace

namespace {


}  // namespace

ThreeHalvesDelta::ThreeHalvesDelta(block d) : delta(d) {
  const uint64_t dl = low64(delta), dr = high64(delta);
  auto part = [&](unsigned coef) { return ((coef >> 4 & 1) ? dl : 0) ^ ((coef >> 5 & 1) ? dr : 0); };
  for (unsigned q = 0; q < 16; ++q) {
    const ThCase& cs = kThCases[q];
    for (unsigned p = 0; p < 3; ++p) {
      out[q][p] = make_block(p < 2 ? part(cs.coef[2 * p + 1]) : 0, part(cs.coef[2 * p]));
      lo[16 * p + q] = low64(out[q][p]);
      hi[16 * p + q] = high64(out[q][p]);
      vlo[16 * p + q] = lo[16 * p + q] ^ (p > 0 ? dl : 0);
      vhi[16 * p + q] = hi[16 * p + q] ^ (p == 1 ? dl : 0);
    }
  }
  vz = (dr & 1) ? 0x1C : 0;
}

void garble_and_threehalves(const block* a0, const block* b0, block* c0, uint8_t* table, size_t n,
                            uint64_t first_instance, const ThreeHalvesDelta& dterms, block salt,
                            uint64_t tweak, const uint8_t* coins) {
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
    // The span's coins: 2 bits per instance, i a multiple of 16 so they start at byte i / 4.
    uint32_t coin_bits = 0;
    std::memcpy(&coin_bits, coins + i / 4, (2 * m + 7) / 8);
    if (m < kSpan) coin_bits &= (1u << (2 * m)) - 1;
    uint64_t zbits[2];
#if GC_X86
    if (vaes) {
      garble_span16_vaes(a, b, c, g, zbits, coin_bits, dterms, salt, tweak, group);
    } else
#endif
    {
      uint8_t coin[kSpan], z[kSpan];
      for (size_t j = 0; j < kSpan; ++j) coin[j] = (coin_bits >> (2 * j)) & 3;
      garble_span16(a, b, c, g, z, coin, dterms, salt, tweak, group);
      for (size_t h = 0; h < 2; ++h) {
        zbits[h] = 0;
        for (size_t j = 0; j < kGroup; ++j) zbits[h] |= (uint64_t)z[kGroup * h + j] << (5 * j);
      }
    }
    (void)vaes;
    if (!full) std::memcpy(c0 + i, pc, m * sizeof(block));
    for (size_t h = 0; h * kGroup < m; ++h) {
      const size_t start = i + h * kGroup, rows = std::min(kGroup, m - h * kGroup);
      if (!full) {
        uint8_t* dst = table + 24 * start;
        for (size_t t = 0; t < 3; ++t)
          std::memcpy(dst + 8 * rows * t, g + 3 * kGroup * h + kGroup * t, 8 * rows);
      }
      // 5 bits per instance: a full group is 5 whole bytes; a short one's last byte is padded
      // with zeros.
      uint64_t bits = zbits[h];
      if (rows < kGroup) bits &= ((uint64_t)1 << (5 * rows)) - 1;
      uint8_t packed[8];
      for (size_t t = 0; t < 8; ++t) packed[t] = (uint8_t)(bits >> (8 * t));
      std::memcpy(control + 5 * (start / kGroup), packed, (5 * rows + 7) / 8);
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
    uint64_t zbits[2] = {0, 0};
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
      // The group's control bits, 5 per instance (LSB-first bytes).
      uint8_t packed[8] = {};
      std::memcpy(packed, control + 5 * (start / kGroup), (5 * rows + 7) / 8);
      for (size_t t = 0; t < 8; ++t) zbits[h] |= (uint64_t)packed[t] << (8 * t);
    }
    const block* ai = full ? a + i : pa;
    const block* bi = full ? b + i : pb;
    block* ci = full ? c + i : pc;
    const uint64_t* g = full ? reinterpret_cast<const uint64_t*>(table + 24 * i) : rows_copy;
#if GC_X86
    if (vaes) {
      eval_span16_vaes(ai, bi, ci, g, zbits, salt, tweak, group);
    } else
#endif
    {
      uint8_t z[kSpan];
      for (size_t j = 0; j < kSpan; ++j) z[j] = (uint8_t)((zbits[j / kGroup] >> (5 * (j % kGroup))) & 31);
      eval_span16(ai, bi, ci, g, z, salt, tweak, group);
    }
    (void)vaes;
    if (!full) std::memcpy(c + i, pc, m * sizeof(block));
  }
}

}  // namespace gc
