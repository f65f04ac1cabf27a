// What the authenticated backends share (see auth_session.h for the run's message order).
#include "garbled_core/auth_session.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "garbled_core/iknp.h"
#include "garbled_core/random.h"

namespace gc {

namespace {

constexpr uint32_t kAuthVersion = 3;  // 2: the hello names the COT source; 3: the triple batch
constexpr size_t kKeptBlocks = 3;     // per kept bit and instance: MAC, key, the bit

}  // namespace

AuthSession::AuthSession(Channel& ch, int party, int rho, AuthCots cots, size_t triple_batch, const char* magic,
                         const char* name)
    : Session(ch, SessionOptions{}),
      party_(party),
      rho_(rho),
      cots_(cots),
      triple_batch_(triple_batch),
      magic_(magic),
      name_(name) {
  if (party != 0 && party != 1) throw std::invalid_argument("party must be 0 or 1");
  if (rho < 1 || rho > 128) throw std::invalid_argument("rho must be in 1..128");
  if (std::strlen(magic) != 7) throw std::invalid_argument("hello magic: 7 characters");
}

AuthSession::~AuthSession() = default;

void AuthSession::plan_triple_security(size_t takes, size_t count) {
  // The batches this run makes, at most: each is bucketed at 2^-(rho + 2 + log2 k), so that
  // with the leftover of an earlier batch (at most 2^-(rho + 2)) a run's triples failed with
  // probability under 2^-(rho + 1) (docs/MALICIOUS.md, "The statistical error").
  const size_t held = triples_in_stock();
  size_t k = 0;
  if (count > held)
    k = triple_batch_ ? std::min(takes, (count - held + triple_batch_ - 1) / triple_batch_) : takes;
  int extra = 0;
  while ((size_t(1) << extra) < std::max<size_t>(k, 1)) ++extra;
  run_rho_ = rho_ + 2 + extra;
  triples_used_ += count;
}

AuthTriples AuthSession::take_triples(size_t count) {
  // The triples' own messages count with the openings ("tables"); only silent OT's
  // iterations are "ot_extension" (its PhaseGuard), which benchmarks amortise per COT.
  const Phase was = ch_.phase();
  ch_.set_phase(Phase::Tables);
  const size_t held = stock_.size() - stock_used_;
  if (held < count) {
    auto tables = [&] { return ch_.bytes_sent(Phase::Tables) + ch_.bytes_received(Phase::Tables); };
    const uint64_t bytes0 = tables(), cots0 = auth_->cots_used();
    AuthTriples fresh = triples_->make(std::max(count - held, triple_batch_), run_rho_);
    triples_made_ += fresh.size();
    triple_bytes_ += tables() - bytes0;
    triple_cots_ += auth_->cots_used() - cots0;
    AuthTriples rest = stock_.slice(stock_used_, held);
    rest.append(fresh);
    stock_ = std::move(rest);
    stock_used_ = 0;
  }
  AuthTriples out = stock_.slice(stock_used_, count);
  stock_used_ += count;
  if (stock_used_ == stock_.size()) {  // used up: dropped
    stock_ = AuthTriples();
    stock_used_ = 0;
  }
  ch_.set_phase(was);
  return out;
}

void AuthSession::add_public(AuthWires& w, size_t e, uint8_t bit) const {
  if (!bit) return;
  if (first())
    w.bits[e] ^= 1;
  else
    w.keys[e] = xor_block(w.keys[e], auth_->delta());
}

void AuthSession::apply_local_gates(const GmwPlan& plan, const GmwPlan::Stage& st, AuthWires& w) const {
  for (size_t k = st.local_begin; k < st.local_end; ++k) {
    const GmwPlan::Op& op = plan.ops[k];
    for (size_t i = 0; i < w.n; ++i) {
      const size_t a = w.at(op.a, i), o = w.at(op.out, i);
      if (op.op == GateOp::Xor) {
        const size_t b = w.at(op.b, i);
        w.bits[o] = w.bits[a] ^ w.bits[b];
        w.macs[o] = xor_block(w.macs[a], w.macs[b]);
        w.keys[o] = xor_block(w.keys[a], w.keys[b]);
      } else {  // NOT: x ^ 1
        w.bits[o] = w.bits[a];
        w.macs[o] = w.macs[a];
        w.keys[o] = w.keys[a];
        add_public(w, o, 1);
      }
    }
  }
}

std::vector<uint8_t> AuthSession::swap_bits(const std::vector<uint8_t>& ours, size_t their_bits) {
  const std::vector<uint8_t> out = pack_bits(ours);
  std::vector<uint8_t> in((their_bits + 7) / 8);
  auth_->exchange(out.data(), out.size(), in.data(), in.size());
  return unpack_bits(in, their_bits);
}

uint64_t AuthSession::leaky_triples_made() const { return triples_ ? triples_->leaky_made() : 0; }
size_t AuthSession::last_bucket_size() const { return triples_ ? triples_->last_bucket_size() : 0; }

void AuthSession::deviate_triples_for_test(const TripleCheat& cheat) {
  triple_cheat_ = cheat;
  if (triples_) triples_->deviate_for_test(triple_cheat_.hooks());
}

block AuthSession::delta_for_test() const {
  if (!auth_) throw std::logic_error("no Delta before setup");
  return auth_->delta();
}

void AuthSession::setup() {
  if (ready_) return;
  ch_.set_phase(Phase::Setup);
  // 20 bytes, like the other backends' hellos, so a mismatched peer fails cleanly.
  struct Hello {
    char magic[8];
    uint32_t version, rho, cots;
  } mine{}, theirs{};
  static_assert(sizeof(Hello) == 20, "hello layout");
  char expect[8];
  std::memcpy(mine.magic, magic_, 7);
  mine.magic[7] = party_ == 0 ? '0' : '1';
  std::memcpy(expect, magic_, 7);
  expect[7] = party_ == 0 ? '1' : '0';
  mine.version = kAuthVersion;
  mine.rho = (uint32_t)rho_;
  mine.cots = (uint32_t)cots_;
  ch_.send(&mine, sizeof mine);
  ch_.flush();
  ch_.recv(&theirs, sizeof theirs);
  if (std::memcmp(theirs.magic, mine.magic, 8) == 0)
    throw ProtocolError(std::string("both parties are ") + name_ + " party " + std::to_string(party_));
  if (std::memcmp(theirs.magic, expect, 8) != 0) {
    // Another authenticated backend ("SPGCAG" + its letter) or a semi-honest one.
    if (std::memcmp(theirs.magic, magic_, 6) == 0)
      throw ProtocolError(std::string("backend mismatch: this party runs ") + name_ +
                          " (security: malicious), the peer another authenticated backend (both "
                          "servers must set the same backend)");
    throw ProtocolError(std::string("security mismatch: this party runs ") + name_ +
                        " (security: malicious), the peer does not (both servers must set the same "
                        "security and backend)");
  }
  if (theirs.version != kAuthVersion)
    throw ProtocolError(std::string(name_) + " version mismatch: " + std::to_string(kAuthVersion) + " here, " +
                        std::to_string(theirs.version) + " at the peer");
  if (theirs.rho != mine.rho)
    throw ProtocolError("statistical security mismatch: rho " + std::to_string(rho_) + " here, " +
                        std::to_string(theirs.rho) + " at the peer");
  if (theirs.cots != mine.cots)
    throw ProtocolError(std::string("COT source mismatch: ") + auth_cots_name(cots_) + " here, " +
                        (theirs.cots <= 2 ? auth_cots_name((AuthCots)theirs.cots) : "unknown") + " at the peer");
  uint64_t batch = triple_batch_, their_batch = 0;
  ch_.send(&batch, sizeof batch);
  ch_.flush();
  ch_.recv(&their_batch, sizeof their_batch);
  if (their_batch != batch)
    throw ProtocolError("triple batch mismatch: " + std::to_string(batch) + " here, " +
                        std::to_string(their_batch) + " at the peer");
  if (party_ == 0) {
    secure_random(&session_id_, sizeof session_id_);
    ch_.send(&session_id_, sizeof session_id_);
    ch_.flush();
  } else {
    ch_.recv(&session_id_, sizeof session_id_);
  }
  auth_ = std::make_unique<AuthParty>(ch_, party_ == 0, nullptr, cots_);
  triples_ = std::make_unique<TripleFactory>(*auth_);
  if (triple_cheat_.kind != TripleCheat::Kind::None) triples_->deviate_for_test(triple_cheat_.hooks());
  after_setup();
  ready_ = true;
}

RunOutputs AuthSession::run(const Circuit& c, const RunInputs& in) {
  if (broken_)
    throw ProtocolError(std::string("this ") + name_ + " party stopped after a failed run; start a new session");
  for (size_t p = 0; p < c.inputs().size() && p < in.carried.size(); ++p) {
    if (c.inputs()[p].owner != InputOwner::Carried || !in.carried[p].source) continue;
    const KeptLabels& k = *in.carried[p].source;
    if (!ready_ || k.session_id != session_id_ || k.labels.size() != kKeptBlocks * (size_t)k.width * k.n)
      throw std::invalid_argument("run: carried input '" + c.inputs()[p].name + "' was not kept by this " +
                                  name_ + " party");
  }
  check_inputs(c, in, party_ == 0 ? InputOwner::Garbler : InputOwner::Evaluator);
  setup();
  try {
    RunOutputs out = run_checked(c, in);
    evidence_ = auth_->evidence();
    return out;
  } catch (...) {
    broken_ = true;
    evidence_ = auth_->evidence();
    throw;
  }
}

std::pair<ProofResult, ProofResult> AuthSession::prove(const ProofStatement& mine, const ProofStatement& theirs) {
  if (broken_)
    throw ProtocolError(std::string("this ") + name_ + " party stopped after a failed run; start a new session");
  setup();
  ch_.set_phase(Phase::Inputs);
  ZkProofs proofs(*auth_);
  proofs.cheat_for_test(proof_cheat_);
  try {
    auto result = proofs.run(mine, theirs);
    ands_proved_ += proofs.ands_proved();
    evidence_ = auth_->evidence();  // what the peer sent in the proof: evidence if its claim fails
    return result;
  } catch (...) {
    broken_ = true;
    evidence_ = auth_->evidence();
    throw;
  }
}

std::shared_ptr<KeptLabels> AuthSession::bind_proved(const std::vector<const AuthShares*>& sources,
                                                     const std::vector<uint32_t>& source,
                                                     const std::vector<uint64_t>& instance, int width,
                                                     const std::string& port) {
  if (source.size() != instance.size()) throw std::invalid_argument("bind_proved: one source and instance each");
  if (width < 1 || width > 64) throw std::invalid_argument("bind_proved: width 1..64");
  const size_t n = source.size();
  for (const AuthShares* s : sources)
    if (!s || s->size() == 0 || s->size() % 64 != 0)
      throw std::invalid_argument("bind_proved: each source is a kept port of 64 bits");
  OutputPort shape;
  shape.name = port;
  shape.wires.assign((size_t)width, 0);
  auto kept = new_kept(shape, n, kKeptBlocks * (size_t)width * n);
  for (size_t i = 0; i < n; ++i) {
    if (source[i] >= sources.size()) throw std::invalid_argument("bind_proved: no such source");
    const AuthShares& from = *sources[source[i]];
    const size_t m = from.size() / 64;  // its instances
    if (instance[i] >= m) throw std::invalid_argument("bind_proved: no such instance in the source");
    for (int k = 0; k < width; ++k) {
      const size_t e = (size_t)k * m + instance[i];
      block* k3 = kept->labels.data() + kKeptBlocks * ((size_t)k * n + i);
      k3[0] = from.macs[e];
      k3[1] = from.keys[e];
      k3[2] = make_block(0, from.bits[e]);
    }
  }
  return kept;
}

RunOutputs AuthSession::run_checked(const Circuit& c, const RunInputs& in) {
  exchange_header(c, in);
  const GmwPlan plan = plan_circuit(c);
  AuthWires w(plan.slots, in.n);
  DeferredMacCheck check(*auth_);
  enter_inputs(c, in, plan, w, check);
  ch_.set_phase(Phase::Tables);
  layers_ = 0;
  evaluate(c, plan, w, check);
  layers_used_ += layers_;
  // Every opening of the run checked before any output share leaves this party.
  check.verify("the input masks and AND-gate openings of this run");
  RunOutputs out = open_outputs(c, plan, w);
  ++run_id_;
  return out;
}

void AuthSession::enter_inputs(const Circuit& c, const RunInputs& in, const GmwPlan& plan, AuthWires& w,
                               DeferredMacCheck& check) {
  // Entries (port, bit, instance) of both owners, in port order.
  ch_.set_phase(Phase::Inputs);
  const size_t n = in.n;
  const InputOwner self = first() ? InputOwner::Garbler : InputOwner::Evaluator;
  struct Entry {
    size_t port;
    int bit;
    size_t instance;
  };
  std::vector<Entry> mine_e, theirs_e;
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    const InputPort& port = c.inputs()[p];
    if (port.owner == InputOwner::Carried) continue;
    for (int bit = 0; bit < port.width; ++bit)
      for (size_t i = 0; i < n; ++i) (port.owner == self ? mine_e : theirs_e).push_back({p, bit, i});
  }
  // One draw for both owners' entries, the first party's first (the same call on both sides).
  const size_t n_first = first() ? mine_e.size() : theirs_e.size();
  const size_t n_second = first() ? theirs_e.size() : mine_e.size();
  const AuthShares r_all = auth_->random(n_first + n_second);
  const AuthShares r_mine = AuthParty::slice(r_all, first() ? 0 : n_first, mine_e.size());
  const AuthShares r_theirs = AuthParty::slice(r_all, first() ? n_first : 0, theirs_e.size());
  // The non-owner opens its bit of r to the owner.
  std::vector<uint8_t> reveal(theirs_e.size());
  for (size_t k = 0; k < theirs_e.size(); ++k) {
    reveal[k] = r_theirs.bits[k];
    block mac = r_theirs.macs[k];
    if (deviation_.kind == AuthDeviation::Kind::FlipInputMask && k == deviation_.index) {
      reveal[k] ^= 1;
      mac = xor_block(mac, deviation_.mac_offset);
    }
    check.sent(mac);
  }
  const std::vector<uint8_t> got = swap_bits(reveal, mine_e.size());
  std::vector<uint8_t> masked(mine_e.size());
  for (size_t k = 0; k < mine_e.size(); ++k) {
    check.received(r_mine.keys[k], got[k]);
    const Entry& e = mine_e[k];
    const uint8_t x = (uint8_t)((in.values[e.port][e.instance] >> e.bit) & 1);
    masked[k] = (uint8_t)(x ^ r_mine.bits[k] ^ got[k]);
  }
  const std::vector<uint8_t> peer_masked = swap_bits(masked, theirs_e.size());
  auto place = [&](const std::vector<Entry>& entries, const AuthShares& r, const std::vector<uint8_t>& pub) {
    for (size_t k = 0; k < entries.size(); ++k) {
      const Entry& e = entries[k];
      const size_t at = w.at(plan.input_slots[e.port][e.bit], e.instance);
      w.bits[at] = r.bits[k];
      w.macs[at] = r.macs[k];
      w.keys[at] = r.keys[k];
      add_public(w, at, pub[k]);
    }
  };
  place(mine_e, r_mine, masked);
  place(theirs_e, r_theirs, peer_masked);
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    const InputPort& port = c.inputs()[p];
    if (port.owner != InputOwner::Carried) continue;
    const CarriedInput& src = in.carried[p];
    const KeptLabels& kept = *src.source;
    for (int bit = 0; bit < port.width; ++bit)
      for (size_t i = 0; i < n; ++i) {
        const size_t j = src.indices.empty() ? i : (size_t)src.indices[i];
        const block* k3 = kept.labels.data() + kKeptBlocks * ((size_t)bit * kept.n + j);
        const size_t at = w.at(plan.input_slots[p][bit], i);
        w.macs[at] = k3[0];
        w.keys[at] = k3[1];
        w.bits[at] = (uint8_t)(low64(k3[2]) & 1);
      }
  }
}

RunOutputs AuthSession::open_outputs(const Circuit& c, const GmwPlan& plan, const AuthWires& w) {
  // Our bits of what the peer learns, with their MACs' digest; the peer's likewise.
  ch_.set_phase(Phase::Outputs);
  const size_t n = w.n;
  RunOutputs out = prepare_outputs(c, n, first());
  const Reveal mine_only = first() ? Reveal::Garbler : Reveal::Evaluator;
  const Reveal peer_only = first() ? Reveal::Evaluator : Reveal::Garbler;
  DeferredMacCheck out_check(*auth_);
  std::vector<uint8_t> send_bits;
  size_t recv_count = 0;
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const Reveal r = c.outputs()[o].reveal;
    if (r == Reveal::Both || r == peer_only)
      for (uint32_t slot : plan.output_slots[o])
        for (size_t i = 0; i < n; ++i) {
          const size_t at = w.at(slot, i);
          uint8_t bit = w.bits[at];
          block mac = w.macs[at];
          if (deviation_.kind == AuthDeviation::Kind::FlipOutput && send_bits.size() == deviation_.index) {
            bit ^= 1;
            mac = xor_block(mac, deviation_.mac_offset);
          }
          send_bits.push_back(bit);
          out_check.sent(mac);
        }
    if (r == Reveal::Both || r == mine_only) recv_count += plan.output_slots[o].size() * n;
  }
  // Our bits of what the peer learns, then the digest of their MACs; the peer's alike.
  std::vector<uint8_t> message = pack_bits(send_bits);
  const std::array<uint8_t, 32> digest = out_check.our_digest();
  message.insert(message.end(), digest.begin(), digest.end());
  const size_t got_bytes = (recv_count + 7) / 8;
  std::vector<uint8_t> heard(got_bytes + 32);
  auth_->exchange(message.data(), message.size(), heard.data(), heard.size());
  std::array<uint8_t, 32> their_digest{};
  std::memcpy(their_digest.data(), heard.data() + got_bytes, 32);
  heard.resize(got_bytes);
  const std::vector<uint8_t> got = unpack_bits(heard, recv_count);
  size_t next = 0;
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const Reveal r = c.outputs()[o].reveal;
    if (r == Reveal::Both || r == mine_only)
      for (uint32_t slot : plan.output_slots[o])
        for (size_t i = 0; i < n; ++i) out_check.received(w.keys[w.at(slot, i)], got[next++]);
  }
  out_check.check_peer(their_digest, "the output shares of this run");

  next = 0;
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const OutputPort& port = c.outputs()[o];
    const Reveal r = port.reveal;
    if (r == Reveal::Keep) {
      auto kept = new_kept(port, n, kKeptBlocks * port.wires.size() * n);
      for (size_t bit = 0; bit < plan.output_slots[o].size(); ++bit)
        for (size_t i = 0; i < n; ++i) {
          const size_t at = w.at(plan.output_slots[o][bit], i);
          block* k3 = kept->labels.data() + kKeptBlocks * (bit * n + i);
          k3[0] = w.macs[at];
          k3[1] = w.keys[at];
          k3[2] = make_block(0, w.bits[at]);
        }
      out.kept[o] = kept;
      continue;
    }
    const bool opened_here = r == Reveal::Both || r == mine_only;
    if (!opened_here && r != Reveal::Shares) continue;
    std::vector<uint64_t>& v = out.values[o];
    for (size_t bit = 0; bit < plan.output_slots[o].size(); ++bit)
      for (size_t i = 0; i < n; ++i) {
        uint8_t b = w.bits[w.at(plan.output_slots[o][bit], i)];
        if (opened_here) b ^= got[next++];
        v[i] |= (uint64_t)(b & 1) << bit;
      }
  }
  return out;
}

}  // namespace gc
