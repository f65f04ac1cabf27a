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

// The prover's side of one statement.
class Prover {
 public:
  // and_base: AND gates this party proved in earlier runs (a cheat's index counts them).
  Prover(const Shape& s, ProofResult& res, const ProofCheat& cheat, size_t and_base)
      : s_(s), res_(res), cheat_(cheat), bc_macs_(s.broadcast_bits), and_base_(and_base) {
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

  // Batch k's corrections (unpacked bits); `shares` from position `pos`. `flip` (a forger's
  // set, indices of the batch's AND gates) may be empty.
  std::vector<uint8_t> batch(size_t k, const AuthShares& sh, size_t pos, const std::vector<size_t>& flip) {
    const Circuit& c = *s_.c;
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
    a0_.resize_for_overwrite(batch_ands);
    a1_.resize_for_overwrite(batch_ands);
    std::vector<uint8_t> flipped(batch_ands, 0);
    for (size_t f : flip) flipped[f] = 1;
    if (cheat_.kind == ProofCheat::Kind::FlipAnd && cheat_.index >= and_base_ &&
        cheat_.index < and_base_ + batch_ands)
      flipped[cheat_.index - and_base_] = 1;
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
            a0_[idx] = gf128_mul(mx, my);
            a1_[idx] = xor_block(xor_block(and_block(my, select_mask(x)), and_block(mx, select_mask(y))), mz);
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
    mask_bits_.assign(sh.bits.begin() + (ptrdiff_t)pos, sh.bits.begin() + (ptrdiff_t)pos + 128);
    mask_macs_ = blocks_element(sh.macs.data() + pos);
    return msg;
  }

  // The answer (U, W) to the verifier's coin for the last batch.
  Answer answer(block coin) {
    const size_t m = a0_.size();
    BlockVector chi;
    expand_coin(coin, m, chi);
    Wide u{zero_block(), zero_block()}, w{zero_block(), zero_block()};
    for (size_t i = 0; i < m; ++i) {
      u = xor_wide(u, clmul_wide(chi[i], a0_[i]));
      w = xor_wide(w, clmul_wide(chi[i], a1_[i]));
    }
    block W = xor_block(gf128_reduce(w), bits_element(mask_bits_.data()));
    if (cheat_.kind == ProofCheat::Kind::FlipAnd && cheat_.index >= and_base_ && cheat_.index < and_base_ + m)
      W = xor_block(W, gf128_mul(chi[cheat_.index - and_base_], cheat_.offset));
    and_base_ += m;
    return Answer{xor_block(gf128_reduce(u), mask_macs_), W};
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
  BlockVector a0_, a1_;
  std::vector<uint8_t> mask_bits_;
  block mask_macs_{};
  OpenedDigest opened_;
  size_t opened_count_ = 0;
  size_t and_base_;
};

// The verifier's side of the peer's statement.
class Verifier {
 public:
  Verifier(const Shape& s, ProofResult& res, block delta)
      : s_(s), res_(res), delta_(delta), bc_keys_(s.broadcast_bits) {
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

  void batch(size_t k, const AuthShares& sh, size_t pos, const std::vector<uint8_t>& msg) {
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

  // The expected answer for the coin, checked against the prover's (U, W).
  void check(block coin, const Answer& uw, size_t k) {
    const size_t m = b_.size();
    BlockVector chi;
    expand_coin(coin, m, chi);
    Wide acc{zero_block(), zero_block()};
    for (size_t i = 0; i < m; ++i) acc = xor_wide(acc, clmul_wide(chi[i], b_[i]));
    const block lhs = xor_block(gf128_reduce(acc), mask_keys_);
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
  // Both sides state both shapes first: a disagreement is a ProtocolError before any proof.
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
    const std::array<uint8_t, 32> ours = h.digest();
    state(g, peer, theirs);
    state(g, me, mine);
    const std::array<uint8_t, 32> expect = g.digest();
    std::array<uint8_t, 32> heard{};
    party_.exchange(ours.data(), 32, heard.data(), 32);
    if (heard != expect)
      throw ProtocolError("the two parties state different proof statements (circuit, sizes or public values)");
  }
  const size_t steps = std::max(me.batches, peer.batches);
  std::vector<uint8_t> pending;  // our answer to the last coin, 32 bytes, sent with the next message
  block their_coin_pending{};
  bool verify_pending = false;
  size_t verify_batch = 0;
  for (size_t k = 0; k < steps; ++k) {
    const size_t need_me = me.shares(k), need_peer = peer.shares(k);
    const AuthShares sh = party_.random(std::max(need_me, need_peer));
    const bool proving = k < me.batches, checking = k < peer.batches;
    std::vector<size_t> forged;
    block my_coin{}, their_coin{};
    auto swap_coins = [&]() {
      uint8_t out[16], in[16];
      my_coin = random_block();
      store_block(out, my_coin);
      party_.exchange(out, checking ? 16 : 0, in, proving ? 16 : 0);
      if (proving) their_coin = load_block(in);
    };
    if (coin_first_) swap_coins();
    if (proving && cheat_.kind == ProofCheat::Kind::ForgeWithEarlyCoin)  // without the coin: a guess
      forged = prover.forge(coin_first_ ? their_coin : random_block(), k);
    std::vector<uint8_t> msg = proving ? prover.batch(k, sh, 0, forged) : std::vector<uint8_t>{};
    std::vector<uint8_t> out = pending;
    const std::vector<uint8_t> packed = pack_bits(msg);
    out.insert(out.end(), packed.begin(), packed.end());
    const size_t their_pending = verify_pending ? 32 : 0;
    std::vector<uint8_t> in(their_pending + (peer.message_bits(k) + 7) / 8);
    party_.exchange(out.data(), out.size(), in.data(), in.size());
    if (verify_pending) {
      verifier.check(their_coin_pending, Answer{load_block(in.data()), load_block(in.data() + 16)}, verify_batch);
      verify_pending = false;
    }
    if (checking) {
      const std::vector<uint8_t> theirs_packed(in.begin() + (ptrdiff_t)their_pending, in.end());
      verifier.batch(k, sh, 0, unpack_bits(theirs_packed, peer.message_bits(k)));
    }
    if (!coin_first_) swap_coins();
    pending.clear();
    if (proving) {
      const Answer uw = prover.answer(their_coin);
      put_block(pending, uw.u);
      put_block(pending, uw.w);
      ands_proved_ += me.instances(k) * me.ands;
    }
    if (checking) {
      their_coin_pending = my_coin;
      verify_pending = true;
      verify_batch = k;
    }
    ++batches_;
  }
  // The last answers and the opened outputs' MAC digests.
  std::vector<uint8_t> out = pending;
  if (me.n) {
    const std::array<uint8_t, 32> dg = prover.opened_digest();
    out.insert(out.end(), dg.begin(), dg.end());
  }
  std::vector<uint8_t> in((verify_pending ? 32 : 0) + (peer.n ? 32 : 0));
  party_.exchange(out.data(), out.size(), in.data(), in.size());
  if (verify_pending) {
    verifier.check(their_coin_pending, Answer{load_block(in.data()), load_block(in.data() + 16)}, verify_batch);
  }
  if (peer.n) {
    std::array<uint8_t, 32> dg;
    std::memcpy(dg.data(), in.data() + (verify_pending ? 32 : 0), 32);
    if (verifier.expected_digest() != dg)
      throw PeerDeviated("the peer opened outputs of its proof whose MACs do not hold (zero-knowledge proof)");
  }
  return {std::move(own), std::move(checked)};
}

}  // namespace gc
