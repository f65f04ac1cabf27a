// Python bindings of the zero-knowledge proofs (zk_proof.h): the results, the session's
// methods and a test hook. Called from the module's
// PYBIND11_MODULE (bindings.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include "garbled_core/auth_session.h"

void bind_zk_proof(pybind11::module_& m);

// AuthSession.prove and AuthSession.bind_proved (registered on the class in bindings.cpp).
pybind11::tuple session_prove(gc::AuthSession& s, const pybind11::object& mine, const pybind11::object& theirs);
std::shared_ptr<gc::KeptLabels> session_bind_proved(gc::AuthSession& s, const pybind11::list& sources,
                                                    const pybind11::object& source, const pybind11::object& instance,
                                                    int width, const std::string& port);
