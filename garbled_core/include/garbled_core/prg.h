// AES-CTR pseudorandom generator: expands a 128-bit seed into a stream of
// blocks. Both parties of a shared seed get identical streams, which is how
// garbler inputs cost no communication.
#pragma once

#include <cstddef>
#include <cstdint>

#include "garbled_core/aes.h"

namespace gc {

class Prg {
 public:
  explicit Prg(block seed) : key_(aes_key(seed)) {}

  // Fills out[0..n) with the next n blocks of the stream.
  void fill(block* out, size_t n) {
    const size_t whole = n / 8 * 8;  // (one index through both loops made GCC doubt the tail's bound)
    for (size_t i = 0; i < whole; i += 8) {
      block x[8];
      for (int j = 0; j < 8; ++j) x[j] = make_block(0, counter_ + j);
      counter_ += 8;
      aes_encrypt_blocks<8>(key_, x);
      for (int j = 0; j < 8; ++j) out[i + j] = x[j];
    }
    for (size_t i = whole; i < n; ++i) {
      block x[1] = {make_block(0, counter_++)};
      aes_encrypt_blocks<1>(key_, x);
      out[i] = x[0];
    }
  }

  block next() {
    block b;
    fill(&b, 1);
    return b;
  }

  uint64_t counter() const { return counter_; }
  const AesKey& key() const { return key_; }
  // Skips n blocks of the stream (a caller that produced them itself: block i of the stream is
  // AES_key(counter + i) with the counter in the low qword).
  void advance(uint64_t n) { counter_ += n; }

 private:
  AesKey key_;
  uint64_t counter_ = 0;
};

}  // namespace gc
