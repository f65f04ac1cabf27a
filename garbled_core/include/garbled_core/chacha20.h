// ChaCha's block function (RFC 8439 2.3, with 20 rounds; 8 for ChaCha8), header-only: the
// provable PRG of the servers' noise seeds (ChaCha8,
// spgc.privacy.noise.expand_seed), whose circuit (garbled_core/crypto_circuits.py) a server
// proves in zero knowledge under security: malicious.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace gc {

inline uint32_t chacha_rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// out[0..16): the block for key (8 words), counter and nonce (3 words) after `rounds` rounds
// (even: double rounds of a column and a diagonal round).
inline void chacha_block(const uint32_t key[8], uint32_t counter, const uint32_t nonce[3], int rounds,
                         uint32_t out[16]) {
  uint32_t s[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u, key[0], key[1], key[2], key[3],
                    key[4],      key[5],      key[6],      key[7],      counter, nonce[0], nonce[1], nonce[2]};
  uint32_t x[16];
  std::memcpy(x, s, sizeof x);
  auto quarter = [&x](int a, int b, int c, int d) {
    x[a] += x[b], x[d] = chacha_rotl(x[d] ^ x[a], 16);
    x[c] += x[d], x[b] = chacha_rotl(x[b] ^ x[c], 12);
    x[a] += x[b], x[d] = chacha_rotl(x[d] ^ x[a], 8);
    x[c] += x[d], x[b] = chacha_rotl(x[b] ^ x[c], 7);
  };
  for (int i = 0; i < rounds / 2; ++i) {
    quarter(0, 4, 8, 12), quarter(1, 5, 9, 13), quarter(2, 6, 10, 14), quarter(3, 7, 11, 15);
    quarter(0, 5, 10, 15), quarter(1, 6, 11, 12), quarter(2, 7, 8, 13), quarter(3, 4, 9, 14);
  }
  for (int i = 0; i < 16; ++i) out[i] = x[i] + s[i];
}

}  // namespace gc
