#include "garbled_core/gmw_plan.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <utility>

#include "garbled_core/gmw.h"

namespace gc {

namespace {

// Groups one layer's AND gates by a shared input wire, greedily: the wire that is an input of
// the most ungrouped gates keys the next group (ties: the lower wire), until no wire is shared;
// the rest are groups of one, keyed by their first input. Groups hold at most kMaxGroupWidth
// gates. Both parties derive the same groups from the circuit alone. Returns (key wire, gates).
std::vector<std::pair<uint32_t, std::vector<uint32_t>>> group_layer(const std::vector<uint32_t>& gates,
                                                                    const std::vector<uint32_t>& ga,
                                                                    const std::vector<uint32_t>& gb) {
  std::unordered_map<uint32_t, std::vector<uint32_t>> by_wire;  // wire -> positions in gates
  for (uint32_t j = 0; j < gates.size(); ++j) {
    by_wire[ga[gates[j]]].push_back(j);
    if (gb[gates[j]] != ga[gates[j]]) by_wire[gb[gates[j]]].push_back(j);
  }
  std::unordered_map<uint32_t, uint32_t> live;  // wire -> its ungrouped gates
  std::priority_queue<std::pair<uint32_t, int64_t>> heap;  // (count, -wire)
  for (auto& [w, list] : by_wire) {
    live[w] = (uint32_t)list.size();
    if (list.size() > 1) heap.push({(uint32_t)list.size(), -(int64_t)w});
  }
  std::vector<bool> done(gates.size(), false);
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> out;
  while (!heap.empty()) {
    const auto [count, neg] = heap.top();
    heap.pop();
    const uint32_t w = (uint32_t)(-neg);
    if (live[w] != count) {  // stale entry: requeue at its current count
      if (live[w] > 1) heap.push({live[w], neg});
      continue;
    }
    std::vector<uint32_t> members;
    for (uint32_t j : by_wire[w]) {
      if (done[j]) continue;
      done[j] = true;
      members.push_back(gates[j]);
      const uint32_t other = ga[gates[j]] == w ? gb[gates[j]] : ga[gates[j]];
      if (other != w) --live[other];
    }
    live[w] = 0;
    for (size_t i = 0; i < members.size(); i += kMaxGroupWidth)
      out.push_back({w, std::vector<uint32_t>(members.begin() + (ptrdiff_t)i,
                                              members.begin() + (ptrdiff_t)std::min(members.size(), i + kMaxGroupWidth))});
  }
  for (uint32_t j = 0; j < gates.size(); ++j)
    if (!done[j]) out.push_back({ga[gates[j]], {gates[j]}});
  return out;
}

}  // namespace

GmwPlan plan_circuit(const Circuit& c) {
  const auto& gates = c.gates();
  const size_t G = gates.size();
  uint32_t first_gate_wire = 1;
  for (auto& port : c.inputs()) first_gate_wire += (uint32_t)port.width;
  const uint32_t W = c.num_wires();
  // Wire-level gates, recovered from the slot-level ones in circuit order.
  std::vector<uint32_t> slot_wire(c.num_slots(), 0), ga(G), gb(G);
  for (size_t p = 0; p < c.inputs().size(); ++p)
    for (int bit = 0; bit < c.inputs()[p].width; ++bit)
      slot_wire[c.input_slots()[p][bit]] = c.inputs()[p].first_wire + (uint32_t)bit;
  for (size_t g = 0; g < G; ++g) {
    ga[g] = slot_wire[gates[g].a];
    gb[g] = gates[g].op == GateOp::Not ? 0 : slot_wire[gates[g].b];
    slot_wire[gates[g].out] = first_gate_wire + (uint32_t)g;
  }
  // Stages: an AND whose inputs are ready after layer L opens in layer L.
  std::vector<uint32_t> level(W, 0), stage(G, 0);
  uint32_t last_stage = 0;
  for (size_t g = 0; g < G; ++g) {
    uint32_t s = std::max(level[ga[g]], level[gb[g]]);
    stage[g] = s;
    level[first_gate_wire + g] = s + (gates[g].op == GateOp::And ? 1 : 0);
    last_stage = std::max(last_stage, s);
  }
  const size_t nstages = G ? (size_t)last_stage + 1 : 0;
  std::vector<std::vector<uint32_t>> locals(nstages), ands(nstages);
  for (size_t g = 0; g < G; ++g)
    (gates[g].op == GateOp::And ? ands : locals)[stage[g]].push_back((uint32_t)g);

  // Positions in the new order; an AND layer reads at one position.
  constexpr int64_t kForever = INT64_MAX;
  std::vector<int64_t> pos(G), last_use(W, -1);
  int64_t next = 0;
  for (size_t s = 0; s < nstages; ++s) {
    for (uint32_t g : locals[s]) pos[g] = next++;
    for (uint32_t g : ands[s]) pos[g] = next;
    if (!ands[s].empty()) next += 2;
  }
  for (size_t g = 0; g < G; ++g) {
    last_use[ga[g]] = std::max(last_use[ga[g]], pos[g]);
    if (gates[g].op != GateOp::Not) last_use[gb[g]] = std::max(last_use[gb[g]], pos[g]);
  }
  for (auto& port : c.outputs())
    for (uint32_t w : port.wires) last_use[w] = kForever;
  last_use[0] = kForever;

  GmwPlan plan;
  std::vector<uint32_t> slot_of(W, 0), free_slots;
  std::vector<bool> freed(W, false);
  auto take = [&]() {
    if (!free_slots.empty()) {
      uint32_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return plan.slots++;
  };
  auto release = [&](uint32_t w) {
    if (!freed[w]) {
      freed[w] = true;
      free_slots.push_back(slot_of[w]);
    }
  };
  plan.input_slots.resize(c.inputs().size());
  for (size_t p = 0; p < c.inputs().size(); ++p)
    for (int bit = 0; bit < c.inputs()[p].width; ++bit) {
      uint32_t w = c.inputs()[p].first_wire + (uint32_t)bit;
      slot_of[w] = plan.slots++;  // distinct: every input is loaded before the first gate
      plan.input_slots[p].push_back(slot_of[w]);
    }
  for (uint32_t w = 1; w < first_gate_wire; ++w)
    if (last_use[w] < 0) release(w);
  size_t members = 0;
  for (size_t s = 0; s < nstages; ++s) {
    GmwPlan::Stage st{};
    st.local_begin = plan.ops.size();
    for (uint32_t g : locals[s]) {
      const uint32_t out_wire = first_gate_wire + g;
      GmwPlan::Op op{gates[g].op, slot_of[ga[g]], gates[g].op == GateOp::Not ? 0u : slot_of[gb[g]], 0,
                     0};
      if (last_use[ga[g]] == pos[g]) release(ga[g]);
      if (gates[g].op != GateOp::Not && last_use[gb[g]] == pos[g]) release(gb[g]);
      slot_of[out_wire] = op.out = take();
      if (last_use[out_wire] < 0) release(out_wire);  // dead gate
      plan.ops.push_back(op);
    }
    st.local_end = st.and_begin = plan.ops.size();
    st.group_begin = plan.groups.size();
    st.member_base = members;
    if (!ands[s].empty()) {
      const int64_t p = pos[ands[s][0]];
      std::vector<uint32_t> order;  // the layer's gates, group by group
      for (auto& [key, list] : group_layer(ands[s], ga, gb)) {
        plan.groups.push_back({slot_of[key], plan.ops.size(), plan.ops.size() + list.size()});
        plan.widths.push_back((uint32_t)list.size());
        for (uint32_t g : list) {
          const uint32_t other = ga[g] == key ? gb[g] : ga[g];
          plan.ops.push_back({GateOp::And, slot_of[key], slot_of[other], 0, gates[g].and_index});
          order.push_back(g);
        }
      }
      // Every input of the layer is read (into the openings) before any output is written.
      for (uint32_t g : order) {
        if (last_use[ga[g]] == p) release(ga[g]);
        if (last_use[gb[g]] == p) release(gb[g]);
      }
      for (size_t j = 0; j < order.size(); ++j) {
        const uint32_t out_wire = first_gate_wire + order[j];
        slot_of[out_wire] = plan.ops[st.and_begin + j].out = take();
      }
      for (uint32_t g : order)
        if (last_use[first_gate_wire + g] < 0) release(first_gate_wire + g);
      members += order.size();
      plan.max_layer = std::max(plan.max_layer, order.size() + (plan.groups.size() - st.group_begin));
      ++plan.layers;
    }
    st.group_end = plan.groups.size();
    st.and_end = plan.ops.size();
    plan.stages.push_back(st);
  }
  plan.output_slots.resize(c.outputs().size());
  for (size_t o = 0; o < c.outputs().size(); ++o)
    for (uint32_t w : c.outputs()[o].wires) plan.output_slots[o].push_back(slot_of[w]);
  return plan;
}

}  // namespace gc
