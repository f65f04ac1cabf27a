// Authenticated garbling: the gates (see auth_garble.h; the rest of a run is auth_session.cpp).
#include "garbled_core/auth_garble.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "garbled_core/iknp.h"

namespace gc {

namespace {

// Memory a chunk of instances may hold while its tables are made: per AND gate and instance
// four authenticated shares (l_u, l_v, l_w, l_u l_v) and a triple, about 240 bytes.
constexpr size_t kChunkBudget = size_t(256) << 20;
constexpr size_t kBytesPerAnd = 240;

// Where a gate instance's table puts each row: row 0 is its MAC alone (its label part is zero:
// the output's zero-label is chosen so, row reduction), rows 1 to 3 a label part and a MAC, then
// the four bits r^A.
inline size_t label_at(int row) { return kAuthMacBytes + (size_t)(row - 1) * kAuthRowBytes; }
inline size_t mac_at(int row) { return row == 0 ? 0 : label_at(row) + 16; }
constexpr size_t kBitsAt = kAuthMacBytes + 3 * kAuthRowBytes;
static_assert(kBitsAt + 1 == kAuthTableBytes, "table layout");

inline block tweak(uint32_t run, size_t gate, size_t instance, int row, int half, int side) {
  return make_block(((uint64_t)run << 32) | (uint32_t)gate,
                    ((uint64_t)instance << 4) | (uint64_t)(row << 2) | (uint64_t)(half << 1) | (uint64_t)side);
}

// The four shares a gate's rows are made of, at entry q: [l_u l_v], [l_v], [l_u], [l_w].
struct GateShares {
  AuthWires uv, v, u, w;
  GateShares(size_t gates, size_t m) : uv(gates, m), v(gates, m), u(gates, m), w(gates, m) {}
  // [r_ab] without the public alpha beta: the bit, MAC and key of this party's side.
  uint8_t bit(size_t q, int alpha, int beta) const {
    return uv.bits[q] ^ (uint8_t)(alpha & v.bits[q]) ^ (uint8_t)(beta & u.bits[q]) ^ w.bits[q];
  }
  block mac(size_t q, int alpha, int beta) const {
    return xor_block(xor_block(uv.macs[q], w.macs[q]),
                     xor_block(and_block(select_mask(alpha), v.macs[q]), and_block(select_mask(beta), u.macs[q])));
  }
  block key(size_t q, int alpha, int beta) const {
    return xor_block(xor_block(uv.keys[q], w.keys[q]),
                     xor_block(and_block(select_mask(alpha), v.keys[q]), and_block(select_mask(beta), u.keys[q])));
  }
};

// The tweaks of one gate instance: (run, gate) high, (instance, row, output block, side) low.
struct GateTweak {
  uint32_t run;
  size_t gate, instance;
  block at(int row, int half, int side) const { return tweak(run, gate, instance, row, half, side); }
};

// H1: the table of one gate instance (kAuthTableBytes at `table`) from the input zero-labels;
// returns the output's zero-label (fixed by row reduction). `flip` (a test's cheater) flips r^A
// in every row and XORs `flip_mac` into its MACs.
block garble_gate(const AesKey& key, block delta, block lu0, block lv0, const GateShares& gs, size_t q,
                  const GateTweak& tw, bool flip, block flip_mac, uint8_t* table) {
  block pi[4] = {lu0, xor_block(lu0, delta), lv0, xor_block(lv0, delta)};
  aes_encrypt_blocks<4>(key, pi);
  block h[16];
  for (int row = 0; row < 4; ++row) {
    const int alpha = row >> 1, beta = row & 1;
    for (int half = 0; half < 2; ++half) {
      h[4 * row + 2 * half] = xor_block(pi[alpha], tw.at(row, half, 0));
      h[4 * row + 2 * half + 1] = xor_block(pi[2 + beta], tw.at(row, half, 1));
    }
  }
  aes_encrypt_blocks<16>(key, h);
  uint8_t r_bits = 0;
  block l0 = zero_block();
  for (int row = 0; row < 4; ++row) {
    const int alpha = row >> 1, beta = row & 1;
    const block pad0 = xor_block(xor_block(h[4 * row], pi[alpha]), xor_block(h[4 * row + 1], pi[2 + beta]));
    const block pad1 = xor_block(xor_block(h[4 * row + 2], pi[alpha]), xor_block(h[4 * row + 3], pi[2 + beta]));
    uint8_t r_a = gs.bit(q, alpha, beta) ^ (uint8_t)(alpha & beta);  // A is first: it holds the constant
    block mac = gs.mac(q, alpha, beta);
    if (flip) {
      r_a ^= 1;
      mac = xor_block(mac, flip_mac);
    }
    // The label part L_{w,0} ^ r^A Delta_A ^ K_A[r^B]; row 0's is the pad itself, which fixes
    // L_{w,0} (pseudorandom to H2 unless it holds both input zero-labels).
    const block part = xor_block(and_block(select_mask(r_a), delta), gs.key(q, alpha, beta));
    if (row == 0)
      l0 = xor_block(pad0, part);
    else
      store_block(table + label_at(row), xor_block(xor_block(l0, part), pad0));
    const uint64_t m64 = high64(mac) ^ low64(pad1);
    std::memcpy(table + mac_at(row), &m64, 8);
    r_bits |= (uint8_t)(((r_a ^ (high64(pad1) & 1)) & 1) << row);
  }
  table[kBitsAt] = r_bits;
  return l0;
}

// H2: row (alpha, beta) of one gate instance's table under its input labels lu, lv. False when
// r^A does not carry its MAC; else the masked output z and its label.
bool evaluate_gate(const AesKey& key, block delta, block lu, block lv, int alpha, int beta, const GateShares& gs,
                   size_t q, const GateTweak& tw, const uint8_t* table, uint8_t& z, block& label) {
  const int row = 2 * alpha + beta;
  block pi[2] = {lu, lv};
  aes_encrypt_blocks<2>(key, pi);
  block h[4] = {xor_block(pi[0], tw.at(row, 0, 0)), xor_block(pi[1], tw.at(row, 0, 1)),
                xor_block(pi[0], tw.at(row, 1, 0)), xor_block(pi[1], tw.at(row, 1, 1))};
  aes_encrypt_blocks<4>(key, h);
  const block pad0 = xor_block(xor_block(h[0], pi[0]), xor_block(h[1], pi[1]));
  const block pad1 = xor_block(xor_block(h[2], pi[0]), xor_block(h[3], pi[1]));
  const block x = row == 0 ? pad0 : xor_block(load_block(table + label_at(row)), pad0);
  uint64_t m64;
  std::memcpy(&m64, table + mac_at(row), 8);
  m64 ^= low64(pad1);
  const uint8_t r_a = (uint8_t)(((table[kBitsAt] >> row) ^ high64(pad1)) & 1);
  // The MAC of r^A under our key (the public alpha beta moved our key: we are second).
  block expect = gs.key(q, alpha, beta);
  if (alpha & beta) expect = xor_block(expect, delta);
  if (r_a) expect = xor_block(expect, delta);
  if (high64(expect) != m64) return false;
  z = r_a ^ gs.bit(q, alpha, beta);
  label = xor_block(x, gs.mac(q, alpha, beta));
  return true;
}

}  // namespace

AuthGarbleParty::AuthGarbleParty(Channel& ch, int party, int rho, AuthCots cots, size_t triple_batch)
    : AuthSession(ch, party, rho, cots, triple_batch, "SPGCAGG", "authenticated garbling") {}

AuthGarbleParty::~AuthGarbleParty() = default;

void AuthGarbleParty::after_setup() {
  hash_key_ = aes_key(coin_toss(*auth_, "garbling hash key"));
}

void AuthGarbleParty::evaluate(const Circuit& c, const GmwPlan& plan, AuthWires& w, DeferredMacCheck& check) {
  const size_t n = w.n, ands = c.and_count();
  const bool garbler = first();
  const block delta = auth_->delta();
  const size_t per_instance = std::max<size_t>(ands, 1) * kBytesPerAnd + plan.slots * 64;
  const size_t chunk = std::max<size_t>(64, kChunkBudget / per_instance);
  const size_t chunks = n ? (n + chunk - 1) / chunk : 0;
  plan_triple_security(chunks, ands * n);
  rows_sent_ = 0;
  size_t opened = 0;  // bits this party opened so far in the run (for the test hooks)

  for (size_t i0 = 0; i0 < n; i0 += chunk) {
    const size_t m = std::min(chunk, n - i0);
    // Per slot and instance of the chunk: the mask's shares, and A's zero-label or B's z and label.
    AuthWires lam(plan.slots, m);
    BlockVector label(plan.slots * m);
    std::vector<uint8_t> z(garbler ? 0 : plan.slots * m, 0);
    for (const auto& port_slots : plan.input_slots)
      for (uint32_t s : port_slots)
        for (size_t k = 0; k < m; ++k) {
          const size_t from = w.at(s, i0 + k), e = lam.at(s, k);
          if (garbler) {  // l_A = a (its MAC as is), l_B = 0 (key 0), L_{w,0} = K_A[b]
            lam.bits[e] = w.bits[from];
            lam.macs[e] = w.macs[from];
            lam.keys[e] = zero_block();
            label[e] = w.keys[from];
          } else {  // l_B = 0 (MAC 0), its key of a; z = b, L_{w,z} = M_B[b]
            lam.bits[e] = 0;
            lam.macs[e] = zero_block();
            lam.keys[e] = w.keys[from];
            z[e] = w.bits[from];
            label[e] = w.macs[from];
          }
        }

    // 1. The masks: XOR wires' from earlier ones, AND outputs' fresh; [l_u l_v] from triples.
    GateShares gs(ands, m);
    AuthShares fresh;
    AuthTriples tr;
    if (ands) {
      fresh = auth_->random(ands * m);
      tr = take_triples(ands * m);
    }
    for (const GmwPlan::Stage& st : plan.stages) {
      apply_local_gates(plan, st, lam);  // NOT flips the mask
      for (size_t j = st.and_begin; j < st.and_end; ++j) {
        const GmwPlan::Op& op = plan.ops[j];
        const size_t g = st.member_base + (j - st.and_begin);
        for (size_t i = 0; i < m; ++i) {
          const size_t q = gs.u.at((uint32_t)g, i), a = lam.at(op.a, i), b = lam.at(op.b, i);
          gs.u.bits[q] = lam.bits[a], gs.u.macs[q] = lam.macs[a], gs.u.keys[q] = lam.keys[a];
          gs.v.bits[q] = lam.bits[b], gs.v.macs[q] = lam.macs[b], gs.v.keys[q] = lam.keys[b];
        }
      }
      // Outputs only after every input of the layer was read (an output may reuse an input's slot).
      for (size_t j = st.and_begin; j < st.and_end; ++j) {
        const GmwPlan::Op& op = plan.ops[j];
        const size_t g = st.member_base + (j - st.and_begin);
        for (size_t i = 0; i < m; ++i) {
          const size_t q = gs.w.at((uint32_t)g, i), o = lam.at(op.out, i);
          gs.w.bits[q] = lam.bits[o] = fresh.bits[q];
          gs.w.macs[q] = lam.macs[o] = fresh.macs[q];
          gs.w.keys[q] = lam.keys[o] = fresh.keys[q];
        }
      }
    }
    if (ands) {
      // d = l_u ^ a, e = l_v ^ b for every gate and instance of the chunk, one exchange.
      const size_t T = ands * m;
      std::vector<uint8_t> ours(2 * T);
      for (size_t q = 0; q < T; ++q) {
        ours[2 * q] = gs.u.bits[q] ^ tr.a.bits[q];
        ours[2 * q + 1] = gs.v.bits[q] ^ tr.b.bits[q];
        block mac_d = xor_block(gs.u.macs[q], tr.a.macs[q]), mac_e = xor_block(gs.v.macs[q], tr.b.macs[q]);
        if (deviation_.kind == AuthDeviation::Kind::FlipOpening) {
          if (opened + 2 * q == deviation_.index) {
            ours[2 * q] ^= 1;
            mac_d = xor_block(mac_d, deviation_.mac_offset);
          } else if (opened + 2 * q + 1 == deviation_.index) {
            ours[2 * q + 1] ^= 1;
            mac_e = xor_block(mac_e, deviation_.mac_offset);
          }
        }
        check.sent(mac_d);
        check.sent(mac_e);
      }
      opened += ours.size();
      const std::vector<uint8_t> theirs = swap_bits(ours, ours.size());
      ++layers_;
      for (size_t q = 0; q < T; ++q) {
        check.received(xor_block(gs.u.keys[q], tr.a.keys[q]), theirs[2 * q]);
        check.received(xor_block(gs.v.keys[q], tr.b.keys[q]), theirs[2 * q + 1]);
        const uint8_t d = ours[2 * q] ^ theirs[2 * q], e = ours[2 * q + 1] ^ theirs[2 * q + 1];
        const block dm = select_mask(d), em = select_mask(e);
        gs.uv.bits[q] = tr.c.bits[q] ^ (d & tr.b.bits[q]) ^ (e & tr.a.bits[q]);
        gs.uv.macs[q] = xor_block(tr.c.macs[q], xor_block(and_block(dm, tr.b.macs[q]), and_block(em, tr.a.macs[q])));
        gs.uv.keys[q] = xor_block(tr.c.keys[q], xor_block(and_block(dm, tr.b.keys[q]), and_block(em, tr.a.keys[q])));
        add_public(gs.uv, q, d & e);
      }
    }

    // 2 and 3. A garbles every AND gate of the chunk, stage by stage; B evaluates as the rows come.
    std::vector<uint8_t> rows;
    BlockVector out_labels;
    std::vector<uint8_t> out_z;
    for (const GmwPlan::Stage& st : plan.stages) {
      for (size_t k = st.local_begin; k < st.local_end; ++k) {
        const GmwPlan::Op& op = plan.ops[k];
        for (size_t i = 0; i < m; ++i) {
          const size_t a = lam.at(op.a, i), o = lam.at(op.out, i);
          if (op.op == GateOp::Xor) {
            const size_t b = lam.at(op.b, i);
            label[o] = xor_block(label[a], label[b]);
            if (!garbler) z[o] = z[a] ^ z[b];
          } else {  // NOT flipped the mask: z and the labels stay
            label[o] = label[a];
            if (!garbler) z[o] = z[a];
          }
        }
      }
      const size_t gates = st.and_end - st.and_begin;
      if (!gates || !m) continue;
      rows.resize(gates * m * kAuthTableBytes);  // every byte is written (garbler) or read in
      out_labels.resize(gates * m);
      out_z.assign(gates * m, 0);
      if (!garbler) {
        ch_.recv(rows.data(), rows.size());
        auth_->log_received(rows.data(), rows.size());
      }
      for (size_t j = 0; j < gates; ++j) {
        const GmwPlan::Op& op = plan.ops[st.and_begin + j];
        const size_t g = st.member_base + j;
        for (size_t i = 0; i < m; ++i) {
          const size_t q = gs.u.at((uint32_t)g, i), r = j * m + i;
          const size_t eu = lam.at(op.a, i), ev = lam.at(op.b, i);
          uint8_t* table = rows.data() + r * kAuthTableBytes;
          const GateTweak tw{run_id_, g, i0 + i};
          if (garbler) {
            const bool flip = deviation_.kind == AuthDeviation::Kind::FlipRow && rows_sent_ == deviation_.index;
            out_labels[r] = garble_gate(hash_key_, delta, label[eu], label[ev], gs, q, tw, flip,
                                        deviation_.mac_offset, table);
            ++rows_sent_;
          } else if (!evaluate_gate(hash_key_, delta, label[eu], label[ev], z[eu], z[ev], gs, q, tw, table, out_z[r],
                                    out_labels[r])) {
            throw PeerDeviated("authenticated garbling: the garbled row of AND gate " + std::to_string(g) +
                               " (instance " + std::to_string(i0 + i) +
                               ") does not carry the MAC of its mask share: the garbler's table does not "
                               "compute the agreed circuit");
          }
        }
      }
      if (garbler) ch_.send(rows.data(), rows.size());
      // Outputs only after every input of the stage was read (an output may reuse an input's slot).
      for (size_t j = 0; j < gates; ++j) {
        const GmwPlan::Op& op = plan.ops[st.and_begin + j];
        for (size_t i = 0; i < m; ++i) {
          const size_t o = lam.at(op.out, i), r = j * m + i;
          label[o] = out_labels[r];
          if (!garbler) z[o] = out_z[r];
        }
      }
    }
    if (garbler) ch_.flush();

    // The output slots as authenticated shares of x = z ^ l_A ^ l_B.
    for (const auto& port_slots : plan.output_slots)
      for (uint32_t s : port_slots)
        for (size_t k = 0; k < m; ++k) {
          const size_t e = lam.at(s, k), to = w.at(s, i0 + k);
          if (garbler) {
            w.bits[to] = lam.bits[e];
            w.macs[to] = lam.macs[e];
            w.keys[to] = xor_block(lam.keys[e], label[e]);
          } else {
            w.bits[to] = z[e] ^ lam.bits[e];
            w.macs[to] = xor_block(lam.macs[e], label[e]);
            w.keys[to] = lam.keys[e];
          }
        }
  }
}

}  // namespace gc
