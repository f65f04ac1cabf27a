// Prime-field kernels of the norm proofs; see field.h.
#include "garbled_core/field.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "garbled_core/block.h"
#include "garbled_core/prg.h"

namespace gc {

namespace {

void bit_reverse(uint64_t* a, size_t n) {
  for (size_t i = 1, j = 0; i < n; ++i) {
    size_t bit = n >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
}

// Reads the AES-CTR stream of `seed` block by block into 16-byte chunks.
class StreamReader {
 public:
  explicit StreamReader(const uint8_t seed[16]) : prg_(load_block(seed)) {}
  // The next 64-bit little-endian word of the stream.
  uint64_t next_word() {
    if (pos_ == kWords) refill();
    return words_[pos_++];
  }

 private:
  static constexpr size_t kBlocks = 64, kWords = 2 * kBlocks;
  void refill() {
    block b[kBlocks];
    prg_.fill(b, kBlocks);
    std::memcpy(words_, b, sizeof(b));
    pos_ = 0;
  }
  Prg prg_;
  uint64_t words_[kWords];
  size_t pos_ = kWords;
};

}  // namespace

void ntt_rows(const PrimeField& f, uint64_t* values, size_t rows, size_t n, uint64_t root) {
  if (n == 0 || (n & (n - 1)) != 0) throw std::invalid_argument("NTT length must be a power of two");
  if (n == 1) return;
  // Twiddles of every stage, in Montgomery form: stage len uses w^(n/len * j), j < len/2,
  // stored from offset len/2 - 1 (n - 1 in all).
  std::vector<uint64_t> tw(n - 1);
  for (size_t len = 2; len <= n; len <<= 1) {
    uint64_t step = f.pow(root, n / len), w = 1;
    for (size_t j = 0; j < len / 2; ++j) {
      tw[len / 2 - 1 + j] = f.to_mont(w);
      w = f.mul(w, step);
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    uint64_t* a = values + r * n;
    bit_reverse(a, n);
    for (size_t len = 2; len <= n; len <<= 1) {
      const uint64_t* w = tw.data() + len / 2 - 1;
      for (size_t i = 0; i < n; i += len) {
        for (size_t j = 0; j < len / 2; ++j) {
          uint64_t u = a[i + j], v = f.mont_mul(a[i + j + len / 2], w[j]);
          a[i + j] = f.add(u, v);
          a[i + j + len / 2] = f.sub(u, v);
        }
      }
    }
  }
}

void matvec(const PrimeField& f, const uint64_t* m, size_t rows, size_t n, const uint64_t* v,
            uint64_t* out) {
  std::vector<uint64_t> vm(n);
  for (size_t j = 0; j < n; ++j) vm[j] = f.to_mont(v[j]);
  for (size_t r = 0; r < rows; ++r) {
    const uint64_t* row = m + r * n;
    uint64_t acc = 0;
    for (size_t j = 0; j < n; ++j) acc = f.add(acc, f.mont_mul(row[j], vm[j]));
    out[r] = acc;
  }
}

void mul_vectors(const PrimeField& f, const uint64_t* a, const uint64_t* b, size_t b_stride,
                 size_t n, uint64_t* out) {
  if (b_stride == 0) {
    uint64_t bm = f.to_mont(b[0]);
    for (size_t i = 0; i < n; ++i) out[i] = f.mont_mul(a[i], bm);
    return;
  }
  for (size_t i = 0; i < n; ++i) out[i] = f.mul(a[i], b[i * b_stride]);
}

void expand_field_elements(const PrimeField& f, const uint8_t seed[16], size_t n, uint64_t* out) {
  const uint64_t p = f.modulus();
  int bits = 64 - __builtin_clzll(p);
  const uint64_t mask = (bits == 64) ? ~uint64_t{0} : ((uint64_t{1} << bits) - 1);
  StreamReader stream(seed);
  for (size_t i = 0; i < n;) {
    uint64_t w = stream.next_word() & mask;
    if (w < p) out[i++] = w;  // accepted with probability p / 2^bits > 1/2
  }
}

// The stream's 2-bit draws, 32 to a 64-bit word, lowest first: 11 is +1, 00 is -1, else 0.
// A word's fields are split into two bit masks (the +1 draws and the -1 draws, a quarter of
// the draws each) and only their set bits are visited: about half the elements cost an add,
// against a mask, an and and an add for every element.
void wraparound_dots(const PrimeField& f, const uint64_t* x, size_t n, const uint8_t seed[16],
                     size_t reps, uint64_t* out) {
  constexpr uint64_t kLow = 0x5555555555555555ULL;  // bit 0 of every 2-bit field
  const uint64_t p = f.modulus();
  StreamReader stream(seed);
  uint64_t word = 0;
  unsigned left = 0;  // 2-bit draws left in `word` (its lowest fields)
  for (size_t k = 0; k < reps; ++k) {
    // Each x[i] < 2^62, so 2^66 of them fit a 128-bit sum: no reduction inside the loop.
    u128 plus = 0, minus = 0;
    for (size_t i = 0; i < n;) {
      if (left == 0) {
        word = stream.next_word();
        left = 32;
      }
      const unsigned take = (unsigned)std::min<size_t>(left, n - i);
      const uint64_t fields = take == 32 ? ~0ULL : (1ULL << (2 * take)) - 1;
      const uint64_t lo = word & kLow, hi = (word >> 1) & kLow;
      uint64_t up = lo & hi & fields;             // 11: +1
      uint64_t down = ~(lo | hi) & kLow & fields;  // 00: -1
      const uint64_t* xi = x + i;
      while (up) {
        plus += xi[__builtin_ctzll(up) >> 1];
        up &= up - 1;
      }
      while (down) {
        minus += xi[__builtin_ctzll(down) >> 1];
        down &= down - 1;
      }
      word = take == 32 ? 0 : word >> (2 * take);
      left -= take;
      i += take;
    }
    uint64_t a = (uint64_t)(plus % p), b = (uint64_t)(minus % p);
    out[k] = f.sub(a, b);
  }
}

}  // namespace gc
