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
  m.def("_gmw_triples", [](gc::Channel& ch, int party, const std::vector<size_t>& counts, int ot_k,
                           const std::vector<uint32_t>& widths) {
    if (party != 0 && party != 1) throw py::value_error("party must be 0 or 1");
    if (ot_k < 1 || ot_k > gc::kMaxOtK) throw py::value_error("ot_k must be in 1..8");
    for (uint32_t w : widths)
      if (w < 1 || w > gc::kMaxGroupWidth) throw py::value_error("widths must be in 1..128");
    std::vector<gc::GroupTriples> made(counts.size());
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
      for (size_t i = 0; i < counts.size(); ++i) gc::generate_triples(ot, ch, widths, counts[i], made[i]);
      ch.flush();
    }
    py::list out;
    for (auto& t : made) {
      auto rows = [&](const std::vector<uint64_t>& v) {
        const py::ssize_t nrows = (py::ssize_t)(t.words ? v.size() / t.words : 0);
        U64Array a({nrows, (py::ssize_t)t.words});
        if (a.size()) std::memcpy(a.mutable_data(), v.data(), (size_t)a.size() * sizeof(uint64_t));
        return a;
      };
      out.append(py::make_tuple(rows(t.a), rows(t.b), rows(t.c)));
    }
    return out;
  }, "channel"_a, "party"_a, "counts"_a, "ot_k"_a = gc::kDefaultOtK,
  "widths"_a = std::vector<uint32_t>{1},
  "Test hook: SoftSpoken ROT setup, then one batch of group triples per count (instances), "
  "groups of the given widths; returns [(a, b, c)] of this party as uint64 row arrays (a: one "
  "row per group, b and c one per member; bit i of a row = instance i).");
}
