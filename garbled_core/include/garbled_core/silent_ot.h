// Silent correlated OT: Ferret (Kang Yang, Chenkai Weng, Xiao Lan, Jiang Zhang,
// Xiao Wang, "Ferret: Fast Extension for coRRElated oT with small
// communication", CCS 2020, eprint 2020/924), semi-honest variant, our own
// implementation.
//
// Roles and outputs (the COT convention of iknp.h / softspoken.h):
//   sender   = holds Delta (lsb(Delta) = 1), gets q_i;
//   receiver = gets choice bits b_i and t_i = q_i ^ b_i * Delta.
// Choices are random (pseudorandom from LPN), not chosen: silent OT is a
// source of RANDOM-choice COTs (extend_random's kind). Two differences from
// SoftSpoken's outputs that a consumer must know:
//   - lsb(q_i) = 0 for every sender output, so lsb(t_i) = b_i (the receiver
//     reads its choice bit off its label). q_i is therefore NOT a garbling
//     label with a random colour bit; consumers that need random OTs hash
//     (H(q_i), H(q_i ^ Delta)) as Beaver-triple generation does anyway.
//   - m need not be a multiple of 128.
//
// Construction (one iteration with parameters (n, k, t, h), n = t * 2^h):
//   Input: k + t*h base COTs with the invariant above (sender q, receiver
//   (b, t) with lsb(t) = b). The first k are the LPN secret x = (b_0..b_{k-1})
//   with its labels; the next t*h drive the t GGM trees (h each).
//   1. Single-point COT per tree (punctured GGM tree, depth h, 2^h leaves):
//      the sender draws a CSPRNG root and expands it with the fixed-key PRG
//      G(s) = (AES_K0(s) ^ s, AES_K1(s) ^ s). For level l it sends
//      K0_l ^ H(q_l, tw), K1_l ^ H(q_l ^ Delta, tw), K_c the XOR of the
//      level's nodes whose last path bit is c, H(x, tw) = pi(pi(x) ^ tw) ^
//      pi(x) (TCCR hash, Guo-Kolesnikov-Wang-Yang 2020, pi a third fixed-key
//      AES). The receiver, holding t_l = q_l ^ b_l Delta, opens K_{b_l} and
//      so the sibling of its path: its punctured path bit is alpha_l = 1 -
//      b_l. So the noise position comes from the base COT's own random
//      choice bits: nothing is sent to choose it.
//      All leaves get their lsb cleared; the sender then sends
//      c = Delta ^ XOR of its 2^h leaves, and the receiver sets its leaf
//      alpha to c ^ XOR of its other leaves = v_alpha ^ Delta. So for every
//      leaf i: w_i ^ v_i = (i == alpha) * Delta and lsb(w_i) = (i == alpha).
//   2. Multi-point COT with regular noise: t such trees side by side give an
//      n-long e with exactly one 1 in each block of 2^h.
//   3. LPN (primal, Ferret's local linear code, d = 10): output i is
//        sender   q_i = v_i ^ XOR_{j<10} q^base_{idx(i,j)}
//        receiver t_i = w_i ^ XOR_{j<10} t^base_{idx(i,j)},
//      b_i = e_i ^ XOR_j x_{idx(i,j)}, idx(i, j) in [0, k) from AES under a
//      fixed public key (per parameter set) in counter mode on i: 3 blocks
//      give 12 32-bit words, the first 10 scaled to [0, k) by (w * k) >> 32.
//   4. Bootstrapping: outputs [0, k + t*h) of a main iteration are the next
//      main iteration's base COTs; outputs [k + t*h, n) go to the caller.
//      Step 3 runs for those as the caller takes them (each output's encoding
//      is independent of the others'), so an iteration's LPN cost is paid for
//      the outputs used, and the setup iteration's dropped outputs cost none.
//   Setup: Chou-Orlandi base OTs + SoftSpoken (k = 7) random-choice COTs for
//   the setup parameter set's base, then one iteration with the setup set,
//   whose first k + t*h outputs (of the main set) are the first main base;
//   the setup iteration's other outputs are dropped.
//
// Communication: the receiver sends nothing after setup(); the sender sends
// t * (2h + 1) blocks per main iteration, which yields n - k - t*h outputs.
// Ferret's main set: 1,319 * 27 * 16 = 569,808 bytes per 10,198,341 OTs,
// 0.447 bits per OT. Setup: 128 base OTs + SoftSpoken for k + t*h of the
// setup set + that set's tree messages.
//
// Malicious variant (SilentOtParams::malicious(); docs/MALICIOUS.md, layer 1): the base COTs
// come from IKNP with KOS's check (iknp.h) instead of SoftSpoken, and every iteration ends
// with Ferret's consistency check of the single-point COTs (its malicious SPCOT, batched over
// the t trees): each iteration reserves 128 more base COTs (the receiver's bits x*, labels z*,
// the sender's y*, z* = y* ^ x* Delta). After the tree messages, the receiver draws a seed for
// chi_j (one GF(2^128) element per leaf, all trees) and sends it with X' = sum_i chi_{alpha_i}
// ^ X*, where X* = sum_k x*_k X^k; the sender answers with SHA-256 of
//   V = sum_j chi_j v_j ^ sum_k y*_k X^k ^ X' Delta,
// and the receiver compares it with SHA-256 of W = sum_j chi_j w_j ^ sum_k z*_k X^k, equal for
// an honest sender (w_j ^ v_j = [j = alpha] Delta); PeerDeviated otherwise. A sender whose tree
// messages are inconsistent passes only for receivers whose punctured paths it guessed: the
// check leaks at most the bits of alpha it bet on (at the price of being caught when wrong),
// which Ferret prices into its LPN parameters; chi is drawn after every message it constrains.
//
// Security of the semi-honest variant (no consistency check, so a malicious
// sender could corrupt the receiver's outputs with inconsistent sums, and
// nothing is claimed against malicious parties): the receiver's view is the level sums (each masked by a hash of the
// COT string it does not hold) and c (masked by the punctured leaf v_alpha);
// the sender's view is nothing at all after the base COTs. Output
// pseudorandomness rests on primal LPN with regular noise over the local code
// (Ferret's parameters, chosen there for 128-bit security against the
// attacks they list: Gaussian elimination, ISD, low-weight parity check,
// plus the regular-noise analysis), on the fixed-key AES as a random
// permutation (GGM PRG and TCCR hash, as in Ferret's own implementation),
// and on SoftSpoken / Chou-Orlandi for the base.
//
// Usage: both sides must make the same sequence of extend calls with the same
// m (iterations run when the buffer runs dry; the receiver never sends, so a
// mismatch shows as a hang or a short read, not a wrong output of this
// layer). After a channel failure the object is unusable (logic_error).
#pragma once

#include <cstddef>
#include <cstdint>

#include "garbled_core/block.h"
#include "garbled_core/channel.h"

namespace gc {

namespace detail {
// A block array on 2 MiB-aligned memory with transparent huge pages advised (Linux
// madvise; elsewhere plain memory): the LPN encoder reads its k-block base at random,
// and 4 KiB pages cost it a TLB miss per read. Grows keeping its contents; zeroed on
// destruction (it holds COT secrets).
class HugeBlocks {
 public:
  HugeBlocks() = default;
  ~HugeBlocks();
  HugeBlocks(const HugeBlocks&) = delete;
  HugeBlocks& operator=(const HugeBlocks&) = delete;
  void resize(size_t n);
  block* data() { return p_; }
  const block* data() const { return p_; }
  size_t size() const { return n_; }
  block& operator[](size_t i) { return p_[i]; }
  void swap(HugeBlocks& other) noexcept;
  void wipe();

 private:
  block* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
};
}  // namespace detail

// One LPN / MPCOT parameter set: n = t * 2^h outputs from k + t*h base COTs.
struct FerretParams {
  const char* name = "";
  size_t n = 0, k = 0, t = 0;
  int h = 0;
  size_t check = 0;  // base COTs of the malicious consistency check (128, or 0 without it)
  size_t reserve() const { return k + t * (size_t)h + check; }  // base COTs one iteration consumes
  size_t tree_bytes() const { return t * (2 * (size_t)h + 1) * sizeof(block); }  // sender -> receiver
};

struct SilentOtParams {
  FerretParams setup, main;
  bool secure = true;
  // Threads one COT object's LPN encoding is split over (1..kMaxLpnThreads): the same output
  // bits for any count (each output depends on its index alone). Local: the peer may differ.
  static constexpr size_t kMaxLpnThreads = 64;
  size_t threads = 1;
  // Ferret (CCS 2020), regular noise: main n = 10,805,248, k = 589,760,
  // t = 1,319 (2^13 leaves per tree); setup n = 642,048, k = 19,870,
  // t = 2,508 (2^8 leaves). 128-bit security as claimed there.
  static SilentOtParams ferret();
  // TEST ONLY, NOT SECURE (LPN dimension far too small): the same code paths
  // at a size a unit test runs in milliseconds. main n = 16,384 (t = 64,
  // h = 8), k = 2,048; setup n = 4,096 (t = 64, h = 6), k = 512.
  static SilentOtParams test_only();
  // The same set with the malicious consistency check and checked IKNP base COTs.
  bool malicious = false;
  SilentOtParams with_malicious_check() const;
  // Throws std::invalid_argument unless the chain is consistent (n = t 2^h,
  // setup.n >= main.reserve(), main.n > main.reserve(), 1 <= h <= 24, k >= 1).
  void validate() const;
  size_t usable_per_iteration() const { return main.n - main.reserve(); }
  size_t base_cots() const { return (setup.reserve() + 127) / 128 * 128; }  // from SoftSpoken
  double bits_per_ot() const { return 8.0 * (double)main.tree_bytes() / (double)usable_per_iteration(); }
};

class SilentCotReceiver;

class SilentCotSender {
 public:
  // delta must have lsb 1 (the garbler's free-XOR offset works).
  SilentCotSender(Channel& ch, block delta, const SilentOtParams& params = SilentOtParams::ferret());
  ~SilentCotSender();
  SilentCotSender(const SilentCotSender&) = delete;
  SilentCotSender& operator=(const SilentCotSender&) = delete;

  // Base OTs and SoftSpoken (traffic under Phase::BaseOT / its own
  // Phase::OTExtension), then the setup iteration (Phase::BaseOT).
  void setup();
  bool ready() const { return ready_; }
  // Writes q[0..m); runs main iterations (Phase::OTExtension) as needed.
  void extend(size_t m, block* q);
  const SilentOtParams& params() const { return params_; }
  uint64_t iterations() const { return iterations_; }  // main iterations run so far
  size_t buffered() const { return out_size_ - pos_; }
  // Pairs this sender with a receiver of the same party on the same main parameter set (the
  // other direction's COTs, as SilentRandomOt holds): whenever both are in the same main
  // iteration, their outputs are LPN-encoded together, one random read of an interleaved base
  // serving both (the same output bits as apart). Either may be destroyed first.
  void pair_encoding_with(SilentCotReceiver& r);
  // Test only: XOR a bit into tree message `index` of the next iteration (a sender that
  // deviates; the malicious check must catch it unless it guessed the receiver's path).
  void corrupt_for_test(size_t index) { corrupt_at_ = index; }

 private:
  friend class SilentCotReceiver;
  size_t corrupt_at_ = ~size_t(0);
  friend void encode_jointly(SilentCotSender& s, SilentCotReceiver& r, size_t end);
  void iterate(const FerretParams& p);
  bool paired_now() const;
  SilentCotReceiver* partner_ = nullptr;
  detail::HugeBlocks pair_base_;  // both bases interleaved, for iteration pair_iteration_
  uint64_t pair_iteration_ = ~uint64_t(0);

  Channel& ch_;
  block delta_;
  SilentOtParams params_;
  bool ready_ = false;
  uint64_t iterations_ = 0, tweak_base_ = 0;
  detail::HugeBlocks base_, next_base_, out_;  // base_: the current iteration's
  BlockVector msg_;
  size_t out_size_ = 0, pos_ = 0, encoded_ = 0;  // outputs [0, encoded_) are LPN-encoded
};

class SilentCotReceiver {
 public:
  explicit SilentCotReceiver(Channel& ch, const SilentOtParams& params = SilentOtParams::ferret());
  ~SilentCotReceiver();
  SilentCotReceiver(const SilentCotReceiver&) = delete;
  SilentCotReceiver& operator=(const SilentCotReceiver&) = delete;

  void setup();
  bool ready() const { return ready_; }
  // Writes t[0..m) and the choice bits, packed LSB-first into choices[0..ceil(m/8))
  // (bits past m in the last byte are zero); choices may be null (b_i = lsb(t_i)).
  void extend(size_t m, uint8_t* choices, block* t);
  const SilentOtParams& params() const { return params_; }
  uint64_t iterations() const { return iterations_; }
  size_t buffered() const { return out_size_ - pos_; }

 private:
  friend class SilentCotSender;
  friend void encode_jointly(SilentCotSender& s, SilentCotReceiver& r, size_t end);
  void iterate(const FerretParams& p);
  bool paired_now() const;
  SilentCotSender* partner_ = nullptr;

  Channel& ch_;
  SilentOtParams params_;
  bool ready_ = false;
  uint64_t iterations_ = 0, tweak_base_ = 0;
  detail::HugeBlocks base_, next_base_, out_;  // base_: the current iteration's
  BlockVector msg_;
  size_t out_size_ = 0, pos_ = 0, encoded_ = 0;  // outputs [0, encoded_) are LPN-encoded
};

}  // namespace gc
