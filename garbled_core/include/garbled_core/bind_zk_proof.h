// Python test hook of the zero-knowledge proofs (zk_proof.h). Called from the module's
// PYBIND11_MODULE (bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

void bind_zk_proof(pybind11::module_& m);
