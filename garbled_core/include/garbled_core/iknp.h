// IKNP correlated OT extension (Ishai-Kilian-Nissim-Petrank 2003) whose
// correlation is the garbler's free-XOR offset Delta, so its outputs are wire
// labels as they stand: the garbler (COT sender) gets q_j, the evaluator
// (receiver, choice r_j) gets q_j ^ r_j * Delta. Chosen choices cost exactly
// one 128-bit matrix column per OT (16 bytes); no correction bits are needed,
// and random choices (the noise sampler's) are just choices the evaluator
// draws itself.
//
// extend_checked: the same COTs with the consistency check of Keller, Orsini and Scholl
// ("Actively Secure OT Extension with Optimal Overhead", CRYPTO 2015), which holds a receiver
// that deviates (choice bits that differ between the matrix columns, to learn bits of Delta)
// to one Delta: the receiver extends m + kKosExtraOts, the last kKosExtraOts with CSPRNG
// choices that mask the check and are dropped; then a coin toss fixes chi_1..chi_m' in
// GF(2^128) (gf128.h) AFTER the receiver's matrix is sent (the sender committed to its part
// first, so neither side picks chi): the sender sends C = SHA-256(tag, s_S), the receiver its
// s_R after its matrix, the sender opens s_S, chi_j = AES_k(j) with k from SHA-256(tag, s_S,
// s_R). The receiver sends x = sum_j r_j chi_j and t = sum_j t_j chi_j; the sender checks
// sum_j q_j chi_j = t + x Delta, else PeerDeviated. A receiver that used other choice bits in
// some columns passes only by guessing Delta's bits there, one guess per column it changed
// (probability 2^-c for c columns; KOS's analysis, with kKosExtraOts >= 128 + 40 keeping x
// and t independent of the real choices). Two messages more than extend, and 32 bytes plus
// kKosExtraOts / 8 * 128 bytes of matrix: nothing per OT.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <vector>

#include "garbled_core/aes.h"
#include "garbled_core/block.h"
#include "garbled_core/channel.h"

namespace gc {

constexpr size_t kBaseOts = 128;
// KOS's kappa + s extra OTs (s = 40), rounded up to whole 128-OT tiles.
constexpr size_t kKosExtraOts = 256;

// The other party deviated from the protocol, and a check caught it (what it sent does not
// fit what it committed to or what the protocol allows). The message names the check.
class PeerDeviated : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// out[j] (j < 128) gets bit j of in[i * stride] in its bit i, for i < 128:
// a 128x128 bit-matrix transpose. Bit j of a block is bit j % 8 of byte j / 8.
void transpose128(const block* in, size_t stride, block* out);

// Keyed column generators: column i, tile t is AES_{k_i}(counter + t).
class ColumnPrgs {
 public:
  void init(const block* seeds);
  // Writes tiles [counter, counter + tiles) of every column, column-major:
  // out[i * tiles + t].
  void expand(block* out, size_t tiles);

 private:
  std::vector<AesKey> keys_;
  uint64_t counter_ = 0;
};

class CotSender {
 public:
  // Base OTs as receiver, choosing by the bits of delta (lsb(delta) = 1).
  void setup(Channel& ch, block delta);
  bool ready() const { return ready_; }
  // m must be a multiple of 128; writes the zero labels q[0..m).
  void extend(Channel& ch, block* q, size_t m);
  // The same with KOS's check (above): PeerDeviated when the receiver's check fails.
  void extend_checked(Channel& ch, block* q, size_t m);

  // Fault injection for tests, a sender that deviates: `opening` may replace the coin part it
  // opens (16 bytes), given the receiver's part, e.g. to steer chi. Never set outside tests.
  using Bytes16 = std::array<uint8_t, 16>;
  struct Deviation {
    std::function<void(Bytes16& opened, const Bytes16& receivers_part)> opening;
  };
  void deviate_for_test(Deviation d) { deviation_ = std::move(d); }

 private:
  Deviation deviation_;
  bool ready_ = false;
  block delta_{};
  ColumnPrgs prgs_;
  BlockVector cols_, u_;
};

class CotReceiver {
 public:
  // Base OTs as sender.
  void setup(Channel& ch);
  bool ready() const { return ready_; }
  // choices: m bits packed LSB-first (m / 8 bytes, m a multiple of 128);
  // writes the chosen labels t[0..m).
  void extend(Channel& ch, const uint8_t* choices, block* t, size_t m);
  // The same with KOS's check (above): PeerDeviated when the sender's coin opening does not
  // match its commitment.
  void extend_checked(Channel& ch, const uint8_t* choices, block* t, size_t m);

  // Fault injection for tests, a receiver that deviates: `matrix` is called on each batch of
  // the matrix columns u before it is sent (128 columns of `tiles` 16-byte blocks,
  // column-major; the batch starts at OT first_tile * 128), `check` on (x, t) before they are
  // sent, with chi_j by index. Plain bytes, not blocks: std::function drops a vector type's
  // attributes. Never set outside tests.
  using Bytes16 = std::array<uint8_t, 16>;
  struct Deviation {
    std::function<void(uint8_t* u, size_t tiles, size_t first_tile)> matrix;
    std::function<void(Bytes16& x, Bytes16& t, const std::function<Bytes16(size_t)>& chi)> check;
  };
  void deviate_for_test(Deviation d) { deviation_ = std::move(d); }

 private:
  Deviation deviation_;
  bool ready_ = false;
  ColumnPrgs prgs0_, prgs1_;
  BlockVector cols0_, cols1_;
};

}  // namespace gc
