// The schedule of one circuit for the GMW evaluators (semi-honest gmw.h and authenticated
// auth_gmw.h): gates regrouped by AND-depth stage, AND gates of a layer grouped by a shared
// input, over slots allocated for that order. Both parties derive the same plan from the
// circuit alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "garbled_core/circuit.h"

namespace gc {

// A stage: the XOR / NOT gates of an AND-depth level, in circuit order, then its AND gates as
// one layer (one exchange).
struct GmwPlan {
  struct Op {
    GateOp op;
    uint32_t a, b, out, and_index;
  };
  struct Stage {
    size_t local_begin, local_end, and_begin, and_end;  // ops
    size_t group_begin, group_end;                      // groups
    size_t member_base;  // AND ops before this stage: the triple row of op and_begin
  };
  // AND gates of one layer sharing the input `key` (slot): ops [first, last), each with
  // a = key and b = its other input. They share one triple a and one opening of key.
  struct Group {
    uint32_t key;
    size_t first, last;
  };
  uint32_t slots = 1;
  std::vector<std::vector<uint32_t>> input_slots;   // per input port, per bit
  std::vector<std::vector<uint32_t>> output_slots;  // per output port, per bit
  std::vector<Op> ops;
  std::vector<Stage> stages;
  std::vector<Group> groups;
  std::vector<uint32_t> widths;  // per group, for the triple generator
  size_t max_layer = 0;  // most AND gates plus groups in one layer (the message rows)
  size_t layers = 0;     // layers with at least one AND gate (= AND-depth)
};

// The plan of circuit c (a pure function of the circuit).
GmwPlan plan_circuit(const Circuit& c);

}  // namespace gc
