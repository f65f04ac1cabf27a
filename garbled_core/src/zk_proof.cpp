#include "garbled_core/zk_proof.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "garbled_core/gf128.h"
#include "garbled_core/iknp.h"
#include "garbled_core/prg.h"
#include "garbled_core/random.h"
#include "garbled_core/session.h"
#include "garbled_core/sha256.h"

namespace gc {

size_t proof_batch_instances(uint64_t ands) {
  if (ands == 0) return size_t(1) << 20;
  return std::max<size_t>(1, ZkProofs::kAndsPerBatch / ands);
}

namespace {

constexpr char kOpenTag[] = "spgc.zk-proof.open.v1";

// What both parties know of one statement: its ports, sizes and batches.
struct Shape {
  const ProofStatement* st = nullptr;
  const Circuit* c = nullptr;
  size_t n = 0, per_batch = 1, batches = 0;
  uint64_t ands = 0;            // per instance
  uint64_t private_bits = 0;    // per instance, private ports that are not broadcast
  uint64_t broadcast_bits = 0;  // once
  uint64_t opened_bits = 0;     // per instance

  size_t instances(size_t k) const { return std::min(per_batch, n - k * per_batch); }
  // Random shares batch k takes: the broadcast bits (batch 0), each instance's private bits
  // and AND gates, and 128 for the mask.
  size_t shares(size_t k) const {
    if (k >= batches) return 0;
    return (k == 0 ? broadcast_bits : 0) + instances(k) * (private_bits + ands) + 128;
  }
  size_t message_bits(size_t k) const {
    if (k >= batches) return 0;
    return (k == 0 ? broadcast_bits : 0) + instances(k) * (private_bits + ands + opened_bits);
  }
};

Shape shape_of(const ProofStatement& st, bool prover) {
  Shape s;
  s.st = &st;
  s.n = st.n;
  if (st.n == 0) return s;
  if (!st.circuit) throw ProtocolError("a proof statement of n > 0 instances has no circuit");
  const Circuit& c = *st.circuit;
  s.c = &c;
  const size_t ports = c.inputs().size();
  if (st.values.size() != ports || st.broadcast.size() != ports || (!st.carried.empty() && st.carried.size() != ports))
    throw ProtocolError("a proof statement needs values and a broadcast flag for each input port");
  for (size_t p = 0; p < ports; ++p) {
    const InputPort& port = c.inputs()[p];
    const size_t want = st.broadcast[p] ? 1 : st.n;
    if (port.owner == InputOwner::Carried) {
      const AuthShares* from = st.carried.empty() ? nullptr : st.carried[p];
      if (!from || from->size() != want * (size_t)port.width)
        throw ProtocolError("carried input port '" + port.name + "' of a proof needs " +
                            std::to_string(want * (size_t)port.width) + " authenticated bits");
      continue;
    }
    const bool is_private = port.owner == InputOwner::Garbler;
    if (is_private && !prover) {
      if (!st.values[p].empty())
        throw ProtocolError("the verifier holds values of the peer's private port '" + port.name + "'");
    } else if (st.values[p].size() != want) {
      throw ProtocolError("input port '" + port.name + "' of a proof needs " + std::to_string(want) + " values");
    }
    if (is_private) (st.broadcast[p] ? s.broadcast_bits : s.private_bits) += (uint64_t)port.width;
  }
  for (const OutputPort& out : c.outputs()) {
    if (out.reveal == Reveal::Both)
      s.opened_bits += out.wires.size();
    else if (out.reveal != Reveal::Keep)
      throw ProtocolError("output port '" + out.name + "' of a proof is neither opened (both) nor kept");
  }
  s.ands = c.and_count();
  s.per_batch = proof_batch_instances(s.ands);
  s.batches = (st.n + s.per_batch - 1) / s.per_batch;
  return s;
}

// The element sum_j u_j X^j and, alongside, sum_j m_j X^j for 128 authenticated bits.
block bits_element(const uint8_t* bits) {
  uint64_t lo = 0, hi = 0;
  for (int j = 0; j < 64; ++j) lo |= (uint64_t)(bits[j] & 1) << j;
  for (int j = 0; j < 64; ++j) hi |= (uint64_t)(bits[64 + j] & 1) << j;
  return make_block(hi, lo);
}

block blocks_element(const block* m) {
  Wide acc{zero_block(), zero_block()};
  for (int j = 0; j < 128; ++j) {
    const block xj = j < 64 ? make_block(0, uint64_t(1) << j) : make_block(uint64_t(1) << (j - 64), 0);
    acc = xor_wide(acc, clmul_wide(m[j], xj));
  }
  return gf128_reduce(acc);
}

void expand_coin(block coin, size_t count, BlockVector& chi) {
  chi.resize_for_overwrite(count);
  Prg prg(coin);
  prg.fill(chi.data(), count);
}

// SHA-256 of the MACs of a proof's opened outputs, in the order they were opened.
class OpenedDigest {
 public:
  OpenedDigest() { h_.update(kOpenTag, sizeof kOpenTag); }
  void add(block mac) {
    uint8_t t[16];
    store_block(t, mac);
    h_.update(t, 16);
  }
  std::array<uint8_t, 32> digest() { return h_.digest(); }

 private:
  Sha256 h_;
};

// A batch's answer: U and W.
struct Answer {
  block u, w;
};

// A nonempty subset of the first m (<= 129) elements whose XOR is zero (Gaussian elimination
// over GF(2)^128): the forger's choice when it knows chi before it commits.
std::vector<size_t> zero_sum_subset(const block* chi, size_t m) {
  struct Row {
    uint64_t v[2];
    uint64_t sel[3];
  };
  std::vector<Row> basis;
  for (size_t i = 0; i < m; ++i) {
    Row r{{low64(chi[i]), high64(chi[i])}, {0, 0, 0}};
    r.sel[i / 64] |= uint64_t(1) << (i % 64);
    for (const Row& b : basis) {
      // b's pivot: its lowest set bit
      int pivot = b.v[0] ? __builtin_ctzll(b.v[0]) : 64 + __builtin_ctzll(b.v[1]);
      if ((r.v[pivot / 64] >> (pivot % 64)) & 1) {
        r.v[0] ^= b.v[0], r.v[1] ^= b.v[1];
        for (int w = 0; w < 3; ++w) r.sel[w] ^= b.sel[w];
      }
    }
    if (r.v[0] == 0 && r.v[1] == 0) {
      std::vector<size_t> out;
      for (size_t j = 0; j <= i; ++j)
        if ((r.sel[j / 64] >> (j % 64)) & 1) out.push_back(j);
      return out;
    }
    // keep the basis reduced at the new pivot
    int pivot = r.v[0] ? __builtin_ctzll(r.v[0]) : 64 + __builtin_ctzll(r.v[1]);
    for (Row& b : basis)
      if ((b.v[pivot / 64] >> (pivot % 64)) & 1) {
        b.v[0] ^= r.v[0], b.v[1] ^= r.v[1];
        for (int w = 0; w < 3; ++w) b.sel[w] ^= r.sel[w];
      }
    basis.push_back(r);
  }
  return {};
}

// A result's opened values and kept shares, zero, sized for the statement.
void size_result(const Shape& s, ProofResult& res) {
  if (!s.c) return;
  res.opened.resize(s.c->outputs().size());
  res.kept.resize(s.c->outputs().size());
  for (size_t o = 0; o < s.c->outputs().size(); ++o) {
    const OutputPort& out = s.c->outputs()[o];
    if (out.reveal == Reveal::Both) res.opened[o].assign(s.n, 0);
    if (out.reveal == Reveal::Keep) {
      const size_t m = out.wires.size() * s.n;
      res.kept[o].bits.assign(m, 0);
      res.kept[o].macs.resize(m);
      res.kept[o].keys.resize(m);
    }
  }
}

// The prover's side of one statement.
class Prover {
 public:
  // and_base: AND gates this party proved in earlier runs (a cheat's index counts them).
  Prover(const Shape& s, ProofResult& res, const ProofCheat& cheat, size_t and_base)
      : s_(s), res_(res), cheat_(cheat), bc_macs_(s.broadcast_bits), next_and_(and_base) {
    size_result(s, res);
  }

  // Batch k's corrections (unpacked bits) from the batch's random shares `sh`, read in order.
  // `flip` (a forger's set, indices of the batch's AND gates) may be empty.
  std::vector<uint8_t> batch(size_t k, const AuthShares& sh, const std::vector<size_t>& flip) {
    const Circuit& c = *s_.c;
    size_t pos = 0;
    const ProofStatement& st = *s_.st;
    const size_t cn = s_.instances(k), base = k * s_.per_batch;
    std::vector<uint8_t> msg;
    msg.reserve(s_.message_bits(k));
    if (k == 0) {  // broadcast private ports, authenticated once
      for (size_t p = 0; p < c.inputs().size(); ++p) {
        if (c.inputs()[p].owner != InputOwner::Garbler || !st.broadcast[p]) continue;
        for (int j = 0; j < c.inputs()[p].width; ++j, ++pos) {
          const uint8_t x = (st.values[p][0] >> j) & 1;
          msg.push_back(x ^ sh.bits[pos]);
          bc_macs_[bc_bits_.size()] = sh.macs[pos];
          bc_bits_.push_back(x);
        }
      }
    }
    std::vector<uint8_t> bits((size_t)c.num_slots() * cn, 0);
    BlockVector macs((size_t)c.num_slots() * cn);  // zero: slot 0 is the constant
    size_t bc = 0;
    for (size_t p = 0; p < c.inputs().size(); ++p) {
      const InputPort& port = c.inputs()[p];
      const std::vector<uint32_t>& slots = c.input_slots()[p];
      const bool is_private = port.owner == InputOwner::Garbler;
      for (int j = 0; j < port.width; ++j) {
        const size_t at = (size_t)slots[(size_t)j] * cn;
        if (port.owner == InputOwner::Carried) {
          const AuthShares& from = *st.carried[p];
          const size_t m = st.broadcast[p] ? 1 : s_.n;
          for (size_t i = 0; i < cn; ++i) {
            const size_t e = (size_t)j * m + (st.broadcast[p] ? 0 : base + i);
            bits[at + i] = from.bits[e];
            macs[at + i] = from.macs[e];
          }
          continue;
        }
        if (is_private && st.broadcast[p]) {
          for (size_t i = 0; i < cn; ++i) bits[at + i] = bc_bits_[bc], macs[at + i] = bc_macs_[bc];
          ++bc;
          continue;
        }
        for (size_t i = 0; i < cn; ++i) {
          const uint64_t v = st.values[p][st.broadcast[p] ? 0 : base + i];
          const uint8_t x = (v >> j) & 1;
          bits[at + i] = x;
          if (is_private) {
            msg.push_back(x ^ sh.bits[pos]);
            macs[at + i] = sh.macs[pos++];
          }
        }
      }
    }
    const size_t batch_ands = cn * s_.ands;
    Held& held = held_[k % 2];  // batch k - 1's stays until its coin comes
    held.and_base = next_and_;
    next_and_ += batch_ands;
    BlockVector& a0 = held.a0;
    BlockVector& a1 = held.a1;
    a0.resize_for_overwrite(batch_ands);
    a1.resize_for_overwrite(batch_ands);
    std::vector<uint8_t> flipped(batch_ands, 0);
    for (size_t f : flip) flipped[f] = 1;
    if (cheat_.kind == ProofCheat::Kind::FlipAnd && cheat_.index >= held.and_base &&
        cheat_.index < held.and_base + batch_ands)
      flipped[cheat_.index - held.and_base] = 1;
    size_t idx = 0;
    for (const SlotGate& g : c.gates()) {
      const size_t a = (size_t)g.a * cn, b = (size_t)g.b * cn, o = (size_t)g.out * cn;
      switch (g.op) {
        case GateOp::Xor:
          for (size_t i = 0; i < cn; ++i) {
            bits[o + i] = bits[a + i] ^ bits[b + i];
            macs[o + i] = xor_block(macs[a + i], macs[b + i]);
          }
          break;
        case GateOp::Not:
          for (size_t i = 0; i < cn; ++i) {
            bits[o + i] = bits[a + i] ^ 1;
            macs[o + i] = macs[a + i];
          }
          break;
        case GateOp::And:
          for (size_t i = 0; i < cn; ++i, ++idx, ++pos) {
            const uint8_t x = bits[a + i], y = bits[b + i];
            const block mx = macs[a + i], my = macs[b + i];
            const uint8_t z = (uint8_t)((x & y) ^ flipped[idx]);
            const block mz = sh.macs[pos];
            msg.push_back(z ^ sh.bits[pos]);
            a0[idx] = gf128_mul(mx, my);
            a1[idx] = xor_block(xor_block(and_block(my, select_mask(x)), and_block(mx, select_mask(y))), mz);
            bits[o + i] = z;
            macs[o + i] = mz;
          }
          break;
      }
    }
    for (size_t o = 0; o < c.outputs().size(); ++o) {
      const OutputPort& out = c.outputs()[o];
      for (size_t j = 0; j < out.slots.size(); ++j) {
        const size_t at = (size_t)out.slots[j] * cn;
        for (size_t i = 0; i < cn; ++i) {
          if (out.reveal == Reveal::Both) {
            uint8_t bit = bits[at + i];
            block mac = macs[at + i];
            if (cheat_.kind == ProofCheat::Kind::FlipOpened && opened_count_ == cheat_.index) {
              bit ^= 1;
              mac = xor_block(mac, cheat_.offset);
            }
            ++opened_count_;
            msg.push_back(bit);
            opened_.add(mac);
            res_.opened[o][base + i] |= (uint64_t)bit << j;
          } else {
            const size_t e = j * s_.n + base + i;
            res_.kept[o].bits[e] = bits[at + i];
            res_.kept[o].macs[e] = macs[at + i];
          }
        }
      }
    }
    held.mask_value = bits_element(sh.bits.data() + pos);
    held.mask_macs = blocks_element(sh.macs.data() + pos);
    return msg;
  }

  // The answer (U, W) to the verifier's coin for batch k (this one or the one before it).
  Answer answer(block coin, size_t k) {
    const Held& held = held_[k % 2];
    const BlockVector& a0_ = held.a0;
    const BlockVector& a1_ = held.a1;
    const size_t m = a0_.size();
    BlockVector chi;
    expand_coin(coin, m, chi);
    Wide u{zero_block(), zero_block()}, w{zero_block(), zero_block()};
    for (size_t i = 0; i < m; ++i) {
      u = xor_wide(u, clmul_wide(chi[i], a0_[i]));
      w = xor_wide(w, clmul_wide(chi[i], a1_[i]));
    }
    block W = xor_block(gf128_reduce(w), held.mask_value);
    const size_t base = held.and_base;
    if (cheat_.kind == ProofCheat::Kind::FlipAnd && cheat_.index >= base && cheat_.index < base + m)
      W = xor_block(W, gf128_mul(chi[cheat_.index - base], cheat_.offset));
    return Answer{xor_block(gf128_reduce(u), held.mask_macs), W};
  }

  // Chi of the batch about to be proved (the forger's early look).
  std::vector<size_t> forge(block coin, size_t k) const {
    const size_t m = std::min<size_t>(129, s_.instances(k) * s_.ands);
    BlockVector chi;
    expand_coin(coin, m, chi);
    return zero_sum_subset(chi.data(), m);
  }

  std::array<uint8_t, 32> opened_digest() { return opened_.digest(); }

 private:
  const Shape& s_;
  ProofResult& res_;
  const ProofCheat& cheat_;
  std::vector<uint8_t> bc_bits_;
  BlockVector bc_macs_;
  // What a batch's answer needs: its A0 and A1 and its mask (v*, M*), kept until its coin.
  struct Held {
    BlockVector a0, a1;
    block mask_value{}, mask_macs{};
    size_t and_base = 0;  // its first AND gate, counted over this party's proofs
  };
  Held held_[2];
  size_t next_and_;
  OpenedDigest opened_;
  size_t opened_count_ = 0;
};

// The verifier's side of the peer's statement.
class Verifier {
 public:
  Verifier(const Shape& s, ProofResult& res, block delta)
      : s_(s), res_(res), delta_(delta), bc_keys_(s.broadcast_bits) {
    size_result(s, res);
  }

  void batch(size_t k, const AuthShares& sh, const std::vector<uint8_t>& msg) {
    size_t pos = 0;
    const Circuit& c = *s_.c;
    const ProofStatement& st = *s_.st;
    const size_t cn = s_.instances(k), base = k * s_.per_batch;
    size_t at_msg = 0;
    const block d = delta_;
    auto moved = [&](block key, uint8_t bit) { return xor_block(key, and_block(d, select_mask(bit))); };
    if (k == 0) {
      for (size_t p = 0; p < c.inputs().size(); ++p) {
        if (c.inputs()[p].owner != InputOwner::Garbler || !st.broadcast[p]) continue;
        for (int j = 0; j < c.inputs()[p].width; ++j, ++pos, ++bc_set_) bc_keys_[bc_set_] = moved(sh.keys[pos], msg[at_msg++]);
      }
    }
    BlockVector keys((size_t)c.num_slots() * cn);
    size_t bc = 0;
    for (size_t p = 0; p < c.inputs().size(); ++p) {
      const InputPort& port = c.inputs()[p];
      const std::vector<uint32_t>& slots = c.input_slots()[p];
      const bool is_private = port.owner == InputOwner::Garbler;
      for (int j = 0; j < port.width; ++j) {
        const size_t at = (size_t)slots[(size_t)j] * cn;
        if (port.owner == InputOwner::Carried) {
          const AuthShares& from = *st.carried[p];
          const size_t m = st.broadcast[p] ? 1 : s_.n;
          for (size_t i = 0; i < cn; ++i) keys[at + i] = from.keys[(size_t)j * m + (st.broadcast[p] ? 0 : base + i)];
          continue;
        }
        if (is_private && st.broadcast[p]) {
          for (size_t i = 0; i < cn; ++i) keys[at + i] = bc_keys_[bc];
          ++bc;
          continue;
        }
        for (size_t i = 0; i < cn; ++i) {
          if (is_private) {
            keys[at + i] = moved(sh.keys[pos++], msg[at_msg++]);
          } else {
            const uint64_t v = st.values[p][st.broadcast[p] ? 0 : base + i];
            keys[at + i] = and_block(d, select_mask((v >> j) & 1));
          }
        }
      }
    }
    b_.resize_for_overwrite(cn * s_.ands);
    size_t idx = 0;
    for (const SlotGate& g : c.gates()) {
      const size_t a = (size_t)g.a * cn, b = (size_t)g.b * cn, o = (size_t)g.out * cn;
      switch (g.op) {
        case GateOp::Xor:
          for (size_t i = 0; i < cn; ++i) keys[o + i] = xor_block(keys[a + i], keys[b + i]);
          break;
        case GateOp::Not:
          for (size_t i = 0; i < cn; ++i) keys[o + i] = xor_block(keys[a + i], d);
          break;
        case GateOp::And:
          for (size_t i = 0; i < cn; ++i, ++idx) {
            const block kz = moved(sh.keys[pos++], msg[at_msg++]);
            b_[idx] = gf128_reduce(xor_wide(clmul_wide(keys[a + i], keys[b + i]), clmul_wide(kz, d)));
            keys[o + i] = kz;
          }
          break;
      }
    }
    for (size_t o = 0; o < c.outputs().size(); ++o) {
      const OutputPort& out = c.outputs()[o];
      for (size_t j = 0; j < out.slots.size(); ++j) {
        const size_t at = (size_t)out.slots[j] * cn;
        for (size_t i = 0; i < cn; ++i) {
          if (out.reveal == Reveal::Both) {
            const uint8_t bit = msg[at_msg++];
            expected_.add(moved(keys[at + i], bit));
            res_.opened[o][base + i] |= (uint64_t)bit << j;
          } else {
            res_.kept[o].keys[j * s_.n + base + i] = keys[at + i];
          }
        }
      }
    }
    mask_keys_ = blocks_element(sh.keys.data() + pos);
  }

  // What the answer to `coin` must give for the last batch: sum chi_i B_i ^ K* (computed as
  // the coin is drawn, so that the batch's B can go).
  block expect(block coin) const {
    const size_t m = b_.size();
    BlockVector chi;
    expand_coin(coin, m, chi);
    Wide acc{zero_block(), zero_block()};
    for (size_t i = 0; i < m; ++i) acc = xor_wide(acc, clmul_wide(chi[i], b_[i]));
    return xor_block(gf128_reduce(acc), mask_keys_);
  }

  // The prover's (U, W) for batch k against expect()'s value.
  void check(block lhs, const Answer& uw, size_t k) const {
    const block rhs = xor_block(uw.u, gf128_mul(uw.w, delta_));
    if (!equal_block(lhs, rhs))
      throw PeerDeviated("the peer's proof does not hold: an AND gate of batch " + std::to_string(k) +
                         " is wrong (zero-knowledge proof)");
  }

  std::array<uint8_t, 32> expected_digest() { return expected_.digest(); }

 private:
  const Shape& s_;
  ProofResult& res_;
  block delta_;
  BlockVector bc_keys_;
  size_t bc_set_ = 0;
  BlockVector b_;
  block mask_keys_{};
  OpenedDigest expected_;
};

void put_block(std::vector<uint8_t>& out, block b) {
  uint8_t t[16];
  store_block(t, b);
  out.insert(out.end(), t, t + 16);
}

}  // namespace

std::pair<ProofResult, ProofResult> ZkProofs::run(const ProofStatement& mine, const ProofStatement& theirs) {
  const Shape me = shape_of(mine, true), peer = shape_of(theirs, false);
  ProofResult own, checked;
  Prover prover(me, own, cheat_, ands_proved_);
  Verifier verifier(peer, checked, party_.delta());
  // Both sides state both shapes with their first message (or alone, when the verifier's coin
  // goes first): a disagreement is a ProtocolError before any proof is read.
  std::array<uint8_t, 32> ours{}, expect{};
  {
    auto state = [](Sha256& h, const Shape& s, const ProofStatement& st) {
      const uint64_t facts[5] = {s.n, s.ands, s.private_bits, s.broadcast_bits, s.opened_bits};
      h.update(facts, sizeof facts);
      if (s.c) h.update(s.c->digest().data(), 32);
      for (size_t p = 0; s.c && p < s.c->inputs().size(); ++p) {
        const uint8_t flag = st.broadcast[p] ? 1 : 0;
        h.update(&flag, 1);
        if (s.c->inputs()[p].owner == InputOwner::Evaluator)
          h.update(st.values[p].data(), st.values[p].size() * sizeof(uint64_t));
      }
    };
    Sha256 h, g;
    state(h, me, mine);
    state(h, peer, theirs);
    ours = h.digest();
    state(g, peer, theirs);
    state(g, me, mine);
    expect = g.digest();
  }
  auto refuse = []() {
    throw ProtocolError("the two parties state different proof statements (circuit, sizes or public values)");
  };
  bool header_pending = true;
  // One exchange: ours out, `their_len` bytes of the peer's in. The first also carries the
  // statements' digest and the message's length, checked before the message is read.
  auto swap = [&](const std::vector<uint8_t>& out, size_t their_len) {
    std::vector<uint8_t> in(their_len);
    if (!header_pending) {
      party_.exchange(out.data(), out.size(), in.data(), their_len);
      return in;
    }
    header_pending = false;
    std::vector<uint8_t> msg(40);
    std::memcpy(msg.data(), ours.data(), 32);
    uint64_t len = out.size();
    if (cheat_.kind == ProofCheat::Kind::MisstateLength) len += cheat_.index;  // digest still right
    std::memcpy(msg.data() + 32, &len, 8);
    msg.insert(msg.end(), out.begin(), out.end());
    if (cheat_.kind == ProofCheat::Kind::MisstateLength) msg.resize(40 + len, 0);  // as stated
    uint8_t head[40];
    party_.exchange(msg.data(), msg.size(), head, 40);
    uint64_t heard_len = 0;
    std::memcpy(&heard_len, head + 32, 8);
    if (std::memcmp(head, expect.data(), 32) != 0 || heard_len != their_len) refuse();
    party_.channel().recv(in.data(), their_len);
    party_.log_received(in.data(), their_len);
    return in;
  };
  if (coin_first_) swap({}, 0);  // the statements alone: the coins come before any message
  // Message j (j = 0 .. S + 1) carries: the coin for the peer's batch j - 1, drawn after it
  // came (unless the coins go first); the answer to the coin for our batch j - 2; our batch j;
  // and, last, the opened outputs' digest. So a batch costs one exchange, and two finish.
  const size_t S = std::max(me.batches, peer.batches);
  BlockVector my_coin(S), their_coin(S);  // for the peer's batch j / for ours
  auto coins_before = [&](size_t j) { return !coin_first_ && j >= 1; };
  auto their_len = [&](size_t j) {
    size_t len = 0;
    if (coins_before(j) && j - 1 < me.batches) len += 16;
    if (j >= 2 && j - 2 < peer.batches) len += 32;
    if (j < peer.batches) len += (peer.message_bits(j) + 7) / 8;
    if (j == S + 1 && peer.n) len += 32;
    return len;
  };
  std::vector<uint8_t> answer_out;  // ours to the coin for our batch j - 2, 32 bytes
  block lhs_pending{};              // what the peer's answer for its batch j - 2 must give
  for (size_t j = 0; j <= S + 1; ++j) {
    const bool proving = j < me.batches, checking = j < peer.batches;
    AuthShares sh;
    if (j < S) sh = party_.random(std::max(me.shares(j), peer.shares(j)));
    if (coin_first_ && j < S) {  // the broken order of the control test
      uint8_t coin[16];
      my_coin[j] = random_block();
      store_block(coin, my_coin[j]);
      const std::vector<uint8_t> in = swap(std::vector<uint8_t>(coin, coin + (checking ? 16 : 0)), proving ? 16 : 0);
      if (proving) their_coin[j] = load_block(in.data());
    }
    std::vector<uint8_t> out;
    block lhs_next{};
    if (coins_before(j) && j - 1 < peer.batches) {  // after the peer's batch j - 1 came
      my_coin[j - 1] = random_block();
      uint8_t coin[16];
      store_block(coin, my_coin[j - 1]);
      out.insert(out.end(), coin, coin + 16);
    }
    if (j >= 1 && j - 1 < peer.batches) lhs_next = verifier.expect(my_coin[j - 1]);
    out.insert(out.end(), answer_out.begin(), answer_out.end());
    answer_out.clear();
    if (proving) {
      std::vector<size_t> forged;
      if (cheat_.kind == ProofCheat::Kind::ForgeWithEarlyCoin)  // without the coin: a guess
        forged = prover.forge(coin_first_ ? their_coin[j] : random_block(), j);
      const std::vector<uint8_t> packed = pack_bits(prover.batch(j, sh, forged));
      out.insert(out.end(), packed.begin(), packed.end());
      ands_proved_ += me.instances(j) * me.ands;
      ++batches_;
    }
    if (j == S + 1 && me.n) {
      const std::array<uint8_t, 32> dg = prover.opened_digest();
      out.insert(out.end(), dg.begin(), dg.end());
    }
    const std::vector<uint8_t> in = swap(out, their_len(j));
    size_t at = 0;
    if (coins_before(j) && j - 1 < me.batches) {
      their_coin[j - 1] = load_block(in.data());
      at += 16;
    }
    if (j >= 2 && j - 2 < peer.batches) {
      verifier.check(lhs_pending, Answer{load_block(in.data() + at), load_block(in.data() + at + 16)}, j - 2);
      at += 32;
    }
    if (checking) {
      const std::vector<uint8_t> theirs_packed(in.begin() + (ptrdiff_t)at,
                                               in.begin() + (ptrdiff_t)(at + (peer.message_bits(j) + 7) / 8));
      verifier.batch(j, sh, unpack_bits(theirs_packed, peer.message_bits(j)));
      at += theirs_packed.size();
    }
    if (j == S + 1 && peer.n) {
      std::array<uint8_t, 32> dg;
      std::memcpy(dg.data(), in.data() + at, 32);
      if (verifier.expected_digest() != dg)
        throw PeerDeviated("the peer opened outputs of its proof whose MACs do not hold (zero-knowledge proof)");
    }
    lhs_pending = lhs_next;
    if (j >= 1 && j - 1 < me.batches) {  // the coin for our batch j - 1 is here
      const Answer uw = prover.answer(their_coin[j - 1], j - 1);
      put_block(answer_out, uw.u);
      put_block(answer_out, uw.w);
    }
  }
  return {std::move(own), std::move(checked)};
}

}  // namespace gc
