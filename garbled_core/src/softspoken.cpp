// SoftSpoken OT extension; see softspoken.h for the protocol and its notes.
#include "garbled_core/softspoken.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "garbled_core/base_ot.h"
#include "garbled_core/halfgates.h"  // and_kernels(): the engine-wide AES path switch
#include "garbled_core/iknp.h"       // kBaseOts, transpose128
#include "garbled_core/vaes.h"

namespace gc {

namespace {

// Tiles (128 OTs each) per network message; the expansion runs kSub tiles
// per AES call (8 blocks under one leaf key).
constexpr size_t kTilesPerBatch = 64;
constexpr size_t kSub = 8;

// Domain tags of the GGM PRG's two children.
const block kGgmTag0 = make_block(0x5350474320474753ull, 0);  // "SPGC GGS", child 0
const block kGgmTag1 = make_block(0x5350474320474753ull, 1);

inline bool bit_of(block b, int i) {
  uint8_t bytes[16];
  store_block(bytes, b);
  return (bytes[i >> 3] >> (i & 7)) & 1;
}

// GGM PRG: (AES_s(tag0), AES_s(tag1)), s used as a one-off AES key.
inline void ggm_expand(block s, block* left, block* right) {
  AesKey key = aes_key(s);
  block x[2] = {kGgmTag0, kGgmTag1};
  aes_encrypt_blocks<2>(key, x);
  *left = x[0];
  *right = x[1];
}

// AES-128 of 8 blocks under one key, written out so that the 8 blocks stay in
// registers whatever the optimisation level (GCC -O2 does not unroll
// aes_encrypt_blocks<8>'s loops, which costs k = 8 a factor of 3).
inline void aes8(const AesKey& key, block* io) {
#if GC_X86
  block x0 = io[0], x1 = io[1], x2 = io[2], x3 = io[3], x4 = io[4], x5 = io[5], x6 = io[6], x7 = io[7];
  block k = key.rk[0];
  x0 = _mm_xor_si128(x0, k), x1 = _mm_xor_si128(x1, k), x2 = _mm_xor_si128(x2, k), x3 = _mm_xor_si128(x3, k);
  x4 = _mm_xor_si128(x4, k), x5 = _mm_xor_si128(x5, k), x6 = _mm_xor_si128(x6, k), x7 = _mm_xor_si128(x7, k);
  for (int r = 1; r < 10; ++r) {
    k = key.rk[r];
    x0 = _mm_aesenc_si128(x0, k), x1 = _mm_aesenc_si128(x1, k), x2 = _mm_aesenc_si128(x2, k);
    x3 = _mm_aesenc_si128(x3, k), x4 = _mm_aesenc_si128(x4, k), x5 = _mm_aesenc_si128(x5, k);
    x6 = _mm_aesenc_si128(x6, k), x7 = _mm_aesenc_si128(x7, k);
  }
  k = key.rk[10];
  io[0] = _mm_aesenclast_si128(x0, k), io[1] = _mm_aesenclast_si128(x1, k);
  io[2] = _mm_aesenclast_si128(x2, k), io[3] = _mm_aesenclast_si128(x3, k);
  io[4] = _mm_aesenclast_si128(x4, k), io[5] = _mm_aesenclast_si128(x5, k);
  io[6] = _mm_aesenclast_si128(x6, k), io[7] = _mm_aesenclast_si128(x7, k);
#else
  aes_encrypt_blocks<8>(key, io);
#endif
}

// One leaf's stream for tiles [ctr, ctr + tt) (tt <= kSub) into w[0..tt),
// masked by keep when kMask (the garbler zeroes its unknown leaf, without
// branching on which one it is).
template <bool kMask>
inline void leaf_stream(const AesKey& key, block keep, const block* ctrs, size_t tt, block* w) {
  if (tt == kSub) {
    // Local copies keep the 8 blocks in registers through the rounds.
    static_assert(kSub == 8, "aes8 does 8 blocks");
    block x[kSub];
    for (size_t t = 0; t < kSub; ++t) x[t] = ctrs[t];
    aes8(key, x);
    for (size_t t = 0; t < kSub; ++t) w[t] = kMask ? and_block(x[t], keep) : x[t];
  } else {
    for (size_t t = 0; t < tt; ++t) {
      block x[1] = {ctrs[t]};
      aes_encrypt_blocks<1>(key, x);
      w[t] = kMask ? and_block(x[0], keep) : x[0];
    }
  }
}

// Expands the 2^d leaf streams of one chunk for tiles [ctr, ctr + tt) (tt <=
// kSub) and reduces them: col(i)[0..tt) = XOR over leaves x with bit i set
// (i < d), u[0..tt) = XOR over all leaves. With kMask, keep[x] masks leaf x.
// work holds 2^(d-2) * kSub blocks. Index bit i of a leaf is reduced at level
// i: pairing the entries that differ in it, the odd ones' sum is column i and
// the pair sums form the next level; levels 0 and 1 are done on groups of 4
// leaves as they come out of AES, the rest in work: about 2 * 2^d * kSub XORs.
template <bool kMask>
void expand_reduce(const AesKey* keys, const block* keep, int d, uint64_t ctr, size_t tt, block* work,
                   block* cols, size_t stride, block* u) {
  block ctrs[kSub];
  for (size_t t = 0; t < kSub; ++t) ctrs[t] = make_block(0, ctr + t);
  const block ones = select_mask(true);
  auto keep_of = [&](size_t x) { return kMask ? keep[x] : ones; };
  block a[kSub], b[kSub];
  for (size_t t = 0; t < kSub; ++t) a[t] = b[t] = zero_block();
  if (d == 1) {
    leaf_stream<kMask>(keys[0], keep_of(0), ctrs, tt, a);
    leaf_stream<kMask>(keys[1], keep_of(1), ctrs, tt, b);
    for (size_t t = 0; t < tt; ++t) {
      cols[t] = b[t];
      u[t] = xor_block(a[t], b[t]);
    }
    return;
  }
  const size_t n = size_t(1) << d;
  block acc0[kSub], acc1[kSub], p0[kSub];
  for (size_t t = 0; t < kSub; ++t) acc0[t] = acc1[t] = zero_block();
  for (size_t g = 0; g < n / 4; ++g) {
    const size_t x = 4 * g;
    leaf_stream<kMask>(keys[x], keep_of(x), ctrs, tt, a);
    leaf_stream<kMask>(keys[x + 1], keep_of(x + 1), ctrs, tt, b);
    for (size_t t = 0; t < kSub; ++t) {
      acc0[t] = xor_block(acc0[t], b[t]);
      p0[t] = xor_block(a[t], b[t]);
    }
    leaf_stream<kMask>(keys[x + 2], keep_of(x + 2), ctrs, tt, a);
    leaf_stream<kMask>(keys[x + 3], keep_of(x + 3), ctrs, tt, b);
    block* o = work + g * kSub;
    for (size_t t = 0; t < kSub; ++t) {
      acc0[t] = xor_block(acc0[t], b[t]);
      const block p1 = xor_block(a[t], b[t]);
      acc1[t] = xor_block(acc1[t], p1);
      o[t] = xor_block(p0[t], p1);
    }
  }
  for (size_t t = 0; t < tt; ++t) {
    cols[t] = acc0[t];
    cols[stride + t] = acc1[t];
  }
  size_t len = n / 4;
  for (int i = 2; i < d; ++i) {
    const size_t half = len >> 1;
    block acc[kSub];
    for (size_t t = 0; t < kSub; ++t) acc[t] = zero_block();
    for (size_t y = 0; y < half; ++y) {
      const block* lo = work + 2 * y * kSub;
      const block* hi = lo + kSub;
      block* o = work + y * kSub;
      for (size_t t = 0; t < kSub; ++t) {
        acc[t] = xor_block(acc[t], hi[t]);
        o[t] = xor_block(lo[t], hi[t]);
      }
    }
    block* col = cols + (size_t)i * stride;
    for (size_t t = 0; t < tt; ++t) col[t] = acc[t];
    len = half;
  }
  for (size_t t = 0; t < tt; ++t) u[t] = work[t];
}

// Portable path over a whole batch: tiles [ctr, ctr + tiles) of one chunk,
// kSub at a time; u[0..tiles).
template <bool kMask>
void expand_chunk_aes128(const AesKey* keys, const block* keep, int d, uint64_t ctr, size_t tiles, block* work,
                         block* cols, size_t stride, block* u) {
  for (size_t s = 0; s < tiles; s += kSub)
    expand_reduce<kMask>(keys, keep, d, ctr + s, std::min(kSub, tiles - s), work, cols + s, stride, u + s);
}

#if GC_X86
// VAES path. A zmm holds 4 consecutive tiles of one leaf's stream (the leaf's
// round keys broadcast to the 4 lanes), so the reduction tree of the
// portable path runs unchanged on zmm and the columns are stored 4 tiles at
// a time. A pass is 4 Q tiles (Q zmm per leaf) of 2^G leaves at once, 16 AES
// chains in flight: Q = 4, G = 2 for long runs; for a tail of <= 8 or <= 4
// tiles Q = 2, G = 3 or Q = 1, G = 4 (G <= d), so that short extends do not
// pay for 16 tiles. The first G reduction levels are folded in registers,
// the rest run in work (2^(d-G) * Q zmm). Same outputs as the portable path,
// bit for bit.
constexpr size_t kZSub = 16;  // most tiles per pass

// (The maskz form: GCC 12's plain _mm512_broadcast_i32x4 trips -Wuninitialized.)
GC_VAES_TARGET inline __m512i zbcast(const block& b) { return _mm512_maskz_broadcast_i32x4(0xffff, b); }

// Stores the first n (<= 4 Q) tiles of v[0..Q) to dst.
template <int Q>
GC_VAES_TARGET inline void zstore_tiles(block* dst, const __m512i* v, size_t n) {
  if (n == 4 * Q) {
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) _mm512_storeu_si512((void*)(dst + 4 * q), v[q]);
    return;
  }
  for (size_t q = 0; q < (size_t)Q && 4 * q < n; ++q) {
    const size_t left = std::min<size_t>(4, n - 4 * q);
    _mm512_mask_storeu_epi64((void*)(dst + 4 * q), (__mmask8)((1u << (2 * left)) - 1), v[q]);
  }
}

// Leaves keys[0 .. L) over the pass's Q counter zmm: x[l][q].
template <bool kMask, int L, int Q>
GC_VAES_TARGET inline void zaes_leaves(const AesKey* keys, const block* keep, const __m512i* ctr,
                                       __m512i (*x)[Q]) {
#pragma GCC unroll 16
  for (int l = 0; l < L; ++l) {
    const __m512i k = zbcast(keys[l].rk[0]);
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) x[l][q] = _mm512_xor_si512(ctr[q], k);
  }
#pragma GCC unroll 9
  for (int r = 1; r < 10; ++r) {
#pragma GCC unroll 16
    for (int l = 0; l < L; ++l) {
      const __m512i k = zbcast(keys[l].rk[r]);
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) x[l][q] = _mm512_aesenc_epi128(x[l][q], k);
    }
  }
#pragma GCC unroll 16
  for (int l = 0; l < L; ++l) {
    const __m512i k = zbcast(keys[l].rk[10]);
    const __m512i m = kMask ? zbcast(keep[l]) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) {
      const __m512i y = _mm512_aesenclast_epi128(x[l][q], k);
      x[l][q] = kMask ? _mm512_and_si512(y, m) : y;
    }
  }
}

// One pass of up to 4 Q tiles of a chunk with d >= G; as expand_reduce.
template <bool kMask, int Q, int G>
GC_VAES_TARGET void expand_reduce_vaes(const AesKey* keys, const block* keep, int d, uint64_t ctr, size_t tt,
                                       __m512i* work, block* cols, size_t stride, block* u) {
  constexpr int L = 1 << G;
  __m512i ctrs[Q], acc[G][Q];
#pragma GCC unroll 4
  for (int q = 0; q < Q; ++q) {
    const long long c = (long long)(ctr + 4 * q);
    ctrs[q] = _mm512_set_epi64(0, c + 3, 0, c + 2, 0, c + 1, 0, c);
#pragma GCC unroll 4
    for (int i = 0; i < G; ++i) acc[i][q] = _mm512_setzero_si512();
  }
  const size_t groups = size_t(1) << (d - G);
  for (size_t g = 0; g < groups; ++g) {
    __m512i x[L][Q];
    zaes_leaves<kMask, L, Q>(keys + L * g, kMask ? keep + L * g : nullptr, ctrs, x);
    // Levels 0 .. G-1 of the tree: pair the entries differing in bit i.
#pragma GCC unroll 4
    for (int i = 0; i < G; ++i) {
#pragma GCC unroll 8
      for (int y = 0; y < (L >> (i + 1)); ++y)
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) {
          acc[i][q] = _mm512_xor_si512(acc[i][q], x[2 * y + 1][q]);
          x[y][q] = _mm512_xor_si512(x[2 * y][q], x[2 * y + 1][q]);
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) work[g * Q + q] = x[0][q];
  }
#pragma GCC unroll 4
  for (int i = 0; i < G; ++i) zstore_tiles<Q>(cols + (size_t)i * stride, acc[i], tt);
  size_t len = groups;
  for (int i = G; i < d; ++i) {
    const size_t half = len >> 1;
    __m512i a[Q];
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) a[q] = _mm512_setzero_si512();
    for (size_t y = 0; y < half; ++y) {
      const __m512i* lo = work + 2 * y * Q;
      const __m512i* hi = lo + Q;
      __m512i* o = work + y * Q;
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) {
        a[q] = _mm512_xor_si512(a[q], hi[q]);
        o[q] = _mm512_xor_si512(lo[q], hi[q]);
      }
    }
    zstore_tiles<Q>(cols + (size_t)i * stride, a, tt);
    len = half;
  }
  zstore_tiles<Q>(u, work, tt);
}

template <bool kMask>
GC_VAES_TARGET void expand_chunk_vaes(const AesKey* keys, const block* keep, int d, uint64_t ctr, size_t tiles,
                                      block* work, block* cols, size_t stride, block* u) {
  if (d < 2) {
    expand_chunk_aes128<kMask>(keys, keep, d, ctr, tiles, work, cols, stride, u);
    return;
  }
  __m512i* zw = (__m512i*)work;
  size_t s = 0;
  while (tiles - s > 8) {
    const size_t tt = std::min(kZSub, tiles - s);
    expand_reduce_vaes<kMask, 4, 2>(keys, keep, d, ctr + s, tt, zw, cols + s, stride, u + s);
    s += tt;
  }
  if (s == tiles) return;
  const size_t tt = tiles - s;
  if (tt > 4) {
    if (d >= 3)
      expand_reduce_vaes<kMask, 2, 3>(keys, keep, d, ctr + s, tt, zw, cols + s, stride, u + s);
    else
      expand_reduce_vaes<kMask, 2, 2>(keys, keep, d, ctr + s, tt, zw, cols + s, stride, u + s);
  } else if (d >= 4) {
    expand_reduce_vaes<kMask, 1, 4>(keys, keep, d, ctr + s, tt, zw, cols + s, stride, u + s);
  } else if (d == 3) {
    expand_reduce_vaes<kMask, 1, 3>(keys, keep, d, ctr + s, tt, zw, cols + s, stride, u + s);
  } else {
    expand_reduce_vaes<kMask, 1, 2>(keys, keep, d, ctr + s, tt, zw, cols + s, stride, u + s);
  }
}

// transpose128 (iknp.h) with AVX-512: out[j] bit i = in[i * stride] bit j,
// half a tile (input rows 64 h .. 64 h + 63) at a time. Lane L of zmm x[t]
// holds row 16 L + t, so the 16 x 16 byte transpose of iknp.cpp, run on all
// four lanes at once, leaves in x[k] byte k of the 64 rows, byte p holding
// row 64 h + (p ^ kRowXor). (The maskz forms: GCC 12's plain 32/64-bit
// unpacks trip -Wuninitialized in its own headers; an all-ones mask compiles
// away.)
template <int kRowXor>
GC_VAES_TARGET inline void zbyte_transpose(const block* base, size_t stride, __m512i* x) {
  static const int rev4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
  __m512i y[16];
#pragma GCC unroll 16
  for (int t = 0; t < 16; ++t) {
    const block* r = base + (size_t)(rev4[t] ^ kRowXor) * stride;
    __m512i v = _mm512_castsi128_si512(r[0]);
    v = _mm512_inserti64x2(v, r[16 * stride], 1);
    v = _mm512_inserti64x2(v, r[32 * stride], 2);
    x[t] = _mm512_inserti64x2(v, r[48 * stride], 3);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    y[2 * i] = _mm512_unpacklo_epi8(x[i], x[i + 8]);
    y[2 * i + 1] = _mm512_unpackhi_epi8(x[i], x[i + 8]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = _mm512_unpacklo_epi16(y[i], y[i + 8]);
    x[2 * i + 1] = _mm512_unpackhi_epi16(y[i], y[i + 8]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    y[2 * i] = _mm512_maskz_unpacklo_epi32(0xffff, x[i], x[i + 8]);
    y[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, x[i], x[i + 8]);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = _mm512_maskz_unpacklo_epi64(0xff, y[i], y[i + 8]);
    x[2 * i + 1] = _mm512_maskz_unpackhi_epi64(0xff, y[i], y[i + 8]);
  }
}

// Bits from bytes with VPMOVB2M: 64 bits of an output row per instruction.
GC_VAES_TARGET void transpose128_vaes(const block* in, size_t stride, block* out) {
  uint64_t* o = reinterpret_cast<uint64_t*>(out);
#pragma GCC unroll 1
  for (int h = 0; h < 2; ++h) {
    __m512i x[16];
    zbyte_transpose<0>(in + (size_t)64 * h * stride, stride, x);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) {
      __m512i v = x[k];
#pragma GCC unroll 8
      for (int b = 7; b >= 0; --b) {
        _store_mask64((__mmask64*)(o + 2 * (8 * k + b) + h), _mm512_movepi8_mask(v));
        v = _mm512_add_epi8(v, v);
      }
    }
  }
}

// With GFNI and AVX512-VBMI: each qword of x[k] is an 8 x 8 bit block (rows
// 8c .. 8c+7 of the half, reversed by kRowXor = 7, times columns 8k .. 8k+7);
// GF2P8AFFINEQB with the data as its matrix transposes it (result byte j, bit
// i = bit j of matrix byte 7 - i = row 8c + i), VPERMB gathers byte c of
// every block into output row 8k + j's qword, VPERMT2Q pairs the halves.
#define GC_GFNI_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vbmi,gfni,vaes,aes,sse4.1")))

inline bool cpu_has_gfni_vbmi() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("gfni") && __builtin_cpu_supports("avx512vbmi");
}

GC_GFNI_TARGET void transpose128_gfni(const block* in, size_t stride, block* out) {
  alignas(64) static const uint8_t kGather[64] = {
      0, 8,  16, 24, 32, 40, 48, 56, 1, 9,  17, 25, 33, 41, 49, 57, 2, 10, 18, 26, 34, 42,
      50, 58, 3, 11, 19, 27, 35, 43, 51, 59, 4, 12, 20, 28, 36, 44, 52, 60, 5, 13, 21, 29,
      37, 45, 53, 61, 6, 14, 22, 30, 38, 46, 54, 62, 7, 15, 23, 31, 39, 47, 55, 63};
  const __m512i gather = _mm512_load_si512((const void*)kGather);
  const __m512i unit = _mm512_set1_epi64(0x8040201008040201ll);  // byte j = 1 << j
  __m512i half[2][16];
#pragma GCC unroll 1
  for (int h = 0; h < 2; ++h) {
    __m512i x[16];
    zbyte_transpose<7>(in + (size_t)64 * h * stride, stride, x);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k)
      half[h][k] = _mm512_maskz_permutexvar_epi8(~0ull, gather, _mm512_gf2p8affine_epi64_epi8(unit, x[k], 0));
  }
  const __m512i lo4 = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i hi4 = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) {
    _mm512_storeu_si512((void*)(out + 8 * k), _mm512_permutex2var_epi64(half[0][k], lo4, half[1][k]));
    _mm512_storeu_si512((void*)(out + 8 * k + 4), _mm512_permutex2var_epi64(half[0][k], hi4, half[1][k]));
  }
}

#endif

// Expands and reduces one chunk over a batch of tiles (see expand_reduce),
// on the engine's AES path: VAES + AVX-512 when and_kernels() is "vaes".
// work holds 2^d * kSub blocks, 64-byte aligned.
template <bool kMask>
void expand_chunk(const AesKey* keys, const block* keep, int d, uint64_t ctr, size_t tiles, block* work,
                  block* cols, size_t stride, block* u) {
#if GC_X86
  if (and_kernels().wide) {
    expand_chunk_vaes<kMask>(keys, keep, d, ctr, tiles, work, cols, stride, u);
    return;
  }
#endif
  expand_chunk_aes128<kMask>(keys, keep, d, ctr, tiles, work, cols, stride, u);
}

// Garbler: col_i[t] ^= mask[i] & x[t] for the d columns of a chunk (column i
// at cols + i * stride).
inline void apply_corrections_aes128(block* cols, size_t stride, size_t tiles, const block* x, const block* mask,
                                     int d) {
  for (int i = 0; i < d; ++i) {
    block* col = cols + (size_t)i * stride;
    for (size_t t = 0; t < tiles; ++t) col[t] = xor_block(col[t], and_block(mask[i], x[t]));
  }
}

#if GC_X86
GC_VAES_TARGET void apply_corrections_vaes(block* cols, size_t stride, size_t tiles, const block* x,
                                           const block* mask, int d) {
  for (int i = 0; i < d; ++i) {
    block* col = cols + (size_t)i * stride;
    const __m512i m = zbcast(mask[i]);
    size_t t = 0;
    for (; t + 4 <= tiles; t += 4) {
      const __m512i c = _mm512_loadu_si512((const void*)(col + t));
      const __m512i v = _mm512_loadu_si512((const void*)(x + t));
      _mm512_storeu_si512((void*)(col + t), _mm512_ternarylogic_epi64(c, m, v, 0x78));  // c ^ (m & v)
    }
    for (; t < tiles; ++t) col[t] = xor_block(col[t], and_block(mask[i], x[t]));
  }
}
#endif

void apply_corrections(block* cols, size_t stride, size_t tiles, const block* x, const block* mask, int d) {
#if GC_X86
  if (and_kernels().wide) {
    apply_corrections_vaes(cols, stride, tiles, x, mask, d);
    return;
  }
#endif
  apply_corrections_aes128(cols, stride, tiles, x, mask, d);
}

// Row stride of the column matrix (cols_[j * stride + t], column j, tile t):
// 4 blocks of padding, because with a stride of 64 tiles (1 KiB) the 128
// loads of one tile's transpose all fall into 4 of L1's 64 sets and evict
// each other before the next tile reuses their lines.
inline size_t col_stride(size_t tiles) { return tiles + 4; }

// Transposes the 128 columns of each tile: cols[j * stride + t] -> out[128 t + j].
void transpose_tiles(const block* cols, size_t stride, size_t tiles, block* out) {
#if GC_X86
  if (and_kernels().wide) {
    static const bool gfni = cpu_has_gfni_vbmi() && !std::getenv("SPGC_SS_NO_GFNI");
    if (gfni)
      for (size_t t = 0; t < tiles; ++t) transpose128_gfni(cols + t, stride, out + t * 128);
    else
      for (size_t t = 0; t < tiles; ++t) transpose128_vaes(cols + t, stride, out + t * 128);
    return;
  }
#endif
  for (size_t t = 0; t < tiles; ++t) transpose128(cols + t, stride, out + t * 128);
}

void check_m(bool ready, size_t m) {
  if (!ready) throw std::logic_error("OT extension used before setup");
  if (m % 128) throw std::logic_error("OT extension needs a multiple of 128 OTs");
}

struct PhaseGuard {
  Channel& ch;
  Phase previous;
  PhaseGuard(Channel& c, Phase p) : ch(c), previous(c.phase()) { c.set_phase(p); }
  ~PhaseGuard() { ch.set_phase(previous); }
};

}  // namespace

SoftSpokenParams::SoftSpokenParams(int k_) : k(k_) {
  if (k < kMinK || k > kMaxK)
    throw std::invalid_argument("SoftSpoken: k must be in [" + std::to_string(kMinK) + ", " +
                                std::to_string(kMaxK) + "], got " + std::to_string(k));
  chunks = (int)((kBaseOts + (size_t)k - 1) / (size_t)k);
  // Balanced: the chunks k would leave short are spread, one bit each, over the last chunks
  // (k = 7: 14 x 7 + 5 x 6 bits rather than 18 x 7 + 2). Same bytes (one correction bit per
  // chunk), fewer leaves: 2,112 instead of 2,308 AES blocks per 128 OTs at k = 7.
  const int shorter = chunks * k - (int)kBaseOts;
  int bit = 0;
  for (int b = 0; b < chunks; ++b) {
    depth[b] = b < chunks - shorter ? k : k - 1;
    first[b] = bit;
    bit += depth[b];
  }
}

// ------------------------------------------------------------- receiver

SoftSpokenCotReceiver::SoftSpokenCotReceiver(int k) : params_(k) {}

void SoftSpokenCotReceiver::setup(Channel& ch) {
  block k0[kBaseOts], k1[kBaseOts];
  base_ot_send(ch, k0, k1, kBaseOts);
  PhaseGuard phase(ch, Phase::BaseOT);
  size_t leaves = 0;
  leaf_base_.assign(params_.chunks, 0);
  for (int b = 0; b < params_.chunks; ++b) {
    leaf_base_[b] = leaves;
    leaves += size_t(1) << params_.depth[b];
  }
  leaf_keys_.assign(leaves, AesKey{});
  BlockVector nodes, msg(2 * (kBaseOts - params_.chunks));
  size_t sent = 0;
  for (int b = 0; b < params_.chunks; ++b) {
    const int d = params_.depth[b], j0 = params_.first_bit(b);
    nodes.resize(size_t(1) << d);
    // Level 1 is the base OT pair of bit j0 (node[x] = k_{1-x}): the garbler,
    // holding k_{Delta_j0}, knows node[1 - Delta_j0] and not node[Delta_j0].
    nodes[0] = k1[j0];
    nodes[1] = k0[j0];
    for (int i = 1; i < d; ++i) {
      const size_t half = size_t(1) << i;
      const int j = j0 + i;
      block sum0 = zero_block(), sum1 = zero_block();
      for (size_t p = 0; p < half; ++p) {
        ggm_expand(nodes[p], &nodes[p], &nodes[p + half]);
        sum0 = xor_block(sum0, nodes[p]);
        sum1 = xor_block(sum1, nodes[p + half]);
      }
      // The garbler opens K_{1 - Delta_j} with its k_{Delta_j}.
      msg[sent++] = xor_block(sum0, k1[j]);
      msg[sent++] = xor_block(sum1, k0[j]);
    }
    for (size_t x = 0; x < nodes.size(); ++x) aes_expand_key(nodes[x], &leaf_keys_[leaf_base_[b] + x]);
  }
  if (sent) ch.send(msg.data(), sent * sizeof(block));
  ch.flush();
  std::memset((void*)k0, 0, sizeof k0);
  std::memset((void*)k1, 0, sizeof k1);
  nodes.fill(0, nodes.size(), zero_block());
  counter_ = 0;
  ready_ = true;
}

void SoftSpokenCotReceiver::run(Channel& ch, const uint8_t* choices, uint8_t* choices_out,
                                block* t_out, size_t m) {
  check_m(ready_, m);
  const bool random_choices = choices == nullptr;
  PhaseGuard phase(ch, Phase::OTExtension);
  const int nb = params_.chunks;
  const size_t first_corr = random_choices ? 1 : 0;  // chunk 0's u is r itself when random
  const size_t total_tiles = m / 128;
  work_.resize((size_t(1) << params_.depth[0]) * kSub);
  for (size_t done = 0; done < total_tiles; done += kTilesPerBatch) {
    const size_t tiles = std::min(kTilesPerBatch, total_tiles - done);
    const size_t cs = col_stride(tiles);
    cols_.resize(kBaseOts * cs);
    corr_.resize((nb + 1) * tiles);  // corrections of chunks first_corr.., then r
    block* r = corr_.data() + (size_t)nb * tiles;
    if (!random_choices)
      for (size_t t = 0; t < tiles; ++t) r[t] = load_block(choices + (done + t) * 16);
    block u[kTilesPerBatch];
    for (int b = 0; b < nb; ++b) {
      const AesKey* keys = leaf_keys_.data() + leaf_base_[b];
      block* cols = cols_.data() + (size_t)params_.first_bit(b) * cs;
      expand_chunk<false>(keys, nullptr, params_.depth[b], counter_ + done, tiles, work_.data(), cols, cs, u);
      if (random_choices && b == 0) {
        for (size_t t = 0; t < tiles; ++t) r[t] = u[t];
      } else {
        block* c = corr_.data() + (b - first_corr) * tiles;
        for (size_t t = 0; t < tiles; ++t) c[t] = xor_block(u[t], r[t]);
      }
    }
    const size_t ncorr = (size_t)nb - first_corr;
    if (ncorr) ch.send(corr_.data(), ncorr * tiles * sizeof(block));
    if (random_choices)
      for (size_t t = 0; t < tiles; ++t) store_block(choices_out + (done + t) * 16, r[t]);
    transpose_tiles(cols_.data(), cs, tiles, t_out + done * 128);
  }
  counter_ += total_tiles;
  ch.flush();
}

// --------------------------------------------------------------- sender

SoftSpokenCotSender::SoftSpokenCotSender(int k) : params_(k) {}

void SoftSpokenCotSender::setup(Channel& ch, block delta) {
  if (!lsb(delta)) throw std::logic_error("delta must have its lowest bit set");
  delta_ = delta;
  uint8_t bits[kBaseOts];
  for (size_t j = 0; j < kBaseOts; ++j) bits[j] = bit_of(delta, (int)j);
  block seeds[kBaseOts];
  base_ot_recv(ch, bits, seeds, kBaseOts);
  PhaseGuard phase(ch, Phase::BaseOT);
  const size_t msg_blocks = 2 * (kBaseOts - params_.chunks);
  BlockVector msg(msg_blocks);
  if (msg_blocks) ch.recv(msg.data(), msg_blocks * sizeof(block));

  size_t leaves = 0;
  leaf_base_.assign(params_.chunks, 0);
  for (int b = 0; b < params_.chunks; ++b) {
    leaf_base_[b] = leaves;
    leaves += size_t(1) << params_.depth[b];
  }
  leaf_keys_.assign(leaves, AesKey{});
  keep_.resize(leaves);
  delta_mask_.resize(kBaseOts);
  for (size_t j = 0; j < kBaseOts; ++j) delta_mask_[j] = select_mask(bits[j]);

  BlockVector nodes;
  size_t used = 0;
  const block ones = select_mask(true);
  for (int b = 0; b < params_.chunks; ++b) {
    const int d = params_.depth[b], j0 = params_.first_bit(b);
    nodes.resize(size_t(1) << d);
    // punct: the index (bits 0..i-1 so far) of the one node not known.
    size_t punct = bits[j0];
    nodes[1 - punct] = seeds[j0];
    nodes[punct] = zero_block();
    for (int i = 1; i < d; ++i) {
      const size_t half = size_t(1) << i;
      const int j = j0 + i;
      const size_t c = bits[j];
      for (size_t p = 0; p < half; ++p)
        if (p != punct) ggm_expand(nodes[p], &nodes[p], &nodes[p + half]);
      nodes[punct] = zero_block();
      nodes[punct + half] = zero_block();
      // K_{1-c} = msg[1-c] ^ k_c; the sibling is K_{1-c} minus the known
      // nodes on that side.
      block sib = xor_block(msg[used + (1 - c)], seeds[j]);
      used += 2;
      const size_t side = (1 - c) * half;
      for (size_t p = 0; p < half; ++p) sib = xor_block(sib, nodes[side + p]);
      nodes[punct + side] = sib;
      punct += c * half;
    }
    for (size_t x = 0; x < nodes.size(); ++x) {
      aes_expand_key(nodes[x], &leaf_keys_[leaf_base_[b] + x]);
      keep_[leaf_base_[b] + x] = x == punct ? zero_block() : ones;
    }
  }
  std::memset((void*)seeds, 0, sizeof seeds);
  nodes.fill(0, nodes.size(), zero_block());
  counter_ = 0;
  ready_ = true;
}

void SoftSpokenCotSender::run(Channel& ch, block* q, size_t m, bool random_choices) {
  check_m(ready_, m);
  PhaseGuard phase(ch, Phase::OTExtension);
  const int nb = params_.chunks;
  const size_t first_corr = random_choices ? 1 : 0;
  const size_t total_tiles = m / 128;
  work_.resize((size_t(1) << params_.depth[0]) * kSub);
  for (size_t done = 0; done < total_tiles; done += kTilesPerBatch) {
    const size_t tiles = std::min(kTilesPerBatch, total_tiles - done);
    const size_t cs = col_stride(tiles);
    cols_.resize(kBaseOts * cs);
    corr_.resize(2 * (size_t)nb * tiles);  // received corrections, then the u totals
    block* corr = corr_.data();
    block* tot = corr_.data() + (size_t)nb * tiles;
    // Expand first (while the evaluator does the same), then read its corrections.
    for (int b = 0; b < nb; ++b) {
      const size_t base = leaf_base_[b];
      block* cols = cols_.data() + (size_t)params_.first_bit(b) * cs;
      expand_chunk<true>(leaf_keys_.data() + base, keep_.data() + base, params_.depth[b], counter_ + done, tiles,
                         work_.data(), cols, cs, tot + (size_t)b * tiles);
    }
    const size_t ncorr = (size_t)nb - first_corr;
    if (first_corr) std::memset((void*)corr, 0, tiles * sizeof(block));
    if (ncorr) ch.recv(corr + first_corr * tiles, ncorr * tiles * sizeof(block));
    // Column j of chunk b: w_j ^= Delta_j * (T_b ^ c_b), which makes it
    // v_j ^ Delta_j * r (T_b is u_b without the unknown leaf).
    for (int b = 0; b < nb; ++b) {
      block* tb = tot + (size_t)b * tiles;
      const block* cb = corr + (size_t)b * tiles;
      for (size_t t = 0; t < tiles; ++t) tb[t] = xor_block(tb[t], cb[t]);
      const size_t j0 = (size_t)params_.first_bit(b);
      apply_corrections(cols_.data() + j0 * cs, cs, tiles, tb, delta_mask_.data() + j0, params_.depth[b]);
    }
    transpose_tiles(cols_.data(), cs, tiles, q + done * 128);
  }
  counter_ += total_tiles;
}

}  // namespace gc
