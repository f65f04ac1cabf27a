// Python test hooks of the authenticated bit shares (auth_bits.h). Called from the module's
// PYBIND11_MODULE (bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

void bind_auth_bits(pybind11::module_& m);
