// One circuit description, compiled once and run by three backends: the
// plaintext evaluator (bit-sliced, 64 instances per word), the garbler and the
// evaluator. Compilation assigns every wire a storage slot, reusing slots of
// wires that are no longer needed, so a batch of instances stays in cache.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace gc {

enum class GateOp : uint8_t { Xor = 0, And = 1, Not = 2 };
enum class InputOwner : uint8_t { Garbler = 0, Evaluator = 1, Carried = 2 };
// Who learns an output: both parties, one of them, nobody (XOR shares held in
// the colour bits), or nobody yet (labels kept for a later circuit).
enum class Reveal : uint8_t { Both = 0, Garbler = 1, Evaluator = 2, Shares = 3, Keep = 4 };

struct InputPort {
  std::string name;
  InputOwner owner;
  int width;
  uint32_t first_wire;  // wires first_wire .. first_wire + width - 1, LSB first
};

struct OutputPort {
  std::string name;
  Reveal reveal;
  std::vector<uint32_t> wires;  // LSB first
  std::vector<uint32_t> slots;  // where those wires live at the end of a run
};

struct RawGate {
  GateOp op;
  uint32_t a, b, out;
};

// A gate over slots; and_index numbers AND gates 0.. so both parties derive
// the same hash tweaks.
struct SlotGate {
  GateOp op;
  uint32_t a, b, out;
  uint32_t and_index;
};

class Circuit {
 public:
  Circuit(uint32_t num_wires, std::vector<InputPort> inputs, const std::vector<RawGate>& gates,
          std::vector<OutputPort> outputs, std::string name);

  const std::string& name() const { return name_; }
  const std::vector<InputPort>& inputs() const { return inputs_; }
  const std::vector<OutputPort>& outputs() const { return outputs_; }
  const std::vector<SlotGate>& gates() const { return gates_; }
  // Slot that holds each input bit, per port, LSB first.
  const std::vector<std::vector<uint32_t>>& input_slots() const { return input_slots_; }
  uint32_t num_wires() const { return num_wires_; }
  uint32_t num_slots() const { return num_slots_; }
  uint64_t and_count() const { return and_count_; }
  uint64_t xor_count() const { return xor_count_; }
  uint64_t not_count() const { return not_count_; }
  // Total input bits of one owner per instance.
  uint64_t input_bits(InputOwner owner) const;
  const std::array<uint8_t, 32>& digest() const { return digest_; }
  std::string hex_digest() const;

  int input_index(const std::string& name) const;  // -1 if absent

  // Plaintext evaluation of n instances. inputs[p] holds n values for input
  // port p; returns n values per output port (every reveal kind).
  std::vector<std::vector<uint64_t>> evaluate(const std::vector<const uint64_t*>& inputs,
                                              size_t n) const;

 private:
  std::string name_;
  uint32_t num_wires_;
  std::vector<InputPort> inputs_;
  std::vector<OutputPort> outputs_;
  std::vector<SlotGate> gates_;
  std::vector<std::vector<uint32_t>> input_slots_;
  uint32_t num_slots_ = 0;
  uint64_t and_count_ = 0, xor_count_ = 0, not_count_ = 0;
  std::array<uint8_t, 32> digest_{};
};

}  // namespace gc
