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
  explicit DeltaTerms(block delta) {
    const uint64_t dl = low64(delta), dr = high64(delta);
    auto part = [&](unsigned coef) {
      return ((coef >> 4 & 1) ? dl : 0) ^ ((coef >> 5 & 1) ? dr : 0);
    };
    for (unsigned q = 0; q < 16; ++q) {
      const ThCase& cs = kThCases[q];
      for (unsigned p = 0; p < 3; ++p)
        out[q][p] = make_block(p < 2 ? part(cs.coef[2 * p + 1]) : 0, part(cs.coef[2 * p]));
    }
  }
};

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

#if GC_X86
// The six keys of a span (2 groups x 3 hashes) are expanded in two registers; each AES
// instruction then works on 4 blocks.
template <int Per>
GC_VAES_TARGET void hash_span_vaes(block salt, uint64_t tweak, uint64_t group, block* xa,
                                   block* xb, block* xx) {
  const __m512i s = _mm512_maskz_broadcast_i32x4(0xffff, salt);
  const long long t = (long long)tweak, g0 = (long long)(group << 2),
                  g1 = (long long)((group + 1) << 2);
  __m512i rk1[11], rk2[11];
  // rk1 lanes: (g0, A), (g0, B), (g1, A), (g1, B); rk2 lanes: (g0, X), (g1, X), again.
  zexpand4(_mm512_xor_si512(s, _mm512_set_epi64(t, g1 | 1, t, g1, t, g0 | 1, t, g0)), rk1);
  zexpand4(_mm512_xor_si512(s, _mm512_set_epi64(t, g1 | 2, t, g0 | 2, t, g1 | 2, t, g0 | 2)),
           rk2);
  constexpr int Z = 2 * Per;  // registers per array and group
  // Registers in key order: A g0, A g1, B g0, B g1, X g0, X g1.
  block* arrays[3] = {xa, xb, xx};
  __m512i in[6 * Z], x[6 * Z];
  for (int q = 0; q < 6; ++q)
    for (int z = 0; z < Z; ++z) {
      const block* src = arrays[q / 2] + (q % 2) * kGroup * Per + 4 * z;
      in[q * Z + z] = x[q * Z + z] = _mm512_loadu_si512((const void*)src);
    }
  for (int r = 0; r <= 10; ++r) {
    const __m512i k[6] = {zlane<0>(rk1[r]), zlane<2>(rk1[r]), zlane<1>(rk1[r]),
                          zlane<3>(rk1[r]), zlane<0>(rk2[r]), zlane<1>(rk2[r])};
    for (int q = 0; q < 6; ++q)
      for (int z = 0; z < Z; ++z) {
        __m512i& v = x[q * Z + z];
        v = r == 0    ? _mm512_xor_si512(v, k[q])
            : r < 10  ? _mm512_aesenc_epi128(v, k[q])
                      : _mm512_aesenclast_epi128(v, k[q]);
      }
  }
  for (int q = 0; q < 6; ++q)
    for (int z = 0; z < Z; ++z) {
      block* dst = arrays[q / 2] + (q % 2) * kGroup * Per + 4 * z;
      _mm512_storeu_si512((void*)dst, _mm512_xor_si512(x[q * Z + z], in[q * Z + z]));
    }
}
#endif

template <int Per>
void hash_span(block salt, uint64_t tweak, uint64_t group, block* xa, block* xb, block* xx) {
#if GC_X86
  if (std::strcmp(and_kernels().name, "vaes") == 0) {
    hash_span_vaes<Per>(salt, tweak, group, xa, xb, xx);
    return;
  }
#endif
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

}  // namespace

void garble_and_threehalves(const block* a0, const block* b0, block* c0, uint8_t* table, size_t n,
                            uint64_t first_instance, block delta, block salt, uint64_t tweak,
                            const uint8_t* coins) {
  const DeltaTerms dterms(delta);
  uint64_t group = first_instance / kGroup;
  uint8_t* control = table + 24 * n;
  for (size_t i = 0; i < n; i += kSpan, group += 2) {
    const size_t m = std::min(kSpan, n - i);
    block pa[kSpan] = {}, pb[kSpan] = {}, pc[kSpan];
    std::memcpy(pa, a0 + i, m * sizeof(block));
    std::memcpy(pb, b0 + i, m * sizeof(block));
    uint8_t coin[kSpan] = {}, z[kSpan];
    for (size_t j = 0; j < m; ++j) coin[j] = (coins[(i + j) >> 2] >> (2 * ((i + j) & 3))) & 3;
    uint64_t g[6 * kGroup];
    garble_span16(pa, pb, pc, g, z, coin, delta, dterms, salt, tweak, group);
    std::memcpy(c0 + i, pc, m * sizeof(block));
    for (size_t h = 0; h * kGroup < m; ++h) {
      const size_t start = i + h * kGroup, rows = std::min(kGroup, m - h * kGroup);
      uint8_t* dst = table + 24 * start;
      for (size_t t = 0; t < 3; ++t)
        std::memcpy(dst + 8 * rows * t, g + 3 * kGroup * h + kGroup * t, 8 * rows);
      // A full group's 40 control bits are 5 whole bytes: group start / 8 at byte 5 start / 8.
      uint64_t bits = 0;
      for (size_t j = 0; j < rows; ++j) bits |= (uint64_t)z[h * kGroup + j] << (5 * j);
      uint8_t packed[8];
      for (size_t t = 0; t < 8; ++t) packed[t] = (uint8_t)(bits >> (8 * t));
      std::memcpy(control + 5 * (start / kGroup), packed, (5 * rows + 7) / 8);
    }
  }
}

void eval_and_threehalves(const block* a, const block* b, block* c, const uint8_t* table, size_t n,
                          uint64_t first_instance, block salt, uint64_t tweak) {
  uint64_t group = first_instance / kGroup;
  const uint8_t* control = table + 24 * n;
  for (size_t i = 0; i < n; i += kSpan, group += 2) {
    const size_t m = std::min(kSpan, n - i);
    block pa[kSpan] = {}, pb[kSpan] = {}, pc[kSpan];
    std::memcpy(pa, a + i, m * sizeof(block));
    std::memcpy(pb, b + i, m * sizeof(block));
    uint64_t g[6 * kGroup] = {};
    uint8_t z[kSpan] = {};
    for (size_t h = 0; h * kGroup < m; ++h) {
      const size_t start = i + h * kGroup, rows = std::min(kGroup, m - h * kGroup);
      const uint8_t* src = table + 24 * start;
      for (size_t t = 0; t < 3; ++t)
        std::memcpy(g + 3 * kGroup * h + kGroup * t, src + 8 * rows * t, 8 * rows);
      uint8_t packed[8] = {};
      std::memcpy(packed, control + 5 * (start / kGroup), (5 * rows + 7) / 8);
      uint64_t bits = 0;
      for (size_t t = 0; t < 8; ++t) bits |= (uint64_t)packed[t] << (8 * t);
      for (size_t j = 0; j < kGroup; ++j) z[h * kGroup + j] = (uint8_t)((bits >> (5 * j)) & 31);
    }
    eval_span16(pa, pb, pc, g, z, salt, tweak, group);
    std::memcpy(c + i, pc, m * sizeof(block));
  }
}

}  // namespace gc
