// AES-128 with hardware instructions: key expansion and encryption of a few
// blocks at a time under one key, interleaved so the AES units stay busy.
// Used by the PRG (AES-CTR), the garbling hash and OT extension.
#pragma once

#include "garbled_core/block.h"

namespace gc {

struct AesKey {
  block rk[11];
};

#if GC_X86
namespace detail {
// One step of the AES-128 key schedule; `assist` is aeskeygenassist's output.
inline block expand_step(block key, block assist) {
  assist = _mm_shuffle_epi32(assist, 0xff);
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  key = _mm_xor_si128(key, _mm_slli_si128(key, 4));
  return _mm_xor_si128(key, assist);
}
}  // namespace detail

inline void aes_expand_key(block user_key, AesKey* out) {
  block* k = out->rk;
  k[0] = user_key;
  // aeskeygenassist needs an immediate round constant, hence the unrolled list.
  k[1] = detail::expand_step(k[0], _mm_aeskeygenassist_si128(k[0], 0x01));
  k[2] = detail::expand_step(k[1], _mm_aeskeygenassist_si128(k[1], 0x02));
  k[3] = detail::expand_step(k[2], _mm_aeskeygenassist_si128(k[2], 0x04));
  k[4] = detail::expand_step(k[3], _mm_aeskeygenassist_si128(k[3], 0x08));
  k[5] = detail::expand_step(k[4], _mm_aeskeygenassist_si128(k[4], 0x10));
  k[6] = detail::expand_step(k[5], _mm_aeskeygenassist_si128(k[5], 0x20));
  k[7] = detail::expand_step(k[6], _mm_aeskeygenassist_si128(k[6], 0x40));
  k[8] = detail::expand_step(k[7], _mm_aeskeygenassist_si128(k[7], 0x80));
  k[9] = detail::expand_step(k[8], _mm_aeskeygenassist_si128(k[8], 0x1b));
  k[10] = detail::expand_step(k[9], _mm_aeskeygenassist_si128(k[9], 0x36));
}

// Encrypts N blocks in place; round-major order lets N AES rounds overlap.
template <int N>
inline void aes_encrypt_blocks(const AesKey& key, block* x) {
  for (int i = 0; i < N; ++i) x[i] = _mm_xor_si128(x[i], key.rk[0]);
  for (int r = 1; r < 10; ++r)
    for (int i = 0; i < N; ++i) x[i] = _mm_aesenc_si128(x[i], key.rk[r]);
  for (int i = 0; i < N; ++i) x[i] = _mm_aesenclast_si128(x[i], key.rk[10]);
}
#else
namespace detail {
inline uint32_t sub_word(uint32_t w) {
  // AESE with a zero key is SubBytes(ShiftRows(x)); with the word broadcast to
  // all columns ShiftRows has no effect, leaving SubBytes on each byte.
  uint8x16_t v = vreinterpretq_u8_u32(vdupq_n_u32(w));
  v = vaeseq_u8(v, vdupq_n_u8(0));
  return vgetq_lane_u32(vreinterpretq_u32_u8(v), 0);
}
}  // namespace detail

inline void aes_expand_key(block user_key, AesKey* out) {
  static const uint32_t rcon[10] = {0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1b, 0x36};
  uint32_t w[44];
  std::memcpy(w, &user_key, 16);
  for (int i = 4; i < 44; ++i) {
    uint32_t t = w[i - 1];
    if (i % 4 == 0) {
      t = (t >> 8) | (t << 24);
      t = detail::sub_word(t) ^ rcon[i / 4 - 1];
    }
    w[i] = w[i - 4] ^ t;
  }
  for (int r = 0; r < 11; ++r) std::memcpy(&out->rk[r], &w[4 * r], 16);
}

template <int N>
inline void aes_encrypt_blocks(const AesKey& key, block* x) {
  uint8x16_t s[N];
  for (int i = 0; i < N; ++i) s[i] = vreinterpretq_u8_u64(x[i]);
  for (int r = 0; r < 9; ++r)
    for (int i = 0; i < N; ++i)
      s[i] = vaesmcq_u8(vaeseq_u8(s[i], vreinterpretq_u8_u64(key.rk[r])));
  for (int i = 0; i < N; ++i)
    x[i] = veorq_u64(vreinterpretq_u64_u8(vaeseq_u8(s[i], vreinterpretq_u8_u64(key.rk[9]))),
                     key.rk[10]);
}
#endif

inline AesKey aes_key(block user_key) {
  AesKey k;
  aes_expand_key(user_key, &k);
  return k;
}

}  // namespace gc
