// Authenticated GMW: the gates, layer by layer (see auth_gmw.h; the rest of a run is
// auth_session.cpp).
#include "garbled_core/auth_gmw.h"

#include <algorithm>
#include <vector>

namespace gc {

namespace {

// Triples taken at once (whole AND layers; more when one layer needs more): about 100 bytes
// each plus their leaky triples while they are made.
constexpr size_t kLayerTriples = size_t(1) << 18;

}  // namespace

AuthGmwParty::AuthGmwParty(Channel& ch, int party, int rho, AuthCots cots, size_t triple_batch)
    : AuthSession(ch, party, rho, cots, triple_batch, "SPGCAGM", "authenticated GMW") {}

void AuthGmwParty::evaluate(const Circuit& c, const GmwPlan& plan, AuthWires& w, DeferredMacCheck& check) {
  const size_t n = w.n;
  layers_ = plan.layers;
  size_t and_stages = 0;
  for (const GmwPlan::Stage& st : plan.stages) and_stages += st.and_end > st.and_begin ? 1 : 0;
  plan_triple_security(and_stages, (size_t)c.and_count() * n);

  // Triples, fresh for this run, taken in batches of whole AND layers (at most about
  // kLayerTriples at once, at least one layer) just before the first layer that needs them, so
  // that memory stays bounded; each is used once and dropped.
  AuthTriples tr;
  size_t batch_first = 0, batch_end = 0;  // triple indices [first, end) held in tr
  auto triples_for_stage = [&](size_t stage) {
    const GmwPlan::Stage& st = plan.stages[stage];
    const size_t first_needed = st.member_base * n, end_needed = (st.member_base + (st.and_end - st.and_begin)) * n;
    if (end_needed <= batch_end) return;
    size_t end = end_needed;
    for (size_t s = stage + 1; s < plan.stages.size(); ++s) {
      const GmwPlan::Stage& next = plan.stages[s];
      const size_t next_end = (next.member_base + (next.and_end - next.and_begin)) * n;
      if (next_end - first_needed > kLayerTriples) break;
      end = next_end;
    }
    tr = AuthTriples();
    tr = take_triples(end - first_needed);
    batch_first = first_needed;
    batch_end = end;
  };

  size_t opened = 0;  // bits this party opened so far in the run (for the test hooks)
  bool first_layer = true;
  for (size_t stage = 0; stage < plan.stages.size(); ++stage) {
    const GmwPlan::Stage& st = plan.stages[stage];
    apply_local_gates(plan, st, w);
    if (st.and_end == st.and_begin || !n) continue;
    triples_for_stage(stage);
    const size_t gates = st.and_end - st.and_begin;
    // Our bits of d = u ^ a and e = v ^ b, gate by gate, instance by instance.
    std::vector<uint8_t> ours(2 * gates * n);
    for (size_t g = 0; g < gates; ++g) {
      const GmwPlan::Op& op = plan.ops[st.and_begin + g];
      const size_t t0 = (st.member_base + g) * n - batch_first;
      for (size_t i = 0; i < n; ++i) {
        const size_t u = w.at(op.a, i), v = w.at(op.b, i), t = t0 + i, m = 2 * (g * n + i);
        block mac_d = xor_block(w.macs[u], tr.a.macs[t]), mac_e = xor_block(w.macs[v], tr.b.macs[t]);
        ours[m] = w.bits[u] ^ tr.a.bits[t];
        ours[m + 1] = w.bits[v] ^ tr.b.bits[t];
        if (deviation_.kind == AuthDeviation::Kind::FlipOpening) {
          if (opened + m == deviation_.index) {
            ours[m] ^= 1;
            mac_d = xor_block(mac_d, deviation_.mac_offset);
          } else if (opened + m + 1 == deviation_.index) {
            ours[m + 1] ^= 1;
            mac_e = xor_block(mac_e, deviation_.mac_offset);
          }
        }
        check.sent(mac_d);
        check.sent(mac_e);
      }
    }
    opened += ours.size();
    const std::vector<uint8_t> theirs = swap_bits(ours, ours.size());
    for (size_t g = 0; g < gates; ++g) {
      const GmwPlan::Op& op = plan.ops[st.and_begin + g];
      const size_t t0 = (st.member_base + g) * n - batch_first;
      for (size_t i = 0; i < n; ++i) {
        const size_t u = w.at(op.a, i), v = w.at(op.b, i), t = t0 + i, m = 2 * (g * n + i);
        check.received(xor_block(w.keys[u], tr.a.keys[t]), theirs[m]);
        check.received(xor_block(w.keys[v], tr.b.keys[t]), theirs[m + 1]);
      }
    }
    // Outputs only after every input of the layer was read (an output may reuse an input's slot).
    for (size_t g = 0; g < gates; ++g) {
      const GmwPlan::Op& op = plan.ops[st.and_begin + g];
      const size_t t0 = (st.member_base + g) * n - batch_first;
      for (size_t i = 0; i < n; ++i) {
        const size_t t = t0 + i, m = 2 * (g * n + i), o = w.at(op.out, i);
        const uint8_t d = ours[m] ^ theirs[m], e = ours[m + 1] ^ theirs[m + 1];
        const block dm = select_mask(d), em = select_mask(e);
        w.bits[o] = tr.c.bits[t] ^ (d & tr.b.bits[t]) ^ (e & tr.a.bits[t]);
        w.macs[o] = xor_block(tr.c.macs[t], xor_block(and_block(dm, tr.b.macs[t]), and_block(em, tr.a.macs[t])));
        w.keys[o] = xor_block(tr.c.keys[t], xor_block(and_block(dm, tr.b.keys[t]), and_block(em, tr.a.keys[t])));
        add_public(w, o, d & e);
        if (first_layer && deviation_.kind == AuthDeviation::Kind::FlipWire && g * n + i == deviation_.index)
          w.bits[o] ^= 1;  // a constant added to a wire, MAC left as it was
      }
    }
    first_layer = false;
  }
}

}  // namespace gc
