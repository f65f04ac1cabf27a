// Cryptographically secure randomness (OpenSSL's CSPRNG) for keys, seeds and Delta.
#pragma once

#include <cstddef>

#include "garbled_core/block.h"

namespace gc {

// Fills out with n random bytes; throws std::runtime_error if the CSPRNG fails.
void secure_random(void* out, size_t n);

// One uniformly random 128-bit block.
block random_block();

// A global offset Delta: uniformly random but for its lowest bit, which is 1 (a garbling
// label's colour bit flips with its value; IKNP, silent OT and the MAC keys share the rule).
block random_delta();

}  // namespace gc
