// Authenticated GMW: layer 3a of docs/MALICIOUS.md. The two servers evaluate the same compiled
// gc::Circuit as GmwParty (gmw.h), with the same run interface (RunInputs, RunOutputs, Kept
// outputs carried into later runs), on authenticated XOR shares of every wire (auth_bits.h):
// each party's bit of a wire carries a MAC under the other party's Delta. A party that deviates
// in any message is caught (PeerDeviated) before anything computed from its messages is
// revealed, except with probability at most 2^-rho (the triples' bucketing) plus 2^-127 per
// check (a guess of the other's Delta).
//
// One run of n instances:
//   1. header: as every backend (circuit digest, n, run counter, carried inputs).
//   2. triples: and_count * n authenticated AND triples (auth_triples.h), taken from this
//      party's stock in batches of whole AND layers; the stock is made (both parties at the
//      same point: when a batch needs more than it holds) at least `triple_batch` at a time,
//      which sets the bucket size (3 from about 553,000 triples, 4 below) and keeps the
//      making's round trips out of most runs. Each triple is used once, by one run. Their COTs
//      come from silent OT with Ferret's malicious check (the default) or checked IKNP.
//   3. inputs: per input bit and instance a random shared [r]; the non-owner opens its r bit
//      to the owner (MAC recorded for the deferred check), the owner sends x ^ r, and [x] =
//      [r] ^ (x ^ r). Carried inputs are the authenticated shares a Keep output left.
//   4. gates, by AND-depth stage: XOR / NOT locally (MACs and keys follow); per AND layer one
//      message each way with the bits of d = u ^ a, e = v ^ b per gate and instance; every
//      MAC of an opened bit goes into the deferred check (auth_bits.h DeferredMacCheck); the
//      gate's shares are [c] ^ d [b] ^ e [a] ^ d e.
//   5. the deferred check: one digest each way over every opening of the run (inputs and
//      layers); a wrong bit anywhere is PeerDeviated here, before any output share is sent.
//   6. outputs: each party sends its bits of what the other learns with their MACs' digest
//      and checks the peer's (PeerDeviated); Shares gives each party its bit, Keep keeps the
//      authenticated shares.
// Roles as in GmwParty: party 0 is H1 (the "garbler" ports), party 1 H2 (the "evaluator").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "garbled_core/auth_bits.h"
#include "garbled_core/auth_triples.h"
#include "garbled_core/channel.h"
#include "garbled_core/circuit.h"
#include "garbled_core/session.h"

namespace gc {

constexpr int kDefaultRho = 40;  // statistical security of the triples' bucketing

// Fault injection for tests: a party that deviates in the evaluation. Never set outside tests.
struct AuthGmwDeviation {
  enum class Kind { None, FlipOpening, FlipWire, FlipOutput, FlipInputMask };
  Kind kind = Kind::None;
  size_t index = 0;        // which opened bit / wire entry / output bit / input-mask bit
  block mac_offset{};      // XORed into the MAC sent with a flipped bit (a guess of Delta)
};

class AuthGmwParty : public Session {
 public:
  // Triples made at once, at least (both parties must agree: the hello compares it).
  // 2^20: bucket size 3 at 2^-43.8 (3 from about 553,000 triples at the 2^-42 a batch needs).
  static constexpr size_t kDefaultTripleBatch = size_t(1) << 20;
  AuthGmwParty(Channel& ch, int party, int rho = kDefaultRho, AuthCots cots = AuthCots::Silent,
               size_t triple_batch = kDefaultTripleBatch);
  ~AuthGmwParty() override;
  int party() const { return party_; }
  int rho() const { return rho_; }
  void setup();
  RunOutputs run(const Circuit& c, const RunInputs& in);

  // SHA-256 of everything the peer sent in the last run (triple messages, openings, check
  // digests): the evidence an honest party keeps when it catches the peer.
  const std::array<uint8_t, 32>& evidence() const { return evidence_; }
  uint64_t triples_used() const { return triples_used_; }
  uint64_t leaky_triples_made() const;
  size_t last_bucket_size() const;
  size_t triples_in_stock() const { return stock_.size() - stock_used_; }
  // What making the stock cost so far (benchmarks charge a run its share per triple used):
  // triples made, the bytes of their own messages (both ways, phase "tables"), and the COTs
  // each way they took.
  uint64_t triples_made() const { return triples_made_; }
  uint64_t triple_bytes() const { return triple_bytes_; }
  uint64_t triple_cots() const { return triple_cots_; }
  size_t last_layers() const { return layers_; }
  // Over every run so far: AND-layer exchanges, and the COTs received (= sent) for the
  // authenticated shares (bench comm charges silent OT's bytes per COT against them).
  uint64_t layers_used() const { return layers_used_; }
  uint64_t ots_used() const { return auth_ ? auth_->cots_used() : 0; }

  void deviate_for_test(AuthGmwDeviation d) { deviation_ = d; }
  void deviate_triples_for_test(const TripleCheat& cheat);
  // Test only: this party's Delta, to hand to a cheater in a control test.
  block delta_for_test() const;

 private:
  int party_;
  int rho_;
  AuthCots cots_;
  size_t triple_batch_;
  AuthTriples stock_;       // made, not yet used: [stock_used_, size)
  size_t stock_used_ = 0;
  uint64_t triples_made_ = 0, triple_bytes_ = 0, triple_cots_ = 0;
  int run_rho_ = kDefaultRho + 2;  // the current run's bucketing security (run_checked)
  AuthTriples take_triples(size_t count);
  std::unique_ptr<AuthParty> auth_;
  std::unique_ptr<TripleFactory> triples_;
  std::array<uint8_t, 32> evidence_{};
  uint64_t triples_used_ = 0;
  size_t layers_ = 0;
  uint64_t layers_used_ = 0;
  bool broken_ = false;
  AuthGmwDeviation deviation_;
  TripleCheat triple_cheat_;
  RunOutputs run_checked(const Circuit& c, const RunInputs& in);
};

}  // namespace gc
