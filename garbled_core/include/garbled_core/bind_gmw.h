// Python bindings of the GMW backend (GmwParty). Called from the module's PYBIND11_MODULE
// after the Circuit / Kept / KeptSelection classes are bound.
#pragma once

#include <pybind11/pybind11.h>

void bind_gmw(pybind11::module_& m);
