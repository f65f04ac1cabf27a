// Authenticated XOR shares of bits (the information-theoretic MACs of TinyOT, Nielsen,
// Nordholt, Orlandi and Burra, CRYPTO 2012, and of authenticated garbling, Wang, Ranellucci
// and Katz, CCS 2017): layer 2 of docs/MALICIOUS.md, its linear part.
//
// Each party P has a global key Delta_P (lowest bit 1). For share i, P holds
//   its bit x_P[i], the MAC of it under the peer's key:  M_P[i] = K_Q[i] ^ x_P[i] * Delta_Q,
//   the key of the peer's bit under its own key:         K_P[i]  (M_Q[i] = K_P[i] ^ x_Q[i] * Delta_P),
// and the value is x = x_A ^ x_B. A COT with the peer as sender is exactly one such MAC (the
// receiver's choice is its bit, its label the MAC, the sender's label the key), so random
// shares come from one COT each way (here IKNP with KOS's check, iknp.h).
//
// XOR of two shares and XOR with a public bit are local (for a public bit c, the first party
// flips its bit and the second XORs c * Delta into its key, so every MAC still holds). Opening
// is checked: each party sends its bits and SHA-256 of its MACs on them; each recomputes the
// MACs it expects, K_P[i] ^ x_Q[i] * Delta_P, and refuses (PeerDeviated) unless the digests
// match. A party that opens a flipped bit must send the MAC ^ Delta of the other party's key,
// so it passes with probability 2^-127 (Delta's 127 secret bits). AND gates need authenticated
// triples (layer 2's other part, not built).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "garbled_core/block.h"
#include "garbled_core/channel.h"

namespace gc {

struct AuthShares {
  std::vector<uint8_t> bits;  // x_P[i], one byte (0 or 1) per share
  BlockVector macs;           // M_P[i]
  BlockVector keys;           // K_P[i]
  size_t size() const { return bits.size(); }
};

class AuthParty {
 public:
  // first: the party that flips its bit for a public constant (both must disagree). Delta is
  // drawn from the CSPRNG; a test may give it (lowest bit set) to play a cheater who knows it.
  AuthParty(Channel& ch, bool first, const block* delta_for_test = nullptr);
  block delta() const { return delta_; }

  // n random authenticated shares (x uniform, each party's bit uniform and private).
  AuthShares random(size_t n);
  // Shares of the given public bits (no communication: the first party holds them).
  AuthShares constant(const std::vector<uint8_t>& values) const;
  // a ^ b, and a ^ c for public bits c (local).
  static AuthShares xor_shares(const AuthShares& a, const AuthShares& b);
  AuthShares xor_public(const AuthShares& a, const std::vector<uint8_t>& c) const;
  // The values x, checked (PeerDeviated unless the peer's bits carry their MACs).
  std::vector<uint8_t> open(const AuthShares& s);

  // Fault injection for tests, a party that deviates when it opens: `opening` may change the
  // bits and MACs it is about to send. Never set outside tests.
  struct Deviation {
    void (*opening)(std::vector<uint8_t>& bits, BlockVector& macs, void* context) = nullptr;
    void* context = nullptr;
  };
  void deviate_for_test(Deviation d) { deviation_ = d; }

 private:
  Channel& ch_;
  bool first_;
  block delta_;
  Deviation deviation_;
};

}  // namespace gc
