// SoftSpoken OT extension (Lawrence Roy, "SoftSpokenOT: Quieter OT Extension
// from Small-Field Silent VOLE in the Minicrypt Model", CRYPTO 2022),
// semi-honest, as a drop-in for the IKNP correlated OT of iknp.h: same roles,
// same 128 base OTs, same output correlation, fewer bytes.
//
// Roles and outputs (exactly as CotSender / CotReceiver):
//   garbler   = COT sender,   holds Delta (lsb(Delta) = 1), gets q_j;
//   evaluator = COT receiver, choice r_j, gets t_j = q_j ^ r_j * Delta.
// The correlation is the garbler's free-XOR offset, so q_j is the zero-label
// and t_j the label of the evaluator's bit r_j, as they stand.
//
// Construction. Delta's 128 bits are cut into nb = ceil(128 / k) chunks of
// d_b = k bits, except that the last nb * k - 128 chunks have k - 1 (k = 7:
// 14 chunks of 7 and 5 of 6 bits; cost is 2^d_b leaves per chunk, so this
// balanced cut needs 8.5% fewer AES blocks than 18 x 7 + 2 for the same nb);
// chunk b is the bits j = j_b .. j_b + d_b - 1 (j_b = d_0 + ... + d_{b-1}),
// read as the leaf index x*_b in [0, 2^d_b) (bit i of x*_b = bit j_b + i of
// Delta).
//   Setup: 128 Chou-Orlandi base OTs (base_ot.h), the evaluator as OT sender
//   (k0_j, k1_j), the garbler as receiver choosing bit j of Delta. For each
//   chunk the evaluator grows a GGM tree of depth d_b: level 1 is the base OT
//   pair of bit j_b itself (node[x] = k_{1-x}), each further level doubles it
//   with the PRG G(s) = (AES_s(c0), AES_s(c1)); bit i of a leaf's index is the
//   branch taken at level i + 1. For level i + 1 >= 2 the evaluator sends
//   (K_0 ^ k1_j, K_1 ^ k0_j), j = j_b + i, K_c the XOR of the level's nodes
//   whose bit i is c: the garbler, holding k_{Delta_j}, opens exactly
//   K_{1 - Delta_j}, which gives it the sibling of its path. So the garbler
//   ends up with every leaf seed except the one at x*_b (a (2^d - 1)-out-of-2^d
//   OT, i.e. a punctured PRF); the evaluator has all of them.
//   Extend: every leaf seed s_x keys an AES-CTR stream r_x (one 128-bit block
//   per 128 OTs, counter = tile index, advancing across extends). The
//   evaluator computes u_b = XOR_x r_x and v_{b,i} = XOR_{x: x_i = 1} r_x;
//   the garbler, without r_{x*}, computes w_{b,i} = XOR_{x: x_i != x*_i} r_x,
//   and w_{b,i} = v_{b,i} ^ x*_i * u_b (the x* term drops out as x* ^ x* = 0).
//   The evaluator sends c_b = u_b ^ r per chunk, the garbler adds
//   Delta_j * c_b to column j, so columns satisfy w'_j = v_j ^ Delta_j * r,
//   exactly IKNP's column relation: transposing the 128 columns per 128 OTs
//   (transpose128) gives q_j (garbler) and t_j = q_j ^ r_j * Delta
//   (evaluator). So the correlation is Delta itself.
//
// Communication (evaluator -> garbler, per extend of m OTs, nothing back):
//   chosen choices (extend):        nb * m / 8 bytes   = ceil(128/k) bits/OT
//   random choices (extend_random): (nb - 1) * m / 8   (chunk 0's u_0 IS the
//     choice vector: r = u_0, so chunk 0 needs no correction; the evaluator
//     learns its random choices from it). With chosen choices no chunk is
//     free: every chunk's u_b must be corrected to r.
//   k = 8: 2 bytes/OT chosen, 1.875 bytes/OT random (IKNP: 16); k = 7 (the
//   default): 19 chunks, 2.375 bytes/OT chosen, 2.25 random.
//   Setup: the base OTs as IKNP, plus 2 * (128 - nb) blocks of GGM level
//   sums from the evaluator (k = 8: 3584 bytes, k = 7: 3488), counted under
//   Phase::BaseOT.
//
// Security (semi-honest only; no consistency check, so a malicious
// evaluator could learn bits of Delta by sending inconsistent corrections):
//   - The evaluator learns nothing about Delta: all it ever receives are the
//     base OT receiver's messages, which hide the choice bits (Delta) by the
//     base OT's receiver privacy; everything after is evaluator -> garbler.
//   - The garbler sees, per chunk, all leaves but s_{x*}; r_{x*} is a fresh
//     AES-CTR stream under an unknown key, so u_b (and hence each correction
//     c_b = u_b ^ r) is a one-time pad on r: the garbler learns nothing about
//     the choices. The GGM sums are padded with the base OT strings it did
//     not choose, and each base OT string is used once.
//   - Fresh PRG counters per extend: both sides keep a tile counter that
//     advances by m / 128 per extend, so no (leaf key, counter) pair is ever
//     expanded twice in one setup; extends must be called with the same
//     sequence of m on both sides (as the session does). The counter is a
//     64-bit value; a setup is good for 2^64 tiles.
//   - Randomness: the GGM roots are the base OT strings themselves (OpenSSL
//     CSPRNG scalars inside base OT); nothing else is drawn. Delta is the
//     caller's (random_block(), OpenSSL CSPRNG). extend_random's choice bits
//     are u_0, an XOR of AES-CTR streams under the chunk-0 leaf keys: as
//     random as those (pseudorandom), and hidden from the garbler, which
//     lacks the stream of its punctured leaf.
//   - Do not run IKNP and SoftSpoken on the same base OT strings.
//   - Leaf keys are secret (they are the OT extension's seeds); the objects
//     hold them in memory until destroyed, like CotSender/CotReceiver.
//
// Integration (session.cpp): same calls, same order, same directions as
// CotSender / CotReceiver, so a template parameter or a two-method adapter
// switches them.
//   setup: garbler base_ot_recv then recv(GGM sums); evaluator base_ot_send
//     then send(GGM sums) and flush. Both parties must construct with the
//     same k (it is not negotiated on the wire).
//   extend: the evaluator only sends (batches of up to 64 * 128 OTs, flushed
//     at the end of each call), the garbler only receives; neither waits for
//     the other otherwise. So the evaluator may run any number of extends
//     ahead (the session keeps 4,096 instances of OTs in flight) and the garbler reads them
//     later in order; tested in softspoken_check. Each side must make the same
//     sequence of calls with the same m, and extend / extend_random must pair
//     up call by call (a mismatch desynchronises the byte stream).
//   Cost: per OT about 2^k / k AES blocks per side (k = 8: 32; IKNP: 1 on the
//     garbler, 2 on the evaluator) plus IKNP's transpose; memory 2^k * 128/k
//     AES key schedules per party (k = 8: 704 KiB).
//
// Implementation (softspoken.cpp). Two paths with the same outputs bit for
// bit, chosen per call by the engine-wide AES switch and_kernels()
// (halfgates.h: "vaes" when the CPU has VAES + AVX-512, "aesni" otherwise or
// with SPGC_GC_KERNEL=aesni / select_and_kernels("aesni")); the two parties
// may run different paths.
//   aesni (portable; AES-NI on x86, AESE/AESMC on aarch64): per leaf 8 tiles
//     of its AES-CTR stream in registers, leaves in groups of 4 with the
//     first two reduction levels folded in, the rest in a work buffer;
//     transpose128 from iknp.cpp.
//   Both: the column matrix's rows are padded by 4 blocks (a 1 KiB row
//     stride put one tile's 128 transpose loads into 4 L1 sets).
//   vaes (x86, compiled through target attributes, run only after the CPU
//     check): a zmm holds 4 consecutive tiles of one leaf's stream (the
//     leaf's round keys broadcast to the 4 lanes), so the same reduction
//     tree runs on zmm and the columns are stored 4 tiles at a time; a pass
//     is 16 tiles x 4 leaves = 16 AES chains in flight (about 90% of the
//     VAES peak on Zen 4; a tail of <= 8 or <= 4 tiles runs 8 or 16 leaves
//     at once instead, so short extends cost what they use). The garbler's
//     Delta-masked column update runs in zmm too. Transpose: the byte transpose on four 16-row
//     groups at once, then GF2P8AFFINEQB on 8 x 8 bit blocks plus VPERMB /
//     VPERMT2Q when the CPU has GFNI and AVX512-VBMI (SPGC_SS_NO_GFNI=1, read
//     once per process, disables it), else VPMOVB2M, 64 bits at a time.
//   Rates (M OT per CPU-second per side, garbler / evaluator, m = 2^20,
//     AMD EPYC Zen 4, both parties on one 2-core machine;
//     softspoken_check --bench-only 8), before -> after this path:
//     k = 2: 66 / 79 -> 187 / 136,  k = 4: 66 / 61 -> 146 / 151,
//     k = 7: 25 / 26 -> 53 / 59,    k = 8: 15.7 / 15.6 -> 34 / 34
//     (IKNP: 108-122 / 77-81). At k = 8 the vaes path is bound by the AES
//     units: 32 blocks per OT is about 22 ns per OT at their peak; the aesni
//     path keeps its old rates.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "garbled_core/aes.h"
#include "garbled_core/block.h"
#include "garbled_core/channel.h"

namespace gc {

// Shared layout of the chunks (both parties derive it from k).
struct SoftSpokenParams {
  static constexpr int kMinK = 1, kMaxK = 10, kDefaultK = 7;
  int k = kDefaultK;
  int chunks = 0;                   // nb = ceil(128 / k)
  int depth[128] = {};              // d_b: k, or k - 1 for the last nb * k - 128 chunks
  int first[128] = {};              // first Delta bit of chunk b
  explicit SoftSpokenParams(int k);
  int first_bit(int b) const { return first[b]; }
  // Bytes the evaluator sends for one extend of m OTs.
  size_t extend_bytes(size_t m, bool random_choices) const {
    return (size_t)(random_choices ? chunks - 1 : chunks) * (m / 8);
  }
  // Bytes the evaluator sends in setup after the base OTs (GGM level sums).
  size_t setup_extra_bytes() const { return (size_t)2 * (128 - chunks) * sizeof(block); }
};

class SoftSpokenCotSender {
 public:
  explicit SoftSpokenCotSender(int k = SoftSpokenParams::kDefaultK);
  // Base OTs as receiver, choosing by the bits of delta (lsb(delta) = 1),
  // then receives the GGM level sums.
  void setup(Channel& ch, block delta);
  bool ready() const { return ready_; }
  int k() const { return params_.k; }
  const SoftSpokenParams& params() const { return params_; }
  // m must be a multiple of 128; writes the zero labels q[0..m). Pairs with
  // SoftSpokenCotReceiver::extend (chosen choices).
  void extend(Channel& ch, block* q, size_t m) { run(ch, q, m, false); }
  // Pairs with SoftSpokenCotReceiver::extend_random (one chunk fewer).
  void extend_random(Channel& ch, block* q, size_t m) { run(ch, q, m, true); }

 private:
  void run(Channel& ch, block* q, size_t m, bool random_choices);

  SoftSpokenParams params_;
  bool ready_ = false;
  block delta_{};
  uint64_t counter_ = 0;             // next tile index
  std::vector<AesKey> leaf_keys_;    // chunk b, leaf x at leaf_base_[b] + x
  std::vector<size_t> leaf_base_;
  BlockVector keep_;                 // per leaf: all-ones, zero at x*_b
  BlockVector delta_mask_;           // per Delta bit j: all-ones if set
  BlockVector cols_, corr_, work_;
};

class SoftSpokenCotReceiver {
 public:
  explicit SoftSpokenCotReceiver(int k = SoftSpokenParams::kDefaultK);
  // Base OTs as sender, then sends the GGM level sums (and flushes).
  void setup(Channel& ch);
  bool ready() const { return ready_; }
  int k() const { return params_.k; }
  const SoftSpokenParams& params() const { return params_; }
  // choices: m bits packed LSB-first (m / 8 bytes, m a multiple of 128);
  // writes the chosen labels t[0..m). Sends params().extend_bytes(m, false).
  void extend(Channel& ch, const uint8_t* choices, block* t, size_t m) {
    run(ch, choices, nullptr, t, m);
  }
  // Random choices: writes the evaluator's random choice bits (m / 8 bytes,
  // LSB-first) to choices_out and their labels to t[0..m). Sends
  // params().extend_bytes(m, true).
  void extend_random(Channel& ch, uint8_t* choices_out, block* t, size_t m) {
    run(ch, nullptr, choices_out, t, m);
  }

 private:
  void run(Channel& ch, const uint8_t* choices, uint8_t* choices_out, block* t, size_t m);

  SoftSpokenParams params_;
  bool ready_ = false;
  uint64_t counter_ = 0;
  std::vector<AesKey> leaf_keys_;
  std::vector<size_t> leaf_base_;
  BlockVector cols_, corr_, work_;
};

}  // namespace gc
