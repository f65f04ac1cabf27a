// Python bindings of the GMW party: the same run() conventions as Garbler / Evaluator
// (inputs by port name as numpy uint64 arrays, carried inputs as Kept or KeptSelection,
// outputs as a dict: values this party learns, its XOR shares, Kept objects), so a caller
// can swap backends. The GIL is released while a run computes or waits on the network.
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

const char* owner_word(gc::InputOwner o) {
  switch (o) {
    case gc::InputOwner::Garbler: return "garbler";
    case gc::InputOwner::Evaluator: return "evaluator";
    default: return "carried";
  }
}

const uint64_t* checked_values(const gc::InputPort& port, const py::handle& obj, size_t n,
                               std::vector<U64Array>& keep_alive) {
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array>(obj) || arr.dtype().kind() != 'u' || arr.dtype().itemsize() != 8)
    throw py::type_error("input '" + port.name + "' must be a numpy uint64 array");
  U64Array a = U64Array::ensure(obj);
  if (a.ndim() != 1 || (size_t)a.shape(0) != n)
    throw py::value_error("input '" + port.name + "' must be 1-D with " + std::to_string(n) + " values");
  if (port.width < 64) {
    const uint64_t* v = a.data();
    const uint64_t limit = uint64_t(1) << port.width;
    for (size_t i = 0; i < n; ++i)
      if (v[i] >= limit)
        throw py::value_error("input '" + port.name + "' has value " + std::to_string(v[i]) +
                              " at instance " + std::to_string(i) + ", above its width of " +
                              std::to_string(port.width) + " bits");
  }
  keep_alive.push_back(a);
  return a.data();
}

gc::CarriedInput carried_of(const py::handle& obj, const std::string& name) {
  if (py::isinstance<gc::CarriedInput>(obj)) return obj.cast<gc::CarriedInput>();
  if (py::isinstance<gc::KeptLabels>(obj))
    return gc::CarriedInput{obj.cast<std::shared_ptr<gc::KeptLabels>>(), {}};
  throw py::type_error("carried input '" + name + "' must be a Kept or a KeptSelection");
}

size_t count_of(const py::dict& inputs, const py::dict& carried, const py::object& n_obj) {
  if (!n_obj.is_none()) return n_obj.cast<size_t>();
  for (auto item : inputs) {
    py::array a = py::array::ensure(item.second);
    if (a && a.ndim() == 1) return (size_t)a.shape(0);
  }
  for (auto item : carried) {
    gc::CarriedInput c = carried_of(item.second, item.first.cast<std::string>());
    return c.indices.empty() ? c.source->n : c.indices.size();
  }
  throw py::value_error("cannot tell the number of instances: pass n=");
}

py::dict run_gmw(gc::GmwParty& s, const gc::Circuit& c, const py::dict& inputs, const py::dict& carried,
                 const py::object& n_obj) {
  const gc::InputOwner self = s.party() == 0 ? gc::InputOwner::Garbler : gc::InputOwner::Evaluator;
  gc::RunInputs in;
  std::vector<U64Array> arrays;
  in.n = count_of(inputs, carried, n_obj);
  in.values.assign(c.inputs().size(), nullptr);
  in.carried.resize(c.inputs().size());
  for (auto item : inputs) {
    const std::string name = item.first.cast<std::string>();
    const int p = c.input_index(name);
    if (p < 0) throw py::value_error("circuit '" + c.name() + "' has no input '" + name + "'");
    const gc::InputPort& port = c.inputs()[p];
    if (port.owner != self)
      throw py::value_error("input '" + name + "' belongs to the " + owner_word(port.owner) +
                            ", not to this party");
    in.values[p] = checked_values(port, item.second, in.n, arrays);
  }
  for (auto item : carried) {
    const std::string name = item.first.cast<std::string>();
    const int p = c.input_index(name);
    if (p < 0 || c.inputs()[p].owner != gc::InputOwner::Carried)
      throw py::value_error("circuit '" + c.name() + "' has no carried input '" + name + "'");
    in.carried[p] = carried_of(item.second, name);
  }
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    const gc::InputPort& port = c.inputs()[p];
    if (port.owner == self && !in.values[p])
      throw py::value_error("missing input '" + port.name + "' of the " + owner_word(self));
    if (port.owner == gc::InputOwner::Carried && !in.carried[p].source)
      throw py::value_error("missing carried input '" + port.name + "'");
  }
  gc::RunOutputs out;
  {
    py::gil_scoped_release release;
    out = s.run(c, in);
  }
  py::dict d;
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const gc::OutputPort& port = c.outputs()[o];
    if (out.kept[o]) {
      d[py::str(port.name)] = py::cast(out.kept[o]);
      continue;
    }
    const bool learns = port.reveal == gc::Reveal::Both || port.reveal == gc::Reveal::Shares ||
                        (port.reveal == gc::Reveal::Garbler && s.party() == 0) ||
                        (port.reveal == gc::Reveal::Evaluator && s.party() == 1);
    if (!learns) continue;  // revealed to the other party only
    const auto& v = out.values[o];
    U64Array a((py::ssize_t)v.size());
    if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(uint64_t));
    d[py::str(port.name)] = a;
  }
  return d;
}

}  // namespace

void bind_gmw(py::module_& m) {
  py::class_<gc::GmwParty>(m, "GmwParty",
      "One server of the GMW backend: role 'garbler' (H1, party 0, owns the garbler ports) or "
      "'evaluator' (H2, party 1). run() takes and returns what Garbler/Evaluator.run do; Keep "
      "outputs are XOR shares that only this backend's runs accept as carried inputs.")
      .def(py::init([](gc::Channel& ch, const std::string& role, int ot_k, const std::string& ot) {
        int party = role == "garbler" ? 0 : role == "evaluator" ? 1 : -1;
        if (party < 0) throw py::value_error("role must be 'garbler' or 'evaluator', not '" + role + "'");
        if (ot_k < 1 || ot_k > gc::kMaxOtK)
          throw py::value_error("ot_k must be in 1..8 (SoftSpoken k of the random OTs)");
        if (ot == "softspoken") return new gc::GmwParty(ch, party, gc::GmwOptions{ot_k});
        if (ot == "silent")
          return new gc::GmwParty(ch, party, std::make_unique<gc::SilentRandomOt>(gc::SilentOtParams::ferret()));
        if (ot == "silent-test-only")  // NOT SECURE: tiny LPN parameters, for tests
          return new gc::GmwParty(ch, party,
                                  std::make_unique<gc::SilentRandomOt>(gc::SilentOtParams::test_only()));
        throw py::value_error("ot must be 'softspoken', 'silent' or 'silent-test-only', not '" + ot + "'");
      }), "channel"_a, "role"_a, "ot_k"_a = gc::kDefaultOtK, "ot"_a = "softspoken", py::keep_alive<1, 2>(),
      "ot: where the triples' random OTs come from: 'softspoken' (ot_k), 'silent' (Ferret, "
      "silent_ot.h) or 'silent-test-only' (Ferret's code at an INSECURE size, for tests).")
      .def("setup", [](gc::GmwParty& s) { py::gil_scoped_release r; s.setup(); })
      .def("run", [](gc::GmwParty& s, const gc::Circuit& c, py::dict inputs, py::dict carried, py::object n) {
        return run_gmw(s, c, inputs, carried, n);
      }, "circuit"_a, "inputs"_a = py::dict(), "carried"_a = py::dict(), "n"_a = py::none())
      .def_property_readonly("runs", &gc::GmwParty::runs)
      .def_property_readonly("role", [](const gc::GmwParty& s) { return s.party() == 0 ? "garbler" : "evaluator"; })
      .def_property_readonly("triples_used", &gc::GmwParty::triples_used,
                             "Beaver triples consumed over every run so far (AND gates x instances).")
      .def_property_readonly("layers_used", &gc::GmwParty::layers_used,
                             "AND-layer exchanges (round trips) over every run so far.")
      .def_property_readonly("last_layers", &gc::GmwParty::last_layers,
                             "AND layers (one exchange each way) of the last run: its AND-depth.")
      .def_property_readonly("last_transcript", [](const gc::GmwParty& s) {
        const auto& t = s.last_transcript();
        return py::bytes(reinterpret_cast<const char*>(t.data()), t.size());
      }, "SHA-256 of the peer's openings in the last run (differs between runs: fresh triples).");

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
