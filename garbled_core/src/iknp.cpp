#include "garbled_core/iknp.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>

#include "garbled_core/base_ot.h"
#include "garbled_core/gf128.h"
#include "garbled_core/prg.h"
#include "garbled_core/random.h"
#include "garbled_core/sha256.h"

namespace gc {

namespace {

// Tiles per network message: 64 tiles = 8192 OTs = 128 KiB of matrix.
constexpr size_t kTilesPerBatch = 64;

inline bool bit_of(block b, int i) {
  uint8_t bytes[16];
  store_block(bytes, b);
  return (bytes[i >> 3] >> (i & 7)) & 1;
}

#if GC_X86
// Byte-transposes 16 blocks: after four rounds of interleaving X[i] with
// X[i + 8], X[k] holds byte k of every input; feeding the inputs in 4-bit
// bit-reversed order makes the output rows come out in natural order.
inline void transpose_bytes16(const block* rows, block* cols) {
  static const int rev4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
  block x[16], y[16];
  for (int i = 0; i < 16; ++i) x[i] = rows[rev4[i]];
  for (int i = 0; i < 8; ++i) {
    y[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
    y[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
  }
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = _mm_unpacklo_epi16(y[i], y[i + 8]);
    x[2 * i + 1] = _mm_unpackhi_epi16(y[i], y[i + 8]);
  }
  for (int i = 0; i < 8; ++i) {
    y[2 * i] = _mm_unpacklo_epi32(x[i], x[i + 8]);
    y[2 * i + 1] = _mm_unpackhi_epi32(x[i], x[i + 8]);
  }
  for (int i = 0; i < 8; ++i) {
    cols[2 * i] = _mm_unpacklo_epi64(y[i], y[i + 8]);
    cols[2 * i + 1] = _mm_unpackhi_epi64(y[i], y[i + 8]);
  }
}
#endif

// KOS's coin toss (iknp.h): the sender's commitment to its part, and chi_j from both parts.
std::array<uint8_t, 32> kos_commitment(block seed_s) {
  static const char kTag[] = "spgc.iknp.kos.commit.v1";
  Sha256 h;
  h.update(kTag, sizeof kTag);
  uint8_t b[16];
  store_block(b, seed_s);
  h.update(b, 16);
  return h.digest();
}

Prg kos_chi_stream(block seed_s, block seed_r) {
  static const char kTag[] = "spgc.iknp.kos.chi.v1";
  Sha256 h;
  h.update(kTag, sizeof kTag);
  uint8_t b[32];
  store_block(b, seed_s);
  store_block(b + 16, seed_r);
  h.update(b, 32);
  return Prg(load_block(h.digest().data()));
}

constexpr size_t kChiChunk = 1024;

}  // namespace

void transpose128(const block* in, size_t stride, block* out) {
#if GC_X86
  alignas(16) uint16_t rows[128][8];
  for (int g = 0; g < 8; ++g) {
    block group[16], bytes[16];
    for (int t = 0; t < 16; ++t) group[t] = in[(size_t)(16 * g + t) * stride];
    transpose_bytes16(group, bytes);
    for (int k = 0; k < 16; ++k) {
      block v = bytes[k];
      // movemask collects bit 7 of each byte; shifting brings bit b there.
      for (int b = 7; b >= 0; --b) {
        rows[8 * k + b][g] = (uint16_t)_mm_movemask_epi8(v);
        v = _mm_slli_epi64(v, 1);
      }
    }
  }
  for (int j = 0; j < 128; ++j) out[j] = load_block(rows[j]);
#else
  uint8_t rows[128][16] = {};
  for (int i = 0; i < 128; ++i) {
    uint8_t col[16];
    store_block(col, in[(size_t)i * stride]);
    for (int j = 0; j < 128; ++j)
      if ((col[j >> 3] >> (j & 7)) & 1) rows[j][i >> 3] |= (uint8_t)(1u << (i & 7));
  }
  for (int j = 0; j < 128; ++j) out[j] = load_block(rows[j]);
#endif
}

void ColumnPrgs::init(const block* seeds) {
  keys_.resize(kBaseOts);
  for (size_t i = 0; i < kBaseOts; ++i) aes_expand_key(seeds[i], &keys_[i]);
  counter_ = 0;
}

void ColumnPrgs::expand(block* out, size_t tiles) {
  for (size_t i = 0; i < kBaseOts; ++i) {
    block* col = out + i * tiles;
    size_t t = 0;
    for (; t + 8 <= tiles; t += 8) {
      block x[8];
      for (int j = 0; j < 8; ++j) x[j] = make_block(0, counter_ + t + j);
      aes_encrypt_blocks<8>(keys_[i], x);
      for (int j = 0; j < 8; ++j) col[t + j] = x[j];
    }
    for (; t < tiles; ++t) {
      block x[1] = {make_block(0, counter_ + t)};
      aes_encrypt_blocks<1>(keys_[i], x);
      col[t] = x[0];
    }
  }
  counter_ += tiles;
}

void CotSender::setup(Channel& ch, block delta) {
  if (!lsb(delta)) throw std::logic_error("delta must have its lowest bit set");
  delta_ = delta;
  uint8_t choices[kBaseOts];
  for (size_t i = 0; i < kBaseOts; ++i) choices[i] = bit_of(delta, (int)i);
  block seeds[kBaseOts];
  base_ot_recv(ch, choices, seeds, kBaseOts);
  prgs_.init(seeds);
  ready_ = true;
}

void CotSender::extend(Channel& ch, block* q, size_t m) {
  if (!ready_) throw std::logic_error("OT extension used before setup");
  if (m % 128) throw std::logic_error("OT extension needs a multiple of 128 OTs");
  Phase previous = ch.phase();
  ch.set_phase(Phase::OTExtension);
  size_t total_tiles = m / 128;
  uint8_t s[kBaseOts];
  for (size_t i = 0; i < kBaseOts; ++i) s[i] = bit_of(delta_, (int)i);
  for (size_t done = 0; done < total_tiles; done += kTilesPerBatch) {
    size_t tiles = std::min(kTilesPerBatch, total_tiles - done);
    cols_.resize(kBaseOts * tiles);
    u_.resize(kBaseOts * tiles);
    prgs_.expand(cols_.data(), tiles);
    ch.recv(u_.data(), u_.size() * sizeof(block));
    // q_i = G(k_{s_i}) ^ s_i * u_i, column by column.
    for (size_t i = 0; i < kBaseOts; ++i)
      if (s[i])
        for (size_t t = 0; t < tiles; ++t)
          cols_[i * tiles + t] = xor_block(cols_[i * tiles + t], u_[i * tiles + t]);
    for (size_t t = 0; t < tiles; ++t) transpose128(cols_.data() + t, tiles, q + (done + t) * 128);
  }
  ch.set_phase(previous);
}

void CotReceiver::setup(Channel& ch) {
  block k0[kBaseOts], k1[kBaseOts];
  base_ot_send(ch, k0, k1, kBaseOts);
  prgs0_.init(k0);
  prgs1_.init(k1);
  ready_ = true;
}

void CotReceiver::extend(Channel& ch, const uint8_t* choices, block* t_out, size_t m) {
  if (!ready_) throw std::logic_error("OT extension used before setup");
  if (m % 128) throw std::logic_error("OT extension needs a multiple of 128 OTs");
  Phase previous = ch.phase();
  ch.set_phase(Phase::OTExtension);
  size_t total_tiles = m / 128;
  for (size_t done = 0; done < total_tiles; done += kTilesPerBatch) {
    size_t tiles = std::min(kTilesPerBatch, total_tiles - done);
    cols0_.resize(kBaseOts * tiles);
    cols1_.resize(kBaseOts * tiles);
    prgs0_.expand(cols0_.data(), tiles);
    prgs1_.expand(cols1_.data(), tiles);
    // u_i = G(k0_i) ^ G(k1_i) ^ r, sent column by column.
    for (size_t i = 0; i < kBaseOts; ++i)
      for (size_t t = 0; t < tiles; ++t) {
        block r = load_block(choices + (done + t) * 16);
        cols1_[i * tiles + t] = xor_block(xor_block(cols0_[i * tiles + t], cols1_[i * tiles + t]), r);
      }
    if (deviation_.matrix) deviation_.matrix(reinterpret_cast<uint8_t*>(cols1_.data()), tiles, done);
    ch.send(cols1_.data(), cols1_.size() * sizeof(block));
    for (size_t t = 0; t < tiles; ++t) transpose128(cols0_.data() + t, tiles, t_out + (done + t) * 128);
  }
  ch.flush();
  ch.set_phase(previous);
}

void CotSender::extend_checked(Channel& ch, block* q_out, size_t m) {
  if (m % 128) throw std::logic_error("OT extension needs a multiple of 128 OTs");
  size_t total = m + kKosExtraOts;
  block seed_s = random_block();
  auto commitment = kos_commitment(seed_s);
  ch.send(commitment.data(), commitment.size());  // before the matrix: chi is fixed after it
  BlockVector q(total);
  extend(ch, q.data(), total);
  block seed_r, x, t;
  ch.recv(&seed_r, sizeof seed_r);
  block opened = seed_s;
  if (deviation_.opening) {
    Bytes16 o, r;
    store_block(o.data(), seed_s);
    store_block(r.data(), seed_r);
    deviation_.opening(o, r);
    opened = load_block(o.data());
  }
  ch.send(&opened, sizeof opened);
  ch.recv(&x, sizeof x);
  ch.recv(&t, sizeof t);
  Prg chi = kos_chi_stream(seed_s, seed_r);
  Wide sum{zero_block(), zero_block()};
  block chis[kChiChunk];
  for (size_t j = 0; j < total; j += kChiChunk) {
    size_t n = std::min(kChiChunk, total - j);
    chi.fill(chis, n);
    for (size_t k = 0; k < n; ++k) sum = xor_wide(sum, clmul_wide(q[j + k], chis[k]));
  }
  if (!equal_block(gf128_reduce(sum), xor_block(t, gf128_mul(x, delta_))))
    throw PeerDeviated(
        "the OT receiver failed the consistency check (KOS): its choice bits differ between the "
        "columns of its matrix");
  std::memcpy(static_cast<void*>(q_out), q.data(), m * sizeof(block));
}

void CotReceiver::extend_checked(Channel& ch, const uint8_t* choices, block* t_out, size_t m) {
  if (m % 128) throw std::logic_error("OT extension needs a multiple of 128 OTs");
  size_t total = m + kKosExtraOts;
  std::vector<uint8_t> bits(total / 8);
  std::memcpy(bits.data(), choices, m / 8);
  secure_random(bits.data() + m / 8, kKosExtraOts / 8);  // they hide the real choices in x
  BlockVector t(total);
  extend(ch, bits.data(), t.data(), total);
  block seed_r = random_block();
  ch.send(&seed_r, sizeof seed_r);
  std::array<uint8_t, 32> commitment;
  block seed_s;
  ch.recv(commitment.data(), commitment.size());
  ch.recv(&seed_s, sizeof seed_s);
  if (kos_commitment(seed_s) != commitment)
    throw PeerDeviated("the OT sender's coin does not open its commitment (KOS coin toss)");
  Prg chi = kos_chi_stream(seed_s, seed_r);
  block x = zero_block();
  Wide sum{zero_block(), zero_block()};
  block chis[kChiChunk];
  for (size_t j = 0; j < total; j += kChiChunk) {
    size_t n = std::min(kChiChunk, total - j);
    chi.fill(chis, n);
    for (size_t k = 0; k < n; ++k) {
      size_t i = j + k;
      x = xor_block(x, and_block(chis[k], select_mask((bits[i >> 3] >> (i & 7)) & 1)));
      sum = xor_wide(sum, clmul_wide(t[i], chis[k]));
    }
  }
  block t_sum = gf128_reduce(sum);
  if (deviation_.check) {
    Bytes16 xb, tb;
    store_block(xb.data(), x);
    store_block(tb.data(), t_sum);
    Prg replay = kos_chi_stream(seed_s, seed_r);
    deviation_.check(xb, tb, [&replay](size_t index) {
      Prg p = replay;
      p.advance(index);
      Bytes16 out;
      store_block(out.data(), p.next());
      return out;
    });
    x = load_block(xb.data());
    t_sum = load_block(tb.data());
  }
  block reply[2] = {x, t_sum};
  ch.send(reply, sizeof reply);
  ch.flush();
  std::memcpy(static_cast<void*>(t_out), t.data(), m * sizeof(block));
}

}  // namespace gc
