// Python bindings of the data link (TlsConfig, Listener, Channel, the exception types).
// Called from the module's PYBIND11_MODULE so that every translation unit of the module
// shares the exception translation.
#pragma once

#include <pybind11/pybind11.h>

void bind_channel(pybind11::module_& m);
