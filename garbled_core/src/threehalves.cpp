#include "garbled_core/threehalves.h"

#include <algorithm>
#include <cstring>

#include "garbled_core/aes.h"

namespace gc {

namespace {

#include "threehalves_tables.inc"

constexpr size_t kGroup = 8;

// Which hash: of A, of B, of A ^ B. The key names the group and the hash;
// half-gates' keys use (group << 1 | half), and a session runs one scheme.
inline AesKey hash_key(block salt, uint64_t tweak, uint64_t group, uint64_t which) {
  return aes_key(xor_block(salt, make_block(tweak, (group << 2) | which)));
}

inline uint64_t select64(uint64_t bit, uint64_t v) { return (0 - bit) & v; }

// Coefficient row over (A_L, A_R, B_L, B_R) (and Delta_L, Delta_R for the
// garbler's six symbols) applied to the halves.
inline uint64_t combine4(unsigned coef, const uint64_t* sym) {
  return select64(coef & 1, sym[0]) ^ select64(coef >> 1 & 1, sym[1]) ^
         select64(coef >> 2 & 1, sym[2]) ^ select64(coef >> 3 & 1, sym[3]);
}
inline uint64_t combine6(unsigned coef, const uint64_t* sym) {
  return combine4(coef, sym) ^ select64(coef >> 4 & 1, sym[4]) ^ select64(coef >> 5 & 1, sym[5]);
}

inline uint64_t hash_bit(block h) { return high64(h) & 1; }

// One group of 8 instances (a short group is padded by the caller).
void garble_group(const block* a0, const block* b0, block* c0, uint64_t* g, uint8_t* z,
                  const uint8_t* coins, block delta, block salt, uint64_t tweak, uint64_t group) {
  const AesKey ka = hash_key(salt, tweak, group, 0);
  const AesKey kb = hash_key(salt, tweak, group, 1);
  const AesKey kx = hash_key(salt, tweak, group, 2);
  block abar[kGroup], bbar[kGroup], xa[2 * kGroup], xb[2 * kGroup], xx[2 * kGroup];
  unsigned cases[kGroup];
  for (size_t j = 0; j < kGroup; ++j) {
    const bool pa = lsb(a0[j]), pb = lsb(b0[j]);
    // The colour-0 labels: the ones the evaluator holds when i (or j) is 0.
    abar[j] = xor_block(a0[j], and_block(select_mask(pa), delta));
    bbar[j] = xor_block(b0[j], and_block(select_mask(pb), delta));
    xa[j] = abar[j];
    xa[kGroup + j] = xor_block(abar[j], delta);
    xb[j] = bbar[j];
    xb[kGroup + j] = xor_block(bbar[j], delta);
    xx[j] = xor_block(abar[j], bbar[j]);
    xx[kGroup + j] = xor_block(xx[j], delta);
    cases[j] = (unsigned)pa | (unsigned)pb << 1 | (unsigned)coins[j] << 2;
  }
  block ha[2 * kGroup], hb[2 * kGroup], hx[2 * kGroup];
  std::memcpy(ha, xa, sizeof(xa));
  std::memcpy(hb, xb, sizeof(xb));
  std::memcpy(hx, xx, sizeof(xx));
  aes_encrypt_blocks<8>(ka, ha);
  aes_encrypt_blocks<8>(ka, ha + kGroup);
  aes_encrypt_blocks<8>(kb, hb);
  aes_encrypt_blocks<8>(kb, hb + kGroup);
  aes_encrypt_blocks<8>(kx, hx);
  aes_encrypt_blocks<8>(kx, hx + kGroup);
  const uint64_t dl = low64(delta), dr = high64(delta);
  for (size_t j = 0; j < kGroup; ++j) {
    const block a_0 = xor_block(ha[j], xa[j]), a_1 = xor_block(ha[kGroup + j], xa[kGroup + j]);
    const block b_0 = xor_block(hb[j], xb[j]), b_1 = xor_block(hb[kGroup + j], xb[kGroup + j]);
    const block x_0 = xor_block(hx[j], xx[j]), x_1 = xor_block(hx[kGroup + j], xx[kGroup + j]);
    const ThCase& cs = kThCases[cases[j]];
    const uint64_t sym[6] = {low64(abar[j]), high64(abar[j]), low64(bbar[j]), high64(bbar[j]),
                             dl, dr};
    const uint64_t cl = combine6(cs.coef[0], sym) ^ low64(a_0) ^ low64(x_0);
    const uint64_t cr = combine6(cs.coef[1], sym) ^ low64(b_0) ^ low64(x_0);
    g[j] = combine6(cs.coef[2], sym) ^ low64(a_0) ^ low64(a_1);
    g[kGroup + j] = combine6(cs.coef[3], sym) ^ low64(b_0) ^ low64(b_1);
    g[2 * kGroup + j] = combine6(cs.coef[4], sym) ^ low64(x_0) ^ low64(x_1);
    const uint64_t ca0 = hash_bit(a_0), ca1 = hash_bit(a_1), cb0 = hash_bit(b_0),
                   cb1 = hash_bit(b_1), cx0 = hash_bit(x_0), cx1 = hash_bit(x_1);
    z[j] = (uint8_t)(cs.z ^ (ca0 ^ cx0) ^ (cb0 ^ cx0) << 1 ^ (ca0 ^ ca1) << 2 ^
                     (cb0 ^ cb1) << 3 ^ (cx0 ^ cx1) << 4);
    c0[j] = make_block(cr, cl);
  }
}

void eval_group(const block* a_in, const block* b_in, block* c, const uint64_t* g,
                const uint8_t* z, block salt, uint64_t tweak, uint64_t group) {
  const AesKey ka = hash_key(salt, tweak, group, 0);
  const AesKey kb = hash_key(salt, tweak, group, 1);
  const AesKey kx = hash_key(salt, tweak, group, 2);
  block a[kGroup], b[kGroup], ha[kGroup], hb[kGroup], hx[kGroup];
  for (size_t j = 0; j < kGroup; ++j) {
    a[j] = ha[j] = a_in[j];
    b[j] = hb[j] = b_in[j];
    hx[j] = xor_block(a[j], b[j]);
  }
  aes_encrypt_blocks<8>(ka, ha);
  aes_encrypt_blocks<8>(kb, hb);
  aes_encrypt_blocks<8>(kx, hx);
  for (size_t j = 0; j < kGroup; ++j) {
    const block h_a = xor_block(ha[j], a[j]), h_b = xor_block(hb[j], b[j]);
    const block h_x = xor_block(hx[j], xor_block(a[j], b[j]));
    const uint64_t i = lsb(a[j]), k = lsb(b[j]), ik = i ^ k, zj = z[j];
    const uint64_t r1 = (zj ^ (i & zj >> 2) ^ (ik & zj >> 4) ^ hash_bit(h_a) ^ hash_bit(h_x)) & 1;
    const uint64_t r2 =
        ((zj >> 1) ^ (k & zj >> 3) ^ (ik & zj >> 4) ^ hash_bit(h_b) ^ hash_bit(h_x)) & 1;
    const unsigned r = kThRp[2 * i + k] ^ ((0u - (unsigned)r1) & kThS1) ^
                       ((0u - (unsigned)r2) & kThS2);
    const uint64_t lab[4] = {low64(a[j]), high64(a[j]), low64(b[j]), high64(b[j])};
    const uint64_t g2 = select64(ik, g[2 * kGroup + j]);
    const uint64_t cl =
        select64(i, g[j]) ^ g2 ^ low64(h_a) ^ low64(h_x) ^ combine4(r & 15, lab);
    const uint64_t cr =
        select64(k, g[kGroup + j]) ^ g2 ^ low64(h_b) ^ low64(h_x) ^ combine4(r >> 4, lab);
    c[j] = make_block(cr, cl);
  }
}

}  // namespace

void garble_and_threehalves(const block* a0, const block* b0, block* c0, uint8_t* table, size_t n,
                            uint64_t first_instance, block delta, block salt, uint64_t tweak,
                            const uint8_t* coins) {
  uint64_t group = first_instance / kGroup;
  uint8_t* halves = table;
  uint8_t* control = table + 24 * n;
  for (size_t i = 0; i < n; i += kGroup, ++group) {
    const size_t m = std::min(kGroup, n - i);
    block pa[kGroup] = {}, pb[kGroup] = {}, pc[kGroup];
    std::memcpy(pa, a0 + i, m * sizeof(block));
    std::memcpy(pb, b0 + i, m * sizeof(block));
    uint8_t coin[kGroup] = {}, z[kGroup];
    for (size_t j = 0; j < m; ++j) coin[j] = (coins[(i + j) >> 2] >> (2 * ((i + j) & 3))) & 3;
    uint64_t g[3 * kGroup];
    garble_group(pa, pb, pc, g, z, coin, delta, salt, tweak, group);
    std::memcpy(c0 + i, pc, m * sizeof(block));
    uint8_t* rows = halves + 24 * i;
    for (size_t t = 0; t < 3; ++t) std::memcpy(rows + 8 * m * t, g + kGroup * t, 8 * m);
    // A full group's 40 control bits are 5 whole bytes, so group i / 8 starts at byte 5 i / 8.
    uint64_t bits = 0;
    for (size_t j = 0; j < m; ++j) bits |= (uint64_t)z[j] << (5 * j);
    uint8_t packed[8];
    for (size_t t = 0; t < 8; ++t) packed[t] = (uint8_t)(bits >> (8 * t));
    std::memcpy(control + 5 * (i / kGroup), packed, (5 * m + 7) / 8);
  }
}

void eval_and_threehalves(const block* a, const block* b, block* c, const uint8_t* table, size_t n,
                          uint64_t first_instance, block salt, uint64_t tweak) {
  uint64_t group = first_instance / kGroup;
  const uint8_t* halves = table;
  const uint8_t* control = table + 24 * n;
  for (size_t i = 0; i < n; i += kGroup, ++group) {
    const size_t m = std::min(kGroup, n - i);
    block pa[kGroup] = {}, pb[kGroup] = {}, pc[kGroup];
    std::memcpy(pa, a + i, m * sizeof(block));
    std::memcpy(pb, b + i, m * sizeof(block));
    uint64_t g[3 * kGroup] = {};
    const uint8_t* rows = halves + 24 * i;
    for (size_t t = 0; t < 3; ++t) std::memcpy(g + kGroup * t, rows + 8 * m * t, 8 * m);
    uint8_t packed[8] = {};
    std::memcpy(packed, control + 5 * (i / kGroup), (5 * m + 7) / 8);
    uint64_t bits = 0;
    for (size_t t = 0; t < 8; ++t) bits |= (uint64_t)packed[t] << (8 * t);
    uint8_t z[kGroup];
    for (size_t j = 0; j < kGroup; ++j) z[j] = (uint8_t)((bits >> (5 * j)) & 31);
    eval_group(pa, pb, pc, g, z, salt, tweak, group);
    std::memcpy(c + i, pc, m * sizeof(block));
  }
}

}  // namespace gc
