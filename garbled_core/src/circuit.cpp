#include "garbled_core/circuit.h"

#include <openssl/evp.h>

#include <algorithm>
#include <stdexcept>

namespace gc {

namespace {

constexpr uint32_t kNever = 0xffffffffu;

void hash_u32(EVP_MD_CTX* ctx, uint32_t v) {
  uint8_t b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
  EVP_DigestUpdate(ctx, b, 4);
}

void hash_string(EVP_MD_CTX* ctx, const std::string& s) {
  hash_u32(ctx, (uint32_t)s.size());
  EVP_DigestUpdate(ctx, s.data(), s.size());
}

std::runtime_error circuit_error(const std::string& what) {
  return std::runtime_error("invalid circuit: " + what);
}

}  // namespace

Circuit::Circuit(uint32_t num_wires, std::vector<InputPort> inputs,
                 const std::vector<RawGate>& gates, std::vector<OutputPort> outputs,
                 std::string name)
    : name_(std::move(name)), num_wires_(num_wires), inputs_(std::move(inputs)),
      outputs_(std::move(outputs)) {
  // Validate the wire-numbering contract: 0 is constant zero, inputs follow in
  // port order, every gate defines the next wire.
  uint32_t next = 1;
  for (auto& port : inputs_) {
    if (port.width < 1 || port.width > 64)
      throw circuit_error("input '" + port.name + "' has width " + std::to_string(port.width) +
                          " (1..64 allowed)");
    port.first_wire = next;
    next += (uint32_t)port.width;
  }
  for (size_t i = 0; i < inputs_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (inputs_[i].name == inputs_[j].name)
        throw circuit_error("duplicate input name '" + inputs_[i].name + "'");
  for (size_t i = 0; i < outputs_.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (outputs_[i].name == outputs_[j].name)
        throw circuit_error("duplicate output name '" + outputs_[i].name + "'");
  if (num_wires_ != next + gates.size())
    throw circuit_error("num_wires is " + std::to_string(num_wires_) + " but inputs and gates define " +
                        std::to_string(next + gates.size()));
  for (size_t g = 0; g < gates.size(); ++g) {
    const RawGate& gate = gates[g];
    uint32_t defined = next + (uint32_t)g;
    if (gate.out != defined)
      throw circuit_error("gate " + std::to_string(g) + " defines wire " + std::to_string(gate.out) +
                          ", expected " + std::to_string(defined));
    if (gate.op != GateOp::Xor && gate.op != GateOp::And && gate.op != GateOp::Not)
      throw circuit_error("gate " + std::to_string(g) + " has an unknown operation");
    if (gate.a >= defined || (gate.op != GateOp::Not && gate.b >= defined))
      throw circuit_error("gate " + std::to_string(g) + " reads a wire not yet defined");
    // A constant into an AND would repeat one hash input across instances;
    // the builder folds constants away, so this is a builder bug.
    if (gate.op == GateOp::And && (gate.a == 0 || gate.b == 0))
      throw circuit_error("AND gate " + std::to_string(g) + " reads the constant wire");
  }
  for (auto& port : outputs_) {
    if (port.wires.empty() || port.wires.size() > 64)
      throw circuit_error("output '" + port.name + "' has " + std::to_string(port.wires.size()) +
                          " wires (1..64 allowed)");
    for (uint32_t w : port.wires)
      if (w >= num_wires_) throw circuit_error("output '" + port.name + "' reads wire " + std::to_string(w));
  }

  // Liveness: the last gate reading each wire; outputs live to the end.
  std::vector<uint32_t> last_use(num_wires_, kNever - 1);
  std::vector<bool> used(num_wires_, false);
  for (size_t g = 0; g < gates.size(); ++g) {
    last_use[gates[g].a] = (uint32_t)g;
    used[gates[g].a] = true;
    if (gates[g].op != GateOp::Not) {
      last_use[gates[g].b] = (uint32_t)g;
      used[gates[g].b] = true;
    }
  }
  for (auto& port : outputs_)
    for (uint32_t w : port.wires) {
      last_use[w] = kNever;
      used[w] = true;
    }
  last_use[0] = kNever;  // slot 0 always holds the constant

  // Slot allocation. Kernels read both inputs of an instance before writing
  // its output, so an output may take the slot an input frees at that gate.
  std::vector<uint32_t> slot_of(num_wires_, kNever);
  std::vector<uint32_t> free_slots;
  uint32_t slots = 1;
  slot_of[0] = 0;
  auto take_slot = [&]() {
    if (!free_slots.empty()) {
      uint32_t s = free_slots.back();
      free_slots.pop_back();
      return s;
    }
    return slots++;
  };
  input_slots_.resize(inputs_.size());
  for (size_t p = 0; p < inputs_.size(); ++p)
    for (int i = 0; i < inputs_[p].width; ++i) {
      uint32_t w = inputs_[p].first_wire + (uint32_t)i;
      slot_of[w] = slots++;  // distinct slots: all inputs are loaded before gate 0
      input_slots_[p].push_back(slot_of[w]);
    }
  // Input wires no gate or output reads can be released at once.
  for (uint32_t w = 1; w < next; ++w)
    if (!used[w]) free_slots.push_back(slot_of[w]);

  gates_.reserve(gates.size());
  for (size_t g = 0; g < gates.size(); ++g) {
    const RawGate& gate = gates[g];
    SlotGate sg{gate.op, slot_of[gate.a], gate.op == GateOp::Not ? 0u : slot_of[gate.b], 0, 0};
    if (last_use[gate.a] == g) free_slots.push_back(slot_of[gate.a]);
    if (gate.op != GateOp::Not && gate.b != gate.a && last_use[gate.b] == g)
      free_slots.push_back(slot_of[gate.b]);
    uint32_t out_slot = take_slot();
    slot_of[gate.out] = out_slot;
    sg.out = out_slot;
    if (gate.op == GateOp::And) {
      sg.and_index = (uint32_t)and_count_++;
    } else if (gate.op == GateOp::Xor) {
      ++xor_count_;
    } else {
      ++not_count_;
    }
    gates_.push_back(sg);
    if (!used[gate.out]) free_slots.push_back(out_slot);  // dead gate: result never read
  }
  num_slots_ = slots;
  for (auto& port : outputs_) {
    port.slots.clear();
    for (uint32_t w : port.wires) port.slots.push_back(slot_of[w]);
  }

  // The digest covers everything both parties must agree on.
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  if (!md || EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1) throw std::runtime_error("SHA-256 unavailable");
  hash_string(md, "spgc-circuit-v1");
  hash_string(md, name_);
  hash_u32(md, num_wires_);
  hash_u32(md, (uint32_t)inputs_.size());
  for (auto& port : inputs_) {
    hash_string(md, port.name);
    hash_u32(md, (uint32_t)port.owner);
    hash_u32(md, (uint32_t)port.width);
  }
  hash_u32(md, (uint32_t)gates.size());
  for (auto& gate : gates) {
    hash_u32(md, (uint32_t)gate.op);
    hash_u32(md, gate.a);
    hash_u32(md, gate.op == GateOp::Not ? 0u : gate.b);
  }
  hash_u32(md, (uint32_t)outputs_.size());
  for (auto& port : outputs_) {
    hash_string(md, port.name);
    hash_u32(md, (uint32_t)port.reveal);
    hash_u32(md, (uint32_t)port.wires.size());
    for (uint32_t w : port.wires) hash_u32(md, w);
  }
  unsigned int digest_len = 0;
  EVP_DigestFinal_ex(md, digest_.data(), &digest_len);
  EVP_MD_CTX_free(md);
}

uint64_t Circuit::input_bits(InputOwner owner) const {
  uint64_t bits = 0;
  for (auto& port : inputs_)
    if (port.owner == owner) bits += (uint64_t)port.width;
  return bits;
}

std::string Circuit::hex_digest() const {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : digest_) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

int Circuit::input_index(const std::string& name) const {
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].name == name) return (int)i;
  return -1;
}

std::vector<std::vector<uint64_t>> Circuit::evaluate(const std::vector<const uint64_t*>& inputs,
                                                     size_t n) const {
  if (inputs.size() != inputs_.size()) throw std::invalid_argument("evaluate: wrong number of inputs");
  std::vector<std::vector<uint64_t>> result(outputs_.size(), std::vector<uint64_t>(n, 0));
  // Bit-sliced: word k of a slot holds one wire for 64 instances.
  constexpr size_t kWords = 64;  // 4096 instances per pass
  std::vector<uint64_t> slots((size_t)num_slots_ * kWords);
  for (size_t start = 0; start < n; start += kWords * 64) {
    size_t count = std::min(n - start, kWords * 64);
    size_t words = (count + 63) / 64;
    std::fill(slots.begin(), slots.end(), 0);
    for (size_t p = 0; p < inputs_.size(); ++p) {
      const uint64_t* values = inputs[p] + start;
      for (int bit = 0; bit < inputs_[p].width; ++bit) {
        uint64_t* dst = &slots[(size_t)input_slots_[p][bit] * kWords];
        for (size_t i = 0; i < count; ++i) dst[i >> 6] |= ((values[i] >> bit) & 1) << (i & 63);
      }
    }
    for (const SlotGate& g : gates_) {
      const uint64_t* a = &slots[(size_t)g.a * kWords];
      const uint64_t* b = &slots[(size_t)g.b * kWords];
      uint64_t* out = &slots[(size_t)g.out * kWords];
      switch (g.op) {
        case GateOp::Xor:
          for (size_t k = 0; k < words; ++k) out[k] = a[k] ^ b[k];
          break;
        case GateOp::And:
          for (size_t k = 0; k < words; ++k) out[k] = a[k] & b[k];
          break;
        case GateOp::Not:
          for (size_t k = 0; k < words; ++k) out[k] = ~a[k];
          break;
      }
    }
    for (size_t o = 0; o < outputs_.size(); ++o) {
      uint64_t* dst = result[o].data() + start;
      const auto& port_slots = outputs_[o].slots;
      for (size_t bit = 0; bit < port_slots.size(); ++bit) {
        const uint64_t* src = &slots[(size_t)port_slots[bit] * kWords];
        for (size_t i = 0; i < count; ++i) dst[i] |= ((src[i >> 6] >> (i & 63)) & 1) << bit;
      }
    }
  }
  return result;
}

}  // namespace gc
