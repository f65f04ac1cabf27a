// Authenticated AND triples: layer 2 of docs/MALICIOUS.md, its non-linear part. A triple is
// three authenticated XOR-shared bits (auth_bits.h) [a], [b], [c] with c = a AND b, made so
// that a party that deviates is caught (PeerDeviated) or learns nothing, except with
// probability at most 2^-rho.
//
// Two steps, after the leaky AND and its bucketing of Wang, Ranellucci and Katz (authenticated
// garbling, CCS 2017; the multi-party form, ePrint 2017/189, Figures 8 and 9), written here for
// two parties P, Q with global keys Delta_P, Delta_Q:
//
// 1. Leaky AND (leaky()). From random shares [x], [y], [r]:
//    a. half AND: P draws bits s and sends, per triple, lsb H1(K_P[x_Q]) ^ s and
//       lsb H1(K_P[x_Q] ^ Delta_P) ^ s ^ y_P; Q keeps the one its MAC on x_Q opens, t = s ^
//       x_Q y_P. With both directions, v_P = s_P ^ t_P gives v_P ^ v_Q = x_P y_Q ^ x_Q y_P, and
//       z_P = x_P y_P ^ v_P are XOR shares of z = x y.
//    b. z is authenticated through r: each sends e_P = z_P ^ r_P, its share becomes r_P ^ e_P
//       (= z_P) and the peer moves its key by e_P Delta.
//    c. the check, under Delta = Delta_P ^ Delta_Q, which neither party knows: with
//       Psi_P = y_P Delta_P ^ K_P[y_Q] ^ M_P[y_P] (so Psi_P ^ Psi_Q = y Delta), P sends
//       U_P = H2(K_P[x_Q]) ^ H2(K_P[x_Q] ^ Delta_P) ^ Psi_P (with its MAC on x_Q, Q turns it
//       into H2(K_P[x_Q]) ^ x_Q Psi_P), and both compute
//         G_P = x_P Psi_P ^ z_P Delta_P ^ H2(K_P[x_Q]) ^ H2(M_P[x_P]) ^ x_P U_Q ^ K_P[z_Q] ^ M_P[z_P],
//       for which G_P ^ G_Q = (x y ^ z) Delta. Each sends a tagged SHA-256 of its G values (of
//       a whole batch, after its last chunk) and checks the peer's against its own: equal G
//       for every triple, or PeerDeviated. All of
//       this runs on the low 72 bits of each value (the projection is linear, and U travels as
//       9 bytes): a wrong z passes only with a guess of the joint Delta's 71 unknown low bits
//       (2^-71 a triple; lsb(Delta) is 1 for both, 0 for the joint). A party that sends a wrong U
//       moves the peer's G by x_peer times its error, and passes only when it guessed that bit
//       of the peer: the triple is right, and leaks x_peer (the "leaky" in leaky AND), with
//       probability 1/2 of being caught for each such guess.
//    H1, H2: a tweakable correlation-robust hash from fixed-key AES (the key agreed by a coin
//    toss), tweaks naming the purpose, the owner of the x bit and the triple, never reused.
//
// 2. Bucketing (make()). B * n leaky triples, permuted by a coin toss made after the leaky
//    check passed (so the cheater fixed its guesses before the permutation), in n buckets of B.
//    A bucket combines into one triple that leaks only when all B of its x leaked: with d_j =
//    y_1 ^ y_j opened (checked), a = x_1 ^ .. ^ x_B, b = y_1, c = XOR_j (z_j ^ d_j x_j)
//    (z_j ^ d_j x_j = x_j y_1). A cheater that attacks t triples passes the leaky checks with
//    probability 2^-t and then wins only if some bucket holds only attacked triples:
//      P[win] <= max_t 2^-t * n * C(t, B) / C(n B, B);
//    bucket_size() picks the smallest B for which this is at most 2^-rho.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "garbled_core/auth_bits.h"
#include "garbled_core/block.h"
#include "garbled_core/sha256.h"

namespace gc {

struct AuthTriples {
  AuthShares a, b, c;  // c = a AND b
  size_t size() const { return a.size(); }
  // Triples [begin, begin + count) (a copy); `more` appended.
  AuthTriples slice(size_t begin, size_t count) const;
  void append(const AuthTriples& more);
};

// log2 of the bound above for n buckets of size B (<= 0).
double bucketing_error_log2(size_t n, size_t bucket);
// The smallest bucket size (2 .. 64) with bucketing_error_log2(n, B) <= -rho.
size_t bucket_size(size_t n, int rho);

// A coin both parties agree on and neither can steer (the first commits with SHA-256, the
// second answers with its coin, the first opens): PeerDeviated if the opening does not match.
block coin_toss(AuthParty& party, const char* purpose);

// Fault injection for tests: a party that deviates in the leaky AND. Never set outside tests.
struct TripleDeviation {
  // The half-AND bits (two per triple: h0, h1) and the U blocks, before they are sent.
  void (*messages)(std::vector<uint8_t>& half_and, BlockVector& u, void* context) = nullptr;
  // The e bits (z_P ^ r_P) before they are sent.
  void (*z_corrections)(std::vector<uint8_t>& e, void* context) = nullptr;
  // This party's check values G before their digest is sent.
  void (*check)(BlockVector& g, void* context) = nullptr;
  // An honest party's test observer: its own x bits of the batch, before the check.
  void (*observe_x)(const std::vector<uint8_t>& x, void* context) = nullptr;
  void* context = nullptr;
};

// The cheaters of the tests, as TripleDeviation hooks (context: the TripleCheat, which must
// outlive the run). Never used outside tests.
struct TripleCheat {
  enum class Kind { None, UError, HalfAndFlip, CorrectionFlip, CheckFlip };
  Kind kind = Kind::None;
  size_t index = 0;      // the leaky triple attacked (counted over the batch's chunks)
  block error{};         // UError: XORed into U[index]
  int guess = -1;        // UError: the peer's x bit guessed (0 / 1): G[index] ^= guess * error
  size_t seen_messages = 0, seen_corrections = 0, seen_checks = 0;  // the batch's so far
  TripleDeviation hooks();
};

class TripleFactory {
 public:
  explicit TripleFactory(AuthParty& party);

  // n leaky triples (step 1): correct, but each x_peer may have leaked to a cheater.
  AuthTriples leaky(size_t n);
  // n triples (step 2) at statistical security rho (the leaky ones made in chunks of
  // kLeakyChunk, so that the leaky AND's temporaries stay bounded).
  static constexpr size_t kLeakyChunk = size_t(1) << 19;
  AuthTriples make(size_t n, int rho);

  size_t last_bucket_size() const { return last_bucket_; }
  uint64_t leaky_made() const { return leaky_made_; }
  void deviate_for_test(TripleDeviation d) { deviation_ = d; }

 private:
  // The leaky AND in chunks (auth_triples.cpp): a chunk's first message (leaky_start), its
  // corrections from the peer's (leaky_respond), its shares and check values from the peer's
  // corrections (leaky_finish); leaky_batch interleaves chunks so that a batch takes one
  // exchange a chunk, plus one, plus the checks' comparison (check_batch), and hands each
  // finished chunk (its first triple's index, the chunk) to `keep`.
  struct LeakyChunk;
  struct LeakyCheck {
    explicit LeakyCheck(bool first_party);
    Sha256 ours, expected;  // over this party's G values, as it and as the peer tags them
  };
  LeakyChunk leaky_start(size_t n);
  void leaky_respond(LeakyChunk& c, const uint8_t* heard);
  void leaky_finish(LeakyChunk& c, const uint8_t* peer_e, LeakyCheck& check);
  void check_batch(LeakyCheck& check);
  template <typename Keep>
  void leaky_batch(size_t total, Keep keep);

  AuthParty& party_;
  block hash_key_seed_{};
  bool keyed_ = false;
  uint64_t next_tweak_ = 0;  // triples hashed so far: tweaks are never reused
  size_t last_bucket_ = 0;
  uint64_t leaky_made_ = 0;
  TripleDeviation deviation_;
};

}  // namespace gc
