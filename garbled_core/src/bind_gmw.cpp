// Python test hook of the GMW backend's Beaver triples (_gmw_triples). The GmwParty class
// itself is bound in bindings.cpp beside Garbler and Evaluator, with their run() conversion.
#include "garbled_core/bind_gmw.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>

#include "garbled_core/gmw.h"
#include "garbled_core/random.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

using U64Array = py::array_t<uint64_t, py::array::c_style>;

}  // namespace

void bind_gmw(py::module_& m) {
  m.def("_gmw_triples", [](gc::Channel& ch, int party, const std::vector<size_t>& counts, int ot_k) {
    if (party != 0 && party != 1) throw py::value_error("party must be 0 or 1");
    if (ot_k < 1 || ot_k > gc::kMaxOtK) throw py::value_error("ot_k must be in 1..8");
    std::vector<gc::BitTriples> made(counts.size());
    {
      py::gil_scoped_release r;
      gc::SoftSpokenRandomOt ot(ot_k);
      gc::block salt = gc::random_block();
      // The test hook agrees on a salt like GmwParty::setup: party 0 draws it.
      if (party == 0) {
        ch.send(&salt, sizeof(salt));
        ch.flush();
      } else {
        ch.recv(&salt, sizeof(salt));
      }
      ot.setup(ch, party, salt);
      for (size_t i = 0; i < counts.size(); ++i) gc::generate_triples(ot, ch, counts[i], made[i]);
      ch.flush();
    }
    py::list out;
    for (auto& t : made) {
      auto words = [&](const std::vector<uint64_t>& v) {
        U64Array a((py::ssize_t)((t.count + 63) / 64));
        if (a.size()) std::memcpy(a.mutable_data(), v.data(), (size_t)a.size() * sizeof(uint64_t));
        return a;
      };
      out.append(py::make_tuple(words(t.a), words(t.b), words(t.c)));
    }
    return out;
  }, "channel"_a, "party"_a, "counts"_a, "ot_k"_a = gc::kDefaultOtK,
  "Test hook: SoftSpoken ROT setup, then one batch of Boolean triples per count; returns "
  "[(a, b, c)] of this party as packed uint64 words (bit t = triple t).");
}
