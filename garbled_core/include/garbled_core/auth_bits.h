// Authenticated XOR shares of bits (the information-theoretic MACs of TinyOT, Nielsen,
// Nordholt, Orlandi and Burra, CRYPTO 2012, and of authenticated garbling, Wang, Ranellucci
// and Katz, CCS 2017): layer 2 of docs/MALICIOUS.md, its linear part.
//
// Each party P has a global key Delta_P (lowest bit 1). For share i, P holds
//   its bit x_P[i], the MAC of it under the peer's key:  M_P[i] = K_Q[i] ^ x_P[i] * Delta_Q,
//   the key of the peer's bit under its own key:         K_P[i]  (M_Q[i] = K_P[i] ^ x_Q[i] * Delta_P),
// and the value is x = x_A ^ x_B. A COT with the peer as sender is exactly one such MAC (the
// receiver's choice is its bit, its label the MAC, the sender's label the key), so random
// shares come from one COT each way, from a maliciously secure COT source (AuthCots): silent
// OT with Ferret's malicious check (silent_ot.h; the default, under a bit per COT) or IKNP
// with KOS's check (iknp.h; 16 bytes per COT each way, no LPN assumption).
//
// XOR of two shares and XOR with a public bit are local (for a public bit c, the first party
// flips its bit and the second XORs c * Delta into its key, so every MAC still holds). Opening
// is checked: each party sends its bits and SHA-256 of its MACs on them; each recomputes the
// MACs it expects, K_P[i] ^ x_Q[i] * Delta_P, and refuses (PeerDeviated) unless the digests
// match. A party that opens a flipped bit must send the MAC ^ Delta of the other party's key,
// so it passes with probability 2^-127 (Delta's 127 secret bits). AND gates use authenticated
// triples (auth_triples.h).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "garbled_core/block.h"
#include "garbled_core/channel.h"
#include "garbled_core/sha256.h"
#include "garbled_core/silent_ot.h"

namespace gc {

// Bits (one byte each, 0 or 1) packed LSB first, 8 to a byte, as they travel; and back.
std::vector<uint8_t> pack_bits(const std::vector<uint8_t>& bits);
std::vector<uint8_t> unpack_bits(const std::vector<uint8_t>& packed, size_t n);

struct AuthShares {
  std::vector<uint8_t> bits;  // x_P[i], one byte (0 or 1) per share
  BlockVector macs;           // M_P[i]
  BlockVector keys;           // K_P[i]
  size_t size() const { return bits.size(); }
};

// Where the COTs behind random shares come from (both parties must use the same).
enum class AuthCots : uint8_t { Silent = 0, Iknp = 1, SilentTestOnly = 2 };
const char* auth_cots_name(AuthCots c);

class AuthParty {
 public:
  // first: the party that flips its bit for a public constant (both must disagree). Delta is
  // drawn from the CSPRNG; a test may give it (lowest bit set) to play a cheater who knows it.
  AuthParty(Channel& ch, bool first, const block* delta_for_test = nullptr, AuthCots cots = AuthCots::Silent);
  ~AuthParty();
  AuthCots cots() const { return cots_; }
  // COTs this party received (= sent) for random shares so far, one each way per share.
  uint64_t cots_used() const { return cots_used_; }
  block delta() const { return delta_; }
  bool first() const { return first_; }
  Channel& channel() { return ch_; }

  // n random authenticated shares (x uniform, each party's bit uniform and private).
  AuthShares random(size_t n);
  // Shares of the given public bits (no communication: the first party holds them).
  AuthShares constant(const std::vector<uint8_t>& values) const;
  // a ^ b, and a ^ c for public bits c (local).
  static AuthShares xor_shares(const AuthShares& a, const AuthShares& b);
  AuthShares xor_public(const AuthShares& a, const std::vector<uint8_t>& c) const;
  // Shares [begin, begin + count) of s (a copy); `from` appended to `to`.
  static AuthShares slice(const AuthShares& s, size_t begin, size_t count);
  static void append(AuthShares& to, const AuthShares& from);
  // The values x, checked (PeerDeviated unless the peer's bits carry their MACs).
  std::vector<uint8_t> open(const AuthShares& s);

  // Everything the peer sent that the authenticated protocols read through log_received
  // (openings, triple messages, check digests): its SHA-256 is the evidence an honest party
  // keeps when it catches the peer. evidence() returns it and starts a new one.
  void log_received(const void* data, size_t n) { received_->update(data, n); }
  // Both parties at once: sends ours (n bytes), reads theirs (m bytes), logs what it read (the
  // channel reads while it waits to write, so both may send long messages together).
  void exchange(const void* ours, size_t n, void* theirs, size_t m);
  std::array<uint8_t, 32> evidence();

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
  AuthCots cots_;
  uint64_t cots_used_ = 0;
  // Silent sources, made and set up on the first random() (one per direction).
  std::unique_ptr<SilentCotSender> silent_sender_;
  std::unique_ptr<SilentCotReceiver> silent_receiver_;
  Deviation deviation_;
  std::unique_ptr<Sha256> received_ = std::make_unique<Sha256>();
};

// Checks many openings at once (the deferred MAC check of SPDZ-style protocols): each party
// records the MAC of every bit it sent and the MAC it expects of every bit it received, in the
// same order on both sides, and one exchange of SHA-256 digests checks them all. Nothing that
// depends on the opened values may be revealed before verify() returned.
class DeferredMacCheck {
 public:
  explicit DeferredMacCheck(AuthParty& party);
  void sent(block mac) { push(sent_buf_, sent_used_, sent_, mac); }
  // The peer opened `bit` of a share whose key we hold.
  void received(block key, bool bit) {
    push(expected_buf_, expected_used_, expected_, xor_block(key, and_block(party_.delta(), select_mask(bit))));
  }
  // Sends our digest, reads the peer's and compares (PeerDeviated naming `what` on a
  // mismatch). Both parties call it at the same point.
  void verify(const char* what);
  // Our digest (what verify() sends) without exchanging it: a party that sends it with
  // another message (AuthParty::exchange, which logs it) calls this, then check_peer() on the
  // digest it read.
  std::array<uint8_t, 32> our_digest();
  void check_peer(const std::array<uint8_t, 32>& theirs, const char* what);

 private:
  static constexpr size_t kBuffered = 4096;  // blocks hashed at once
  static void push(BlockVector& buf, size_t& used, Sha256& h, block b) {
    buf[used++] = b;
    if (used == kBuffered) flush(buf, used, h);
  }
  static void flush(BlockVector& buf, size_t& used, Sha256& h) {
    h.update(buf.data(), used * sizeof(block));
    used = 0;
  }
  AuthParty& party_;
  BlockVector sent_buf_{kBuffered}, expected_buf_{kBuffered};
  size_t sent_used_ = 0, expected_used_ = 0;
  Sha256 sent_, expected_;
};

}  // namespace gc
