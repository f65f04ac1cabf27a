// Half-gates garbling (Zahur-Rosulek-Evans 2015) with free-XOR and
// point-and-permute, run over a span of instances of one AND gate.
//
// Hash: H(x, tweak) = AES_{salt ^ tweak}(x) ^ x, the multi-instance
// tweakable correlation-robust hash of Guo-Katz-Wang-Weng-Yu (ePrint
// 2019/1168), with one AES key per (run, AND gate, group of 8 instances,
// half). A key therefore serves at most 16 hash inputs when garbling, which
// keeps the multi-instance bound near q * 16 / 2^128 for q attacker queries,
// while the key schedule is amortised over 16 AES calls.
//
// Table layout for one gate over a span: per group of up to 8 instances,
// first the garbler-half rows of the group, then the evaluator-half rows;
// 2 blocks (32 bytes) per AND gate per instance.
#pragma once

#include <cstddef>
#include <cstdint>

#include "garbled_core/block.h"

namespace gc {

constexpr size_t kHashGroup = 8;  // instances sharing one hash key

// Tweak of one AND gate in one run; instances are added inside the kernel.
inline uint64_t gate_tweak(uint32_t run_id, uint32_t and_index) {
  return ((uint64_t)run_id << 32) | and_index;
}

// Garbles n instances: a0/b0 are the zero-labels of the inputs, c0 receives
// the zero-label of the output, tables receives 2n blocks. first_instance must
// be a multiple of kHashGroup; c0 may alias a0 or b0.
using GarbleAndFn = void (*)(const block* a0, const block* b0, block* c0, block* tables, size_t n,
                             uint64_t first_instance, block delta, block salt, uint64_t tweak);
// Evaluates n instances from the active labels a, b and the 2n table blocks.
using EvalAndFn = void (*)(const block* a, const block* b, block* c, const block* tables, size_t n,
                           uint64_t first_instance, block salt, uint64_t tweak);

struct AndKernels {
  const char* name;
  bool wide;  // VAES + AVX-512: the engine's other wide paths (rows, PRG, OT) follow it
  GarbleAndFn garble;
  EvalAndFn eval;
};

// The fastest kernels this CPU runs (VAES + AVX-512 if present, else AES-NI).
const AndKernels& and_kernels();
// Forces a kernel set by name ("aesni", "vaes"); returns false if unavailable.
bool select_and_kernels(const char* name);
// Names of the kernel sets this CPU can run.
const char* const* available_and_kernels();

}  // namespace gc
