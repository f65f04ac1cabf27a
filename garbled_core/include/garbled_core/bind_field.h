// Python bindings of the prime-field kernels (field.h): field_ntt, field_matvec, field_mul,
// field_expand and wraparound_dots. Called from the module's PYBIND11_MODULE (bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

void bind_field(pybind11::module_& m);
