// Python bindings of silent COT (silent_ot.h): test hooks _silent_cot_send / _silent_cot_recv
// and _silent_ot_params. Called from the module's PYBIND11_MODULE (bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

void bind_silent_ot(pybind11::module_& m);
