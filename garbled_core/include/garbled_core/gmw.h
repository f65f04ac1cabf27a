// GMW backend: the two servers evaluate the same compiled gc::Circuit that the
// garbler and evaluator run, on XOR shares of every wire (Goldreich-Micali-
// Wigderson, two parties, semi-honest), with AND gates from Beaver triples.
//
// Roles: party 0 is H1 and owns the circuit's "garbler" input ports, party 1
// is H2 and owns the "evaluator" ports. The run interface and its semantics
// are those of GarblerSession / EvaluatorSession::run (RunInputs, RunOutputs):
// outputs Both / Garbler / Evaluator are opened to those parties, Shares gives
// each party its XOR share, Keep leaves the shares in a KeptLabels for a later
// run's carried input (a GMW Kept holds bit-sliced share words, not labels; a
// garbled-circuit Kept is refused by GMW, and a GMW Kept by the garbled-circuit
// sessions, since the session ids differ).
//
// One run of n instances (everything bit-sliced, 64 instances per uint64):
//   1. header: circuit digest, n, run counter, carried inputs, roles; any
//      disagreement is a ProtocolError on both sides (Phase::Setup).
//   2. triples: the AND gates of each layer are grouped by a shared input wire
//      (greedy, from the circuit alone: the wire feeding the most ungrouped
//      gates keys the next group, at most kMaxGroupWidth gates, the rest are
//      groups of one). One group triple per group and instance: a bit a and,
//      per member, b and c = a & b (XOR-shared), made for this run from ONE
//      random OT each way whatever the group's width, consumed once; no triple
//      outlives its run, so none is ever reused (Phase::OTExtension).
//   3. inputs: the owner's share of an input bit is x ^ r, the other party's r,
//      with r from an AES-CTR stream both parties seed at setup: no bytes.
//   4. gates in AND-depth layers: XOR / NOT locally; per layer ONE message each
//      way with, group by group, the shares of d = key ^ a (once per group)
//      and e = y ^ b (per gate) for all n instances ((groups + ANDs) bits per
//      instance per direction, Phase::Tables); each gate key & y gets
//      z = c ^ d&b ^ e&a (^ d&e at party 0).
//   5. outputs: one message each way with the shares of opened outputs and an
//      8-byte end-of-run tag (Phase::Outputs).
// Round trips per run (Channel::round_trips): AND-depth + 1 (the outputs) when the ROT
// source reads nothing from the link for the run's triples (silent OT between iterations):
// the header then travels with the first AND layer and is read, and checked, before that
// layer's openings; otherwise AND-depth + 2 or more (the header, the triple stream's steps).
// Either way the peer's header is the first thing read in a run, so a mismatch is a
// ProtocolError before any other byte of the run is read.
//
// Group triples from random OT (ROT) with 128-bit strings. A ROT gives the
// sender random strings (s0, s1) and the receiver a random choice u with s_u;
// s0 ^ s_u = u & (s0 ^ s1) bitwise: XOR shares of the receiver's bit u times
// each bit of the sender's string s0 ^ s1. Each party is the sender of one ROT
// and the receiver of another per group and instance and sets a = u (its
// choice), b = s0 ^ s1 of its sender pair (the group's width in bits), c =
// a&b ^ s0 ^ s_u'; then c0 ^ c1 = (a0 ^ a1) & (b0 ^ b1) for every member. A
// group of width 1 is an ordinary Beaver triple.
//
// The ROT source sits behind RandomOtSource (SoftSpoken, or silent OT from
// silent_ot.h); the triple generator only sees bits.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "garbled_core/block.h"
#include "garbled_core/channel.h"
#include "garbled_core/circuit.h"
#include "garbled_core/session.h"
#include "garbled_core/silent_ot.h"
#include "garbled_core/softspoken.h"

namespace gc {

// Random OTs in both directions over one channel, hashed to 128-bit strings.
// Choice bits are packed LSB first in uint64 words; m is always a multiple of 128.
class RandomOtSource {
 public:
  virtual ~RandomOtSource() = default;
  virtual const char* name() const = 0;
  // Interactive setup; party 0 and party 1 call it at the same time. salt is a
  // block both parties agree on (fresh per session) for the hash tweaks.
  virtual void setup(Channel& ch, int party, block salt) = 0;
  // This party as ROT receiver: m random choice bits u_j and the chosen strings s_{u_j}.
  virtual void receive(Channel& ch, uint64_t* choice, block* chosen, size_t m) = 0;
  // This party as ROT sender: m pairs of random strings (s0, s1). Pairs with the
  // peer's receive() of the same m, call by call.
  virtual void send(Channel& ch, block* s0, block* s1, size_t m) = 0;
  // Which half only writes to the link (never waits for the peer): true when
  // the receiver speaks (SoftSpoken), false when the sender does (silent OT,
  // whose receiver sends nothing after setup). Both parties call the speaking
  // half first, so neither waits on the other and no call can deadlock.
  virtual bool receiver_speaks() const = 0;
  // Bytes this party sends per ROT it receives (for the accounting tests).
  virtual double bytes_per_rot() const = 0;
  // True when receive(m) and send(m) (in any split) will read nothing from the link: a run
  // may then send its first AND layer before it reads the peer's header (one round trip
  // less). Must be the same answer the peer's source gives for the same m while the two are
  // in step. The default (false) keeps the header's own round trip.
  virtual bool reads_nothing_for(size_t m) const {
    (void)m;
    return false;
  }
};

// Random OTs from SoftSpoken correlated OT (softspoken.h, random choices) in
// each direction, hashed to strings: s0 = H(q, j), s1 = H(q ^ Delta, j),
// s_u = H(t, j), with the engine's tweakable correlation-robust hash
// H(x, tweak) = AES_{salt ^ tweak}(x) ^ x (halfgates.h), one key per 8 OTs of
// one direction, the tweak naming the direction and the OT index, which
// advances over the whole session (no key is ever used for two groups).
class SoftSpokenRandomOt : public RandomOtSource {
 public:
  explicit SoftSpokenRandomOt(int k = SoftSpokenParams::kDefaultK);
  const char* name() const override { return "softspoken"; }
  void setup(Channel& ch, int party, block salt) override;
  void receive(Channel& ch, uint64_t* choice, block* chosen, size_t m) override;
  void send(Channel& ch, block* s0, block* s1, size_t m) override;
  bool receiver_speaks() const override { return true; }
  double bytes_per_rot() const override;

 private:
  int party_ = 0;
  block salt_{};
  block delta_{};
  uint64_t sent_ = 0, received_ = 0;  // ROTs done as sender / receiver (tweak counters)
  SoftSpokenCotSender sender_;
  SoftSpokenCotReceiver receiver_;
  BlockVector buf_;
};

// Random OTs from silent correlated OT (silent_ot.h, Ferret), one sender and
// one receiver per party, hashed to bits exactly as SoftSpokenRandomOt does
// (silent COTs have lsb(q) = 0, which the hash makes irrelevant).
class SilentRandomOt : public RandomOtSource {
 public:
  explicit SilentRandomOt(const SilentOtParams& params = SilentOtParams::ferret());
  ~SilentRandomOt() override;
  const char* name() const override { return params_.secure ? "silent-ferret" : "silent-TEST-ONLY"; }
  void setup(Channel& ch, int party, block salt) override;
  void receive(Channel& ch, uint64_t* choice, block* chosen, size_t m) override;
  void send(Channel& ch, block* s0, block* s1, size_t m) override;
  bool receiver_speaks() const override { return false; }
  double bytes_per_rot() const override { return params_.bits_per_ot() / 8.0; }
  // The receiver reads the peer's trees only when it starts a main iteration.
  bool reads_nothing_for(size_t m) const override { return receiver_ && receiver_->buffered() >= m; }

 private:
  SilentOtParams params_;
  int party_ = 0;
  block salt_{};
  block delta_{};
  uint64_t sent_ = 0, received_ = 0;
  std::unique_ptr<SilentCotSender> sender_;
  std::unique_ptr<SilentCotReceiver> receiver_;
  BlockVector buf_;
};

// Boolean Beaver triples of one party for AND gates grouped by a shared input
// ("group triples"): group g of width w_g (1 .. kMaxGroupWidth) has, per
// instance, one a bit and w_g pairs (b_p, c_p) with c_p = a & b_p once both
// parties' shares are XORed. Rows are bit-sliced, instance i at bit i:
// a has one row per group, b and c one row per member, members of group 0
// first. A group of width 1 is a plain Beaver triple.
constexpr uint32_t kMaxGroupWidth = 128;  // the bits of one hashed ROT string
struct GroupTriples {
  size_t n = 0, words = 0;  // instances, and 64-bit words per row (ceil(n / 64))
  std::vector<uint64_t> a, b, c;
  size_t rots = 0;  // random OTs this party received (= sent) for them, rounded up to 128
};

// Makes fresh group triples for n instances of groups of the given widths: one
// random OT each way per group and instance, whatever the width (party P's a is
// its choice bits, its b = s0 ^ s1 of its sender strings, truncated to w_g
// bits). Both parties call it with the same widths and n at the same time.
void generate_triples(RandomOtSource& ot, Channel& ch, const std::vector<uint32_t>& widths, size_t n,
                      GroupTriples& out);

struct GmwOptions {
  int ot_k = SoftSpokenParams::kDefaultK;  // SoftSpoken k of the ROT source
};

class GmwParty : public Session {
 public:
  // party 0 = H1 ("garbler" ports), 1 = H2 ("evaluator" ports).
  GmwParty(Channel& ch, int party, GmwOptions options = {});
  // With another ROT source (e.g. silent OT); both parties must use the same.
  GmwParty(Channel& ch, int party, std::unique_ptr<RandomOtSource> ot);
  int party() const { return party_; }
  // Threads each AND layer's openings and gates are split over (by words of the rows: the
  // same bits for any count; local to this party). Default 1.
  static constexpr size_t kMaxGmwThreads = 64;
  void set_threads(size_t threads);
  size_t threads() const { return threads_; }
  void setup();
  RunOutputs run(const Circuit& c, const RunInputs& in);
  // SHA-256 of everything the peer sent in the last run's AND layers (its
  // openings): fresh triples make it differ between runs on the same inputs.
  const std::array<uint8_t, 32>& last_transcript() const { return transcript_; }
  // Round trips of the last run's AND layers (= the circuit's AND-depth).
  size_t last_layers() const { return layers_; }
  // Over every run of this party so far: Beaver triples consumed (AND gates x instances),
  // random OTs received (= sent: one each way per AND group and instance, rounded up to 128
  // per run) and AND-layer exchanges (round trips). Benchmarks amortise the OT source's bytes
  // per OT over ots_used (silent OT sends a whole iteration at once).
  uint64_t triples_used() const { return triples_used_; }
  uint64_t ots_used() const { return ots_used_; }
  uint64_t layers_used() const { return layers_used_; }
  // AND groups (gates sharing an input within a layer) of the last run's circuit.
  size_t last_groups() const { return groups_; }

 private:
  int party_;
  size_t threads_ = 1;
  std::unique_ptr<RandomOtSource> ot_;
  std::array<uint8_t, 32> transcript_{};
  size_t layers_ = 0, groups_ = 0;
  uint64_t triples_used_ = 0, ots_used_ = 0, layers_used_ = 0;
  bool broken_ = false;  // a run failed midway: the link is out of step
  void exchange_gmw_hello();
  RunOutputs run_checked(const Circuit& c, const RunInputs& in);
  struct Header {
    char magic[4];
    uint32_t party;
    uint32_t run_id;
    uint32_t and_layers;
    uint64_t n;
    uint8_t circuit[32];
    uint8_t carried[32];
  };
  Header sent_header_{};
  void send_gmw_header(const Circuit& c, const RunInputs& in);
  void check_gmw_header(const Circuit& c);  // reads the peer's header and compares
};

}  // namespace gc
