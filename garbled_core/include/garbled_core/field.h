// Arithmetic in a prime field F_p, p odd and below 2^62, for the providers' norm proofs
// (spgc.norm_proof): Montgomery multiplication (R = 2^64) on plain uint64 values, the number
// theoretic transform over rows, matrix-vector products, and the pseudorandom vectors the
// proofs draw from a 16-byte seed. Values cross the API in plain form, in [0, p): only twiddles
// and multipliers are kept in Montgomery form, since mont_mul(x, yR) = x*y.
//
// Why p < 2^62: two reduced values add without overflow, a Montgomery product's intermediate
// T + m*p stays under 2^127, and 16 raw products fit a 128-bit accumulator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace gc {

using u128 = unsigned __int128;

class PrimeField {
 public:
  explicit PrimeField(uint64_t p) : p_(p) {
    if (p < 3 || (p & 1) == 0 || p >= (uint64_t{1} << 62)) {
      throw std::invalid_argument("field modulus must be odd, at least 3 and below 2^62");
    }
    uint64_t inv = p;  // Newton's iteration for p^-1 mod 2^64 (p * p = 1 mod 8 to start)
    for (int i = 0; i < 5; ++i) inv *= 2 - p * inv;
    neg_inv_ = ~inv + 1;
    uint64_t r1 = (uint64_t)(((u128)1 << 64) % p);
    r2_ = (uint64_t)((u128)r1 * r1 % p);
  }

  uint64_t modulus() const { return p_; }

  uint64_t add(uint64_t a, uint64_t b) const {
    uint64_t s = a + b;
    return s >= p_ ? s - p_ : s;
  }
  uint64_t sub(uint64_t a, uint64_t b) const { return a >= b ? a - b : a + p_ - b; }

  // T * 2^-64 mod p, for T < p * 2^64.
  uint64_t redc(u128 t) const {
    uint64_t m = (uint64_t)t * neg_inv_;
    uint64_t u = (uint64_t)((t + (u128)m * p_) >> 64);
    return u >= p_ ? u - p_ : u;
  }
  // a * b * 2^-64 mod p: with b in Montgomery form (b = yR), the plain product a * y.
  uint64_t mont_mul(uint64_t a, uint64_t b) const { return redc((u128)a * b); }
  uint64_t to_mont(uint64_t a) const { return mont_mul(a, r2_); }
  uint64_t mul(uint64_t a, uint64_t b) const { return mont_mul(a, to_mont(b)); }

  uint64_t pow(uint64_t a, uint64_t e) const {
    uint64_t base = to_mont(a), acc = to_mont(1);
    for (; e; e >>= 1) {
      if (e & 1) acc = mont_mul(acc, base);
      base = mont_mul(base, base);
    }
    return redc(acc);
  }

 private:
  uint64_t p_, neg_inv_, r2_;
};

// In place over `rows` rows of n values each (row-major): row r becomes its transform
// X_k = sum_j x_j w^(jk), w a primitive n-th root of unity mod p, n a power of two. The inverse
// transform is the same call with w^-1, followed by a multiplication by n^-1.
void ntt_rows(const PrimeField& f, uint64_t* values, size_t rows, size_t n, uint64_t root);

// out[r] = sum_j m[r][j] * v[j] mod p over `rows` rows of n values.
void matvec(const PrimeField& f, const uint64_t* m, size_t rows, size_t n, const uint64_t* v,
            uint64_t* out);

// out[i] = a[i] * b[i] mod p (b_stride 0: one multiplier b[0] for all).
void mul_vectors(const PrimeField& f, const uint64_t* a, const uint64_t* b, size_t b_stride,
                 size_t n, uint64_t* out);

// n uniform elements of [0, p) from the AES-CTR stream of `seed` (prg.h): 64-bit little-endian
// words masked to bit_length(p) bits, those >= p skipped, in stream order.
void expand_field_elements(const PrimeField& f, const uint8_t seed[16], size_t n, uint64_t* out);

// The norm proofs' wraparound checks: out[k] = <z_k, x> mod p for k < reps, where z_0, z_1, ...
// are consecutive length-n runs of the AES-CTR stream of `seed` read two bits at a time, low
// bits of each byte first: 00 -> -1, 11 -> +1, 01 and 10 -> 0.
void wraparound_dots(const PrimeField& f, const uint64_t* x, size_t n, const uint8_t seed[16],
                     size_t reps, uint64_t* out);

}  // namespace gc
