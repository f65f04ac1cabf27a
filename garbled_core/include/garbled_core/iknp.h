// IKNP correlated OT extension (Ishai-Kilian-Nissim-Petrank 2003) whose
// correlation is the garbler's free-XOR offset Delta, so its outputs are wire
// labels as they stand: the garbler (COT sender) gets q_j, the evaluator
// (receiver, choice r_j) gets q_j ^ r_j * Delta. Chosen choices cost exactly
// one 128-bit matrix column per OT (16 bytes); no correction bits are needed,
// and random choices (the noise sampler's) are just choices the evaluator
// draws itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "garbled_core/aes.h"
#include "garbled_core/block.h"
#include "garbled_core/channel.h"

namespace gc {

constexpr size_t kBaseOts = 128;

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

 private:
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

 private:
  bool ready_ = false;
  ColumnPrgs prgs0_, prgs1_;
  BlockVector cols0_, cols1_;
};

}  // namespace gc
