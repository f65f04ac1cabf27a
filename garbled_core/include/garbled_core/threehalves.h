// Three-halves garbling (Rosulek-Roy, CRYPTO 2021): free-XOR compatible AND
// gates at 1.5 kappa + 5 bits, 3 half-blocks (24 bytes) plus 5 control bits
// per AND gate, against half-gates' 32 bytes.
//
// Labels are cut into a left (low 64 bits) and right (high 64 bits) half.
// The evaluator, holding A and B with colour bits i and j, hashes A, B and
// A ^ B (one 64-bit half and one control bit of each hash), decodes two bits
// r1, r2 from the 5 control bits z, forms the 2 x 4 bit matrix
// R = Rp[ij] ^ r1 S1 ^ r2 S2 and computes
//   C_L = i G0 ^ (i ^ j) G2 ^ hA ^ hX ^ R_L . (A_L, A_R, B_L, B_R)
//   C_R = j G1 ^ (i ^ j) G2 ^ hB ^ hX ^ R_R . (A_L, A_R, B_L, B_R).
// The garbler draws two coins per gate and instance that select which
// matrices it makes the evaluator use, so the R the evaluator decodes is
// uniform in Rp[ij] + span(S1, S2) whatever the permute bits are. The
// constants come from scripts/derive_threehalves.py (threehalves_tables.inc),
// which derives them by GF(2) linear algebra and checks every case.
//
// Hash: the same tweakable correlation-robust hash as half-gates,
// H(x, tweak) = AES_{salt ^ tweak}(x) ^ x, with one key per (run, AND gate,
// group of 8 instances, which of A / B / A^B), so a key again serves at most
// 16 hash inputs when garbling. The garbler makes 6 hash calls per AND, the
// evaluator 3.
//
// Table layout for one gate over a span of n instances: first the 64-bit
// halves, per group of up to 8 instances the group's G0 rows, G1 rows and G2
// rows; then the control bits, 5 per instance (bit 5 k + t of the bit string
// is z_t of instance k), packed LSB-first into ceil(5 n / 8) bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "garbled_core/block.h"

namespace gc {

// Bytes of one AND gate's table over n instances.
constexpr size_t threehalves_table_bytes(size_t n) { return 24 * n + (5 * n + 7) / 8; }

// The garbler's Delta-dependent constants: the Delta part of each of the 16 cases' output
// pairs. Delta is fixed for a session, so a garbler builds this once, not per gate.
struct ThreeHalvesDelta {
  explicit ThreeHalvesDelta(block delta);
  block delta;
  block out[16][3];
  alignas(64) uint64_t lo[3 * 16], hi[3 * 16];  // the same by output pair p: [16 p + q]
  // The VAES kernel hashes without the feed-forward x of H(x) = AES(x) ^ x and adds it back
  // here: hA0 ^ hA1, hB0 ^ hB1 and hX0 ^ hX1 each carry one Delta, so [G0 | G1] gets
  // [Delta_L | Delta_L] and G2 Delta_L; the Delta_R parts land in control bits z2, z3, z4.
  alignas(64) uint64_t vlo[3 * 16], vhi[3 * 16];
  uint64_t vz = 0;
};

// Garbles n instances: a0 / b0 are the zero-labels of the inputs, c0 receives
// the zero-label of the output (c0 may alias a0 or b0), table receives
// threehalves_table_bytes(n) bytes. coins holds 2 fresh random bits per
// instance (bits 2k, 2k + 1 of the LSB-first string, ceil(n / 4) bytes).
// first_instance must be a multiple of 8.
void garble_and_threehalves(const block* a0, const block* b0, block* c0, uint8_t* table, size_t n,
                            uint64_t first_instance, const ThreeHalvesDelta& delta, block salt,
                            uint64_t tweak, const uint8_t* coins);

// Evaluates n instances from the active labels a, b and the gate's table.
void eval_and_threehalves(const block* a, const block* b, block* c, const uint8_t* table, size_t n,
                          uint64_t first_instance, block salt, uint64_t tweak);

}  // namespace gc
