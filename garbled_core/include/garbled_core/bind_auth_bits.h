// Python test hooks of the authenticated bit shares and triples (auth_bits.h, auth_triples.h). Called from the module's
// PYBIND11_MODULE (bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>
#include <string>

#include "garbled_core/auth_triples.h"

void bind_auth_bits(pybind11::module_& m);

// "silent" (the default: silent OT with Ferret's malicious check), "iknp" (with KOS's check) or
// "silent-test-only" (Ferret's code at an INSECURE size, for tests); a ValueError otherwise.
gc::AuthCots parse_auth_cots(const std::string& name);

// A test cheater of the leaky AND by name: "u_error" (a random error in U, with the peer's x
// bit guessed when guess is 0 or 1), "half_and_flip", "correction_flip", "check_flip".
gc::TripleCheat triple_cheat(const std::string& kind, size_t index, int guess);
