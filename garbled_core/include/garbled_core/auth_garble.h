// Authenticated garbling: layer 3b of docs/MALICIOUS.md, the two-party protocol of Wang,
// Ranellucci and Katz (CCS 2017, "Authenticated Garbling and Efficient Maliciously Secure
// Two-Party Computation", Figure 3 with the authenticated AND triples of auth_triples.h). The
// run interface is AuthSession's (the same inputs, outputs, Kept values and checks as
// authenticated GMW); the gates are garbled by H1 (party 0, A) and evaluated by H2 (party 1,
// B) in a constant number of round trips, whatever the circuit's depth.
//
// Every wire w carries an authenticated mask [l_w] = (l_A, l_B); B learns z_w = x_w ^ l_w and
// the label L_{w,z_w} = L_{w,0} ^ z_w Delta_A, where Delta_A is A's MAC key (auth_bits.h): so
// B's label is a MAC on z_w under A's key L_{w,0}, and [x_w] = (l_A, z_w ^ l_B) is an
// authenticated sharing again (MAC and key of z_w ^ l_B: M_B[l_B] ^ L_{w,z}, K_A[l_B] ^
// L_{w,0}). Inputs enter as AuthSession's shares [x] = (a, b): l = (a, 0), z = b, L_{w,0} =
// K_A[b], L_{w,z} = M_B[b]. XOR and NOT are local (masks, z and labels follow; NOT flips l).
//
// Per AND gate (u, v -> w), per instance, in chunks of instances:
//   1. l_w: a fresh random authenticated bit; [l_u l_v] from a triple ([a], [b], [c]): d =
//      l_u ^ a, e = l_v ^ b opened (one message each way for every gate of the chunk: the
//      masks of XOR wires are XORs of earlier ones, so all are known before any table), MACs
//      into the deferred check.
//   2. For the four rows (alpha, beta): [r_ab] = [l_u l_v] ^ alpha [l_v] ^ beta [l_u] ^ [l_w] ^
//      alpha beta, the masked output z_w when z_u = alpha and z_v = beta. A sends
//        G_ab = H(L_{u,alpha}, L_{v,beta}, row) ^ (r_ab^A, M_A[r_ab^A], L_{w,0} ^ r_ab^A Delta_A ^ K_A[r_ab^B]).
//   3. B decrypts row (z_u, z_v), checks the MAC of r^A against its key (PeerDeviated: a table
//      that does not compute the agreed circuit's gate), and gets z_w = r^A ^ r^B and L_{w,z_w}
//      = (third part) ^ M_B[r^B].
// A learns nothing (it receives only the openings of step 1, one-time padded by the triples);
// a wrong row is caught whenever B uses it, and whether B uses it depends on z values that are
// uniform to A (l_B), so an abort tells A nothing of the inputs (WRK17, Theorem 1).
//
// H(L_u, L_v, row) = H'(L_u, t_u) ^ H'(L_v, t_v) with H'(x, t) = pi(pi(x) ^ t) ^ pi(x), the
// tweakable circular correlation robust hash of Guo, Katz, Wang, Weng and Yu (S&P 2020) over
// fixed-key AES (the key a coin toss of the session), tweaks naming the run, gate, instance,
// row, output block and side, never reused. Rows carry the high 64 bits of the MAC: r^A is
// forged only with a guess of 64 bits of Delta_B (2^-64; B stops at the first failure).
// Row reduction: L_{w,0} is chosen so that row (0, 0)'s label part is the hash itself, and is
// not sent (pseudorandom to B unless it holds both input zero-labels, when it is its label).
// 81 bytes per AND gate and instance: row (0, 0)'s MAC, 3 rows of 16 + 8 bytes, the 4 bits r^A.
#pragma once

#include <cstddef>

#include "garbled_core/aes.h"
#include "garbled_core/auth_session.h"

namespace gc {

constexpr size_t kAuthMacBytes = 8;                          // a row's MAC: the high 64 bits
constexpr size_t kAuthRowBytes = 16 + kAuthMacBytes;         // a label part and a MAC
// Per AND gate and instance: row 0's MAC (its label part is zero: row reduction), rows 1 to 3,
// and the four bits r^A.
constexpr size_t kAuthTableBytes = kAuthMacBytes + 3 * kAuthRowBytes + 1;

class AuthGarbleParty : public AuthSession {
 public:
  AuthGarbleParty(Channel& ch, int party, int rho = kDefaultRho, AuthCots cots = AuthCots::Silent,
                  size_t triple_batch = kDefaultTripleBatch);
  ~AuthGarbleParty() override;

 protected:
  void evaluate(const Circuit& c, const GmwPlan& plan, AuthWires& w, DeferredMacCheck& check) override;
  void after_setup() override;

 private:
  AesKey hash_key_{};
  uint64_t rows_sent_ = 0;       // gate instances garbled so far in the run (test hook)
};

}  // namespace gc
