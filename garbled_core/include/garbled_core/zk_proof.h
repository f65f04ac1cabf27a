// Zero-knowledge proofs of circuit statements over authenticated bits: the proof of QuickSilver
// (Yang, Weng, Lan, Zhang and Wang, CCS 2021) for circuits over GF(2), on the IT-MACs of
// auth_bits.h. Layer 2b of docs/MALICIOUS.md: a server proves what it computed from its own
// secrets (its noise seed's commitment and expansion) without the cost of a two-party
// computation: about one COT and one bit per AND gate, against an authenticated triple's
// tens of bytes.
//
// The prover P holds every wire value w of its circuit with a MAC under the verifier V's global
// key, M_w = K_w ^ w Delta, V holding the key K_w:
//   - a private input bit x: a fresh random authenticated bit r of P (one COT), P sends x ^ r
//     and V moves its key by (x ^ r) Delta;
//   - a public bit c: M = 0, K = c Delta; XOR is local; NOT flips P's bit and adds Delta to K;
//   - AND (a, b -> c): a fresh random authenticated bit r, P sends c ^ r. In GF(2^128),
//       B = K_a K_b ^ K_c Delta = A0 ^ A1 Delta ^ (a b ^ c) Delta^2,
//       A0 = M_a M_b,  A1 = a M_b ^ b M_a ^ M_c,
//     so B is linear in Delta exactly when the gate is right.
//   - the check, once per batch of AND gates: after P has sent every correction of the batch,
//     V draws a coin that expands (AES-CTR) to chi_i, one element per AND gate; P answers
//     U = sum chi_i A0_i ^ M* and W = sum chi_i A1_i ^ v*, masked by a random authenticated
//     element (128 random bits u_j of P: v* = sum u_j X^j, M* = sum M_j X^j, V's K* likewise),
//     and V checks sum chi_i B_i ^ K* = U ^ W Delta.
//   - opened outputs: P sends the bits, and at the end SHA-256 of their MACs; V compares it with
//     SHA-256 of K ^ b Delta. Kept outputs stay authenticated: AuthShares holding P's bits (P:
//     bits and MACs; V: keys), a sharing [x] = (x, 0) that any authenticated protocol on the same
//     AuthParty takes as it is.
//
// Soundness, per batch: a set S of wrong AND gates passes only if sum_{i in S} chi_i = 0
// (2^-128: the coin is drawn after every correction it weighs; a prover that knew it first
// could pick S by linear algebra, as the tests show) or if U and W meet the Delta^2 term, a
// polynomial of degree 2 in V's Delta (2^-127). A wrong opened bit passes with a guess of
// Delta (2^-127). Zero knowledge: every correction is one-time padded by a random bit, and U, W
// by the random element.
//
// Both parties prove at once (each is the other's verifier): one random share gives P's bit
// and MAC for its own proof and V's key for the peer's. Message j carries the coin for the
// peer's batch j - 1 (drawn once that batch is in), the answer to the coin for one's batch
// j - 2 and one's batch j; the first also states both statements (a digest), the last the
// opened outputs' digests: B batches take B + 2 exchanges, and the prover holds two batches'
// A0 and A1 at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "garbled_core/auth_bits.h"
#include "garbled_core/circuit.h"

namespace gc {

// One party's statement: a circuit over n instances. Input ports owned by the garbler are
// private (the prover's values; the verifier's copy has none), ports owned by the evaluator
// are public (both hold the same values), carried ports read bits already authenticated: the
// kept outputs of an earlier proof (the prover's bits and MACs, the verifier's keys), so
// statements chain without a gap (a seed's commitment, then its expansion). A broadcast port
// takes one value in every instance (a private one is authenticated once, so every instance
// reads the same bits: a key shared by many blocks). Output ports: Reveal::Both opens to the
// verifier (checked), Reveal::Keep stays authenticated; any other kind is refused.
struct ProofStatement {
  const Circuit* circuit = nullptr;
  size_t n = 0;
  std::vector<std::vector<uint64_t>> values;  // per input port: n values, 1 when broadcast
  std::vector<bool> broadcast;                 // per input port
  // Per input port, carried ports only: entry k * m + i for bit k of instance i (m = n, or 1
  // when broadcast), as ProofResult::kept holds them.
  std::vector<const AuthShares*> carried;
};

struct ProofResult {
  // Per output port: n values for Reveal::Both (the prover's own, or what the verifier
  // checked), empty otherwise.
  std::vector<std::vector<uint64_t>> opened;
  // Per output port, Reveal::Keep: entry k * n + i for bit k of instance i (the prover's bits
  // and MACs, zero keys; or the verifier's keys, zero bits and MACs). Empty otherwise.
  std::vector<AuthShares> kept;
};

// Test hooks, a prover that deviates (never set outside tests):
//   FlipAnd: the AND gate `index` (in the order the proof evaluates them: gate by gate, each
//     over the batch's instances) outputs the wrong bit; `offset` is XORed into the batch's W
//     times chi_index (the compensation a prover that knew V's Delta would make).
//   FlipOpened: opened bit `index` flipped, `offset` XORed into its MAC.
//   ForgeWithEarlyCoin: flip a set of AND gates among the first 129 of each batch whose chi sum
//     to zero: from the verifier's coin when it comes first (coin_first_for_test on both sides),
//     else from a guess of it.
//   MisstateLength: the first message states the right statements' digest (public) and a
//     length `index` bytes off the message's (sending those extra bytes).
struct ProofCheat {
  enum class Kind { None, FlipAnd, FlipOpened, ForgeWithEarlyCoin, MisstateLength };
  Kind kind = Kind::None;
  size_t index = 0;
  block offset{};
};

class ZkProofs {
 public:
  // AND gates (over all instances) a batch checks at once: the prover keeps 32 bytes for each
  // until the coin comes (two batches at a time), the verifier 16 bytes (one batch).
  static constexpr size_t kAndsPerBatch = size_t(1) << 20;

  explicit ZkProofs(AuthParty& party) : party_(party) {}

  // Both parties at once: proves `mine` to the peer and checks the peer's statement `theirs`
  // (its public values and shape; the peer's private values are not known). Either may have
  // n = 0 (a one-way proof). Returns (what this party holds of its own proof, what it checked
  // of the peer's). PeerDeviated when the peer's proof fails; ProtocolError when the two
  // parties disagree on the statements' shapes.
  std::pair<ProofResult, ProofResult> run(const ProofStatement& mine, const ProofStatement& theirs);

  uint64_t ands_proved() const { return ands_proved_; }
  uint64_t batches() const { return batches_; }

  void cheat_for_test(ProofCheat c) { cheat_ = c; }
  // A verifier that draws its coin before the prover's corrections (both sides must set it):
  // the control that shows why the coin must come after.
  void coin_first_for_test() { coin_first_ = true; }

 private:
  AuthParty& party_;
  ProofCheat cheat_;
  bool coin_first_ = false;
  uint64_t ands_proved_ = 0, batches_ = 0;
};

// Instances per batch for a circuit of `ands` AND gates (at least 1).
size_t proof_batch_instances(uint64_t ands);

}  // namespace gc
