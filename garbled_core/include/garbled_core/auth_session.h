// What the two authenticated backends of docs/MALICIOUS.md share (layer 3): the hello, the
// stock of authenticated AND triples, the authenticated input phase, the deferred MAC check
// and the checked output phase. A subclass evaluates the gates between the inputs and the
// outputs: AuthGmwParty (auth_gmw.h) layer by layer, AuthGarbleParty (auth_garble.h) with
// authenticated garbled tables.
//
// One run of n instances:
//   1. header: as every backend (circuit digest, n, run counter, carried inputs).
//   2. inputs: per input bit and instance a random shared [r]; the non-owner opens its r bit
//      to the owner (MAC recorded for the deferred check), the owner sends x ^ r, and [x] =
//      [r] ^ (x ^ r). Carried inputs are the authenticated shares a Keep output left.
//   3. gates (the subclass): authenticated shares of every output wire, from the inputs'. Its
//      triples come from take_triples(): this party's stock, made (both parties at the same
//      point: when a take needs more than the stock holds) at least `triple_batch` at a time,
//      which sets the bucket size (3 from about 553,000 triples, 4 below). Each triple is used
//      once, by one run. Their COTs come from silent OT with Ferret's malicious check (the
//      default) or checked IKNP.
//   4. the deferred check: one digest each way over every opening of the run; a wrong bit
//      anywhere is PeerDeviated here, before any output share is sent.
//   5. outputs: each party sends its bits of what the other learns with their MACs' digest
//      and checks the peer's (PeerDeviated); Shares gives each party its bit, Keep keeps the
//      authenticated shares (carried into later runs of the same session).
// Roles as in GmwParty: party 0 is H1 (the "garbler" ports), party 1 H2 (the "evaluator").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "garbled_core/auth_bits.h"
#include "garbled_core/auth_triples.h"
#include "garbled_core/channel.h"
#include "garbled_core/circuit.h"
#include "garbled_core/gmw_plan.h"
#include "garbled_core/session.h"
#include "garbled_core/zk_proof.h"

namespace gc {

constexpr int kDefaultRho = 40;  // statistical security of the triples' bucketing

// Fault injection for tests: a party that deviates in a run. Never set outside tests.
struct AuthDeviation {
  // FlipRow: the garbler flips one bit of one garbled row (AuthGarbleParty only).
  enum class Kind { None, FlipOpening, FlipWire, FlipOutput, FlipInputMask, FlipRow };
  Kind kind = Kind::None;
  size_t index = 0;        // which opened bit / wire entry / output bit / input-mask bit / row
  block mac_offset{};      // XORed into the MAC sent with a flipped bit (a guess of Delta)
};

// Authenticated shares of every slot of a plan and instance: entry slot * n + i.
struct AuthWires {
  size_t n;
  std::vector<uint8_t> bits;
  BlockVector macs, keys;
  AuthWires(size_t slots, size_t n_) : n(n_), bits(slots * n_, 0), macs(slots * n_), keys(slots * n_) {}
  size_t at(uint32_t slot, size_t i) const { return (size_t)slot * n + i; }
};

class AuthSession : public Session {
 public:
  // Triples made at once, at least (both parties must agree: the hello compares it).
  // 2^20: bucket size 3 at 2^-43.8 (3 from about 553,000 triples at the 2^-42 a batch needs).
  static constexpr size_t kDefaultTripleBatch = size_t(1) << 20;
  ~AuthSession() override;
  int party() const { return party_; }
  int rho() const { return rho_; }
  void setup();
  RunOutputs run(const Circuit& c, const RunInputs& in);

  // SHA-256 of everything the peer sent in the last run or proof (triple messages, openings,
  // tables, check digests, proof messages): the evidence an honest party keeps when it catches
  // the peer.
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
  // Exchanges of the last run's gates (GMW: its AND layers), and over every run so far; the
  // COTs received (= sent) for the authenticated shares (bench comm charges silent OT's bytes
  // per COT against them).
  size_t last_layers() const { return layers_; }
  uint64_t layers_used() const { return layers_used_; }
  uint64_t ots_used() const { return auth_ ? auth_->cots_used() : 0; }

  // Zero-knowledge proofs (zk_proof.h) on this session's authenticated bits, both parties at
  // once: each proves its statement and checks the peer's (PeerDeviated when the peer's does
  // not hold; the session stops, as after a failed run). What a proof keeps enters later runs
  // through bind_proved().
  std::pair<ProofResult, ProofResult> prove(const ProofStatement& mine, const ProofStatement& theirs);
  uint64_t ands_proved() const { return ands_proved_; }
  // A carried input of `width` bits over n instances made of proofs' kept bits: bit k of
  // instance i is bit k of instance instance[i] of sources[source[i]] (each source a kept output
  // port of 64 bits, entry k * m + j for its m instances). Both parties pass the same
  // indices, the prover's and the verifier's sides of the same proofs; the bits stay bound to
  // what was proved, so the run computes on them and nothing else.
  std::shared_ptr<KeptLabels> bind_proved(const std::vector<const AuthShares*>& sources,
                                          const std::vector<uint32_t>& source,
                                          const std::vector<uint64_t>& instance, int width,
                                          const std::string& port);
  void deviate_for_test(AuthDeviation d) { deviation_ = d; }
  void cheat_proofs_for_test(ProofCheat c) { proof_cheat_ = c; }
  void deviate_triples_for_test(const TripleCheat& cheat);
  // Test only: this party's Delta, to hand to a cheater in a control test.
  block delta_for_test() const;

 protected:
  // magic: 7 characters, the party's digit follows (the hello); name: the backend in messages.
  AuthSession(Channel& ch, int party, int rho, AuthCots cots, size_t triple_batch, const char* magic,
              const char* name);
  // The gates: w holds the inputs' shares (every input slot, every instance); the subclass
  // fills at least every output slot. Every opening's MAC goes into `check` (verified after).
  virtual void evaluate(const Circuit& c, const GmwPlan& plan, AuthWires& w, DeferredMacCheck& check) = 0;
  // After the session's setup (both parties at the same point).
  virtual void after_setup() {}
  // The security of the batches this run makes: the run will take triples at most `takes`
  // times, `count` triples in all (call before the first take_triples of a run).
  void plan_triple_security(size_t takes, size_t count);
  AuthTriples take_triples(size_t count);
  // A public bit folded into share e: the first party flips its bit, the second moves its key.
  void add_public(AuthWires& w, size_t e, uint8_t bit) const;
  // A stage's XOR and NOT gates on the shares of every instance of w (local: MACs and keys
  // follow; NOT adds the public 1).
  void apply_local_gates(const GmwPlan& plan, const GmwPlan::Stage& st, AuthWires& w) const;
  // Both parties at once: our bits out, the peer's in (packed on the wire).
  std::vector<uint8_t> swap_bits(const std::vector<uint8_t>& ours, size_t their_bits);
  bool first() const { return party_ == 0; }

  std::unique_ptr<AuthParty> auth_;
  AuthDeviation deviation_;
  size_t layers_ = 0;
  uint64_t layers_used_ = 0;

 private:
  int party_;
  int rho_;
  AuthCots cots_;
  size_t triple_batch_;
  const char* magic_;
  const char* name_;
  AuthTriples stock_;       // made, not yet used: [stock_used_, size)
  size_t stock_used_ = 0;
  uint64_t triples_made_ = 0, triple_bytes_ = 0, triple_cots_ = 0;
  int run_rho_ = kDefaultRho + 2;  // the current run's bucketing security
  std::unique_ptr<TripleFactory> triples_;
  std::array<uint8_t, 32> evidence_{};
  uint64_t triples_used_ = 0;
  bool broken_ = false;
  uint64_t ands_proved_ = 0;
  ProofCheat proof_cheat_;
  TripleCheat triple_cheat_;
  RunOutputs run_checked(const Circuit& c, const RunInputs& in);
  void enter_inputs(const Circuit& c, const RunInputs& in, const GmwPlan& plan, AuthWires& w,
                    DeferredMacCheck& check);
  RunOutputs open_outputs(const Circuit& c, const GmwPlan& plan, const AuthWires& w);
};

}  // namespace gc
