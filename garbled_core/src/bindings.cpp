// Python bindings: circuits, the plaintext evaluator, garbler and evaluator
// sessions. Arrays cross as numpy uint64 (one value per instance per port);
// the GIL is released while a run computes or waits on the network.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "garbled_core/bind_channel.h"
#include "garbled_core/auth_garble.h"
#include "garbled_core/auth_gmw.h"
#include "garbled_core/bind_auth_bits.h"
#include "garbled_core/bind_field.h"
#include "garbled_core/bind_gmw.h"
#include "garbled_core/gmw.h"
#include "garbled_core/bind_silent_ot.h"
#include "garbled_core/bind_zk_proof.h"
#include "garbled_core/circuit.h"
#include "garbled_core/halfgates.h"
#include "garbled_core/gf128.h"
#include "garbled_core/iknp.h"
#include "garbled_core/random.h"
#include "garbled_core/session.h"
#include "garbled_core/threehalves.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

// The Circuit.hash a test hook is given, back to its 32 bytes.
std::array<uint8_t, 32> circuit_hash_bytes(const std::string& hex) {
  if (hex.size() != 64) throw py::value_error("a circuit hash is 64 hex digits (Circuit.hash)");
  std::array<uint8_t, 32> out{};
  auto nibble = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    throw py::value_error("a circuit hash is lowercase hex (Circuit.hash)");
  };
  for (size_t i = 0; i < 32; ++i) out[i] = (uint8_t)(nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]));
  return out;
}

constexpr const char* kClaimCircuitDoc =
    "Test hook: state the circuit with this hash (Circuit.hash) in every later run header while "
    "evaluating the circuit run() is given: a party that runs another circuit under the agreed "
    "one's name (never outside tests).";

using U64Array = py::array_t<uint64_t, py::array::c_style>;

gc::InputOwner parse_owner(const std::string& s) {
  if (s == "garbler") return gc::InputOwner::Garbler;
  if (s == "evaluator") return gc::InputOwner::Evaluator;
  if (s == "carried") return gc::InputOwner::Carried;
  throw py::value_error("input owner must be 'garbler', 'evaluator' or 'carried', not '" + s + "'");
}

const char* owner_name(gc::InputOwner o) {
  switch (o) {
    case gc::InputOwner::Garbler: return "garbler";
    case gc::InputOwner::Evaluator: return "evaluator";
    default: return "carried";
  }
}

gc::Reveal parse_reveal(const std::string& s) {
  if (s == "both") return gc::Reveal::Both;
  if (s == "garbler") return gc::Reveal::Garbler;
  if (s == "evaluator") return gc::Reveal::Evaluator;
  if (s == "shares") return gc::Reveal::Shares;
  if (s == "keep") return gc::Reveal::Keep;
  throw py::value_error("output reveal must be one of both/garbler/evaluator/shares/keep, not '" + s + "'");
}

const char* reveal_name(gc::Reveal r) {
  switch (r) {
    case gc::Reveal::Both: return "both";
    case gc::Reveal::Garbler: return "garbler";
    case gc::Reveal::Evaluator: return "evaluator";
    case gc::Reveal::Shares: return "shares";
    default: return "keep";
  }
}

std::shared_ptr<gc::Circuit> make_circuit(uint32_t num_wires,
                                          const std::vector<std::tuple<std::string, std::string, int>>& inputs,
                                          const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& gates,
                                          const std::vector<std::tuple<std::string, std::string, std::vector<int64_t>>>& outputs,
                                          const std::string& name) {
  std::vector<gc::InputPort> ports;
  for (auto& [pname, owner, width] : inputs) ports.push_back({pname, parse_owner(owner), width, 0});
  if (gates.ndim() != 2 || (gates.shape(0) > 0 && gates.shape(1) != 4))
    throw py::value_error("gates must be an integer array of shape (G, 4): (op, a, b, out)");
  std::vector<gc::RawGate> raw;
  raw.reserve((size_t)gates.shape(0));
  auto g = gates.unchecked<2>();
  for (py::ssize_t i = 0; i < gates.shape(0); ++i) {
    for (int j = 0; j < 4; ++j)
      if (g(i, j) < 0 || g(i, j) > 0xfffffffeLL)
        throw py::value_error("gate " + std::to_string(i) + " has an out-of-range field");
    raw.push_back({(gc::GateOp)g(i, 0), (uint32_t)g(i, 1), (uint32_t)g(i, 2), (uint32_t)g(i, 3)});
    if (g(i, 0) > 2) throw py::value_error("gate " + std::to_string(i) + " has unknown op " + std::to_string(g(i, 0)));
  }
  std::vector<gc::OutputPort> outs;
  for (auto& [oname, reveal, wires] : outputs) {
    gc::OutputPort port{oname, parse_reveal(reveal), {}, {}};
    for (int64_t w : wires) {
      if (w < 0 || w >= (int64_t)num_wires)
        throw py::value_error("output '" + oname + "' reads wire " + std::to_string(w) + " of " +
                              std::to_string(num_wires));
      port.wires.push_back((uint32_t)w);
    }
    outs.push_back(std::move(port));
  }
  try {
    return std::make_shared<gc::Circuit>(num_wires, std::move(ports), raw, std::move(outs), name);
  } catch (const std::runtime_error& e) {
    throw py::value_error(e.what());
  }
}

// Checks one port's values: right length, nothing above the port's width.
const uint64_t* port_values(const gc::InputPort& port, const py::handle& obj, size_t n,
                            std::vector<U64Array>& keep_alive) {
  py::array arr = py::reinterpret_borrow<py::array>(obj);
  // Compare kind and size, not identity: unpickled arrays carry an equal but distinct dtype.
  if (!py::isinstance<py::array>(obj) || arr.dtype().kind() != 'u' || arr.dtype().itemsize() != 8)
    throw py::type_error("input '" + port.name + "' must be a numpy uint64 array");
  U64Array a = U64Array::ensure(obj);
  if (a.ndim() != 1 || (size_t)a.shape(0) != n)
    throw py::value_error("input '" + port.name + "' must be 1-D with " + std::to_string(n) + " values");
  if (port.width < 64) {
    const uint64_t* v = a.data();
    uint64_t limit = uint64_t(1) << port.width;
    for (size_t i = 0; i < n; ++i)
      if (v[i] >= limit)
        throw py::value_error("input '" + port.name + "' has value " + std::to_string(v[i]) +
                              " at instance " + std::to_string(i) + ", above its width of " +
                              std::to_string(port.width) + " bits");
  }
  keep_alive.push_back(a);
  return a.data();
}

size_t infer_n(const gc::Circuit& c, const py::dict& inputs, const py::dict& carried, py::object n_obj) {
  if (!n_obj.is_none()) return n_obj.cast<size_t>();
  for (auto item : inputs) {
    py::array a = py::array::ensure(item.second);
    if (a && a.ndim() == 1) return (size_t)a.shape(0);
  }
  for (auto item : carried) {
    if (py::isinstance<gc::CarriedInput>(item.second)) {
      auto& sel = item.second.cast<const gc::CarriedInput&>();
      return sel.indices.empty() ? sel.source->n : sel.indices.size();
    }
    return item.second.cast<std::shared_ptr<gc::KeptLabels>>()->n;
  }
  (void)c;
  throw py::value_error("cannot tell the number of instances: pass n=");
}

struct PreparedRun {
  gc::RunInputs in;
  std::vector<U64Array> arrays;
};

PreparedRun prepare_run(const gc::Circuit& c, const py::dict& inputs, const py::dict& carried,
                        py::object n_obj, gc::InputOwner self) {
  PreparedRun r;
  r.in.n = infer_n(c, inputs, carried, n_obj);
  r.in.values.assign(c.inputs().size(), nullptr);
  r.in.carried.resize(c.inputs().size());
  for (auto item : inputs) {
    std::string name = item.first.cast<std::string>();
    int p = c.input_index(name);
    if (p < 0) throw py::value_error("circuit '" + c.name() + "' has no input '" + name + "'");
    const gc::InputPort& port = c.inputs()[p];
    if (port.owner != self)
      throw py::value_error("input '" + name + "' belongs to the " + owner_name(port.owner) +
                            ", not to this party");
    r.in.values[p] = port_values(port, item.second, r.in.n, r.arrays);
  }
  for (auto item : carried) {
    std::string name = item.first.cast<std::string>();
    int p = c.input_index(name);
    if (p < 0 || c.inputs()[p].owner != gc::InputOwner::Carried)
      throw py::value_error("circuit '" + c.name() + "' has no carried input '" + name + "'");
    if (py::isinstance<gc::CarriedInput>(item.second))
      r.in.carried[p] = item.second.cast<gc::CarriedInput>();
    else
      r.in.carried[p] = gc::CarriedInput{item.second.cast<std::shared_ptr<gc::KeptLabels>>(), {}};
  }
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    const gc::InputPort& port = c.inputs()[p];
    if (port.owner == self && !r.in.values[p])
      throw py::value_error("missing input '" + port.name + "' of the " + owner_name(self));
    if (port.owner == gc::InputOwner::Carried && !r.in.carried[p].source)
      throw py::value_error("missing carried input '" + port.name + "'");
  }
  return r;
}

// The outputs ``self`` learns, by name: its values (revealed to it or to both), its XOR shares,
// or Kept objects; outputs revealed to the other party only are absent (also when n = 0).
py::dict outputs_to_dict(const gc::Circuit& c, gc::RunOutputs& out, gc::InputOwner self) {
  py::dict d;
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const gc::OutputPort& port = c.outputs()[o];
    if (out.kept[o]) {
      d[py::str(port.name)] = py::cast(out.kept[o]);
      continue;
    }
    const bool learns = port.reveal == gc::Reveal::Both || port.reveal == gc::Reveal::Shares ||
                        (port.reveal == gc::Reveal::Garbler && self == gc::InputOwner::Garbler) ||
                        (port.reveal == gc::Reveal::Evaluator && self == gc::InputOwner::Evaluator);
    if (!learns) continue;
    const auto& v = out.values[o];
    U64Array a((py::ssize_t)v.size());
    if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(uint64_t));
    d[py::str(port.name)] = a;
  }
  return d;
}

template <typename SessionT>
py::dict run_session(SessionT& s, const gc::Circuit& c, const py::dict& inputs, const py::dict& carried,
                     py::object n, gc::InputOwner self) {
  PreparedRun prepared = prepare_run(c, inputs, carried, n, self);
  gc::RunOutputs out;
  {
    py::gil_scoped_release release;
    out = s.run(c, prepared.in);
  }
  return outputs_to_dict(c, out, self);
}

py::array_t<uint8_t> blocks_to_array(const gc::block* b, size_t m) {
  py::array_t<uint8_t> a({(py::ssize_t)m, (py::ssize_t)16});
  std::memcpy(a.mutable_data(), b, m * 16);
  return a;
}

gc::Scheme parse_scheme(const std::string& name) {
  if (name == "threehalves") return gc::Scheme::ThreeHalves;
  if (name == "halfgates") return gc::Scheme::HalfGates;
  throw py::value_error("scheme must be 'threehalves' or 'halfgates', not '" + name + "'");
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "SPGC garbled-circuit engine (half-gates, free-XOR, IKNP OT extension)";
  bind_channel(m);
  bind_silent_ot(m);
  bind_field(m);
  bind_auth_bits(m);
  bind_zk_proof(m);
  py::register_exception<gc::ProtocolError>(m, "ProtocolError", PyExc_RuntimeError);
  py::register_exception<gc::PeerDeviated>(m, "PeerDeviated", PyExc_RuntimeError);

  py::class_<gc::Circuit, std::shared_ptr<gc::Circuit>>(m, "Circuit",
      "A compiled circuit: inputs, gates (op, a, b, out) and outputs; see garbled_core.circuit.")
      .def(py::init(&make_circuit), "num_wires"_a, "inputs"_a, "gates"_a, "outputs"_a, "name"_a = "")
      .def_property_readonly("name", &gc::Circuit::name)
      .def_property_readonly("and_count", &gc::Circuit::and_count)
      .def_property_readonly("xor_count", &gc::Circuit::xor_count)
      .def_property_readonly("not_count", &gc::Circuit::not_count)
      .def_property_readonly("num_wires", &gc::Circuit::num_wires)
      .def_property_readonly("num_slots", &gc::Circuit::num_slots)
      .def_property_readonly("hash", &gc::Circuit::hex_digest)
      .def_property_readonly("inputs", [](const gc::Circuit& c) {
        py::list l;
        for (auto& p : c.inputs()) l.append(py::make_tuple(p.name, owner_name(p.owner), p.width));
        return l;
      })
      .def_property_readonly("outputs", [](const gc::Circuit& c) {
        py::list l;
        for (auto& p : c.outputs()) l.append(py::make_tuple(p.name, reveal_name(p.reveal), p.wires.size()));
        return l;
      })
      .def("input_bits", [](const gc::Circuit& c, const std::string& owner) {
        return c.input_bits(parse_owner(owner));
      }, "owner"_a)
      .def("evaluate", [](const gc::Circuit& c, const py::dict& inputs, py::object n) {
        std::vector<U64Array> arrays;
        size_t count = n.is_none() ? 0 : n.cast<size_t>();
        if (n.is_none()) {
          if (inputs.size() == 0) throw py::value_error("cannot tell the number of instances: pass n=");
          count = (size_t)py::array::ensure(inputs.begin()->second).shape(0);
        }
        std::vector<const uint64_t*> ptrs(c.inputs().size(), nullptr);
        for (auto item : inputs) {
          std::string name = item.first.cast<std::string>();
          int p = c.input_index(name);
          if (p < 0) throw py::value_error("circuit '" + c.name() + "' has no input '" + name + "'");
          ptrs[p] = port_values(c.inputs()[p], item.second, count, arrays);
        }
        for (size_t p = 0; p < ptrs.size(); ++p)
          if (!ptrs[p]) throw py::value_error("missing input '" + c.inputs()[p].name + "'");
        std::vector<std::vector<uint64_t>> result;
        {
          py::gil_scoped_release release;
          result = c.evaluate(ptrs, count);
        }
        py::dict d;
        for (size_t o = 0; o < result.size(); ++o) {
          U64Array a((py::ssize_t)count);
          if (count) std::memcpy(a.mutable_data(), result[o].data(), count * sizeof(uint64_t));
          d[py::str(c.outputs()[o].name)] = a;
        }
        return d;
      }, "inputs"_a, "n"_a = py::none(),
      "Plaintext evaluation: every input port by value (carried ones too); returns every output.");

  py::class_<gc::KeptLabels, std::shared_ptr<gc::KeptLabels>>(m, "Kept",
      "Labels of a 'keep' output, held by this party for a later run of the same session.")
      .def_property_readonly("width", [](const gc::KeptLabels& k) { return k.width; })
      .def_property_readonly("n", [](const gc::KeptLabels& k) { return k.n; })
      .def_property_readonly("port", [](const gc::KeptLabels& k) { return k.port; })
      .def("select", [](std::shared_ptr<gc::KeptLabels> k, const U64Array& indices) {
        gc::CarriedInput sel{k, std::vector<uint64_t>(indices.data(), indices.data() + indices.size())};
        for (uint64_t i : sel.indices)
          if (i >= k->n) throw py::index_error("select: instance " + std::to_string(i) + " of " + std::to_string(k->n));
        return sel;
      }, "indices"_a, "Instances to carry, in order (both parties must pass the same indices).")
      .def("__repr__", [](const gc::KeptLabels& k) {
        return "<Kept '" + k.port + "' width=" + std::to_string(k.width) + " n=" + std::to_string(k.n) + ">";
      });
  py::class_<gc::CarriedInput>(m, "KeptSelection")
      .def_property_readonly("n", [](const gc::CarriedInput& c) { return c.indices.size(); });

  py::class_<gc::GarblerSession>(m, "Garbler", "The garbling party (H1) of a two-party session.")
      .def(py::init([](gc::Channel& ch, size_t chunk, size_t threads, const std::string& scheme,
                       int ot_k) {
        if (chunk == 0 || chunk > (1u << 20)) throw py::value_error("chunk must be in 1..1048576");
        if (threads == 0 || threads > gc::kMaxSessionThreads)
          throw py::value_error("threads must be in 1.." + std::to_string(gc::kMaxSessionThreads));
        if (ot_k < 0 || ot_k > gc::kMaxOtK)
          throw py::value_error("ot_k must be in 0..8 (0: IKNP; k: SoftSpoken, 128/k bits per OT)");
        return new gc::GarblerSession(ch, gc::SessionOptions{chunk, threads, parse_scheme(scheme), ot_k});
      }), "channel"_a, "chunk"_a = gc::kDefaultChunk, "threads"_a = 1, "scheme"_a = "threehalves",
      "ot_k"_a = gc::kDefaultOtK, py::keep_alive<1, 2>())
      .def("setup", [](gc::GarblerSession& s) { py::gil_scoped_release r; s.setup(); })
      .def("run", [](gc::GarblerSession& s, const gc::Circuit& c, py::dict inputs, py::dict carried, py::object n) {
        return run_session(s, c, inputs, carried, n, gc::InputOwner::Garbler);
      }, "circuit"_a, "inputs"_a = py::dict(), "carried"_a = py::dict(), "n"_a = py::none())
      .def_property_readonly("runs", &gc::GarblerSession::runs)
      .def("_claim_circuit_for_test", [](gc::GarblerSession& s, const std::string& hash) {
        s.claim_circuit_for_test(circuit_hash_bytes(hash));
      }, "circuit_hash"_a, kClaimCircuitDoc);

  py::class_<gc::EvaluatorSession>(m, "Evaluator", "The evaluating party (H2) of a two-party session.")
      .def(py::init([](gc::Channel& ch, size_t chunk, size_t threads, const std::string& scheme,
                       int ot_k) {
        if (chunk == 0 || chunk > (1u << 20)) throw py::value_error("chunk must be in 1..1048576");
        if (threads == 0 || threads > gc::kMaxSessionThreads)
          throw py::value_error("threads must be in 1.." + std::to_string(gc::kMaxSessionThreads));
        if (ot_k < 0 || ot_k > gc::kMaxOtK)
          throw py::value_error("ot_k must be in 0..8 (0: IKNP; k: SoftSpoken, 128/k bits per OT)");
        return new gc::EvaluatorSession(ch, gc::SessionOptions{chunk, threads, parse_scheme(scheme), ot_k});
      }), "channel"_a, "chunk"_a = gc::kDefaultChunk, "threads"_a = 1, "scheme"_a = "threehalves",
      "ot_k"_a = gc::kDefaultOtK, py::keep_alive<1, 2>())
      .def("setup", [](gc::EvaluatorSession& s) { py::gil_scoped_release r; s.setup(); })
      .def("run", [](gc::EvaluatorSession& s, const gc::Circuit& c, py::dict inputs, py::dict carried, py::object n) {
        return run_session(s, c, inputs, carried, n, gc::InputOwner::Evaluator);
      }, "circuit"_a, "inputs"_a = py::dict(), "carried"_a = py::dict(), "n"_a = py::none())
      .def_property_readonly("runs", &gc::EvaluatorSession::runs);

  py::class_<gc::GmwParty>(m, "GmwParty",
      "One server of the GMW backend: role 'garbler' (H1, party 0, owns the garbler ports) or "
      "'evaluator' (H2, party 1). run() takes and returns what Garbler/Evaluator.run do; Keep "
      "outputs are XOR shares that only this backend's runs accept as carried inputs.")
      .def(py::init([](gc::Channel& ch, const std::string& role, int ot_k, const std::string& ot,
                       size_t threads) {
        int party = role == "garbler" ? 0 : role == "evaluator" ? 1 : -1;
        if (party < 0) throw py::value_error("role must be 'garbler' or 'evaluator', not '" + role + "'");
        if (ot_k < 1 || ot_k > gc::kMaxOtK)
          throw py::value_error("ot_k must be in 1..8 (SoftSpoken k of the random OTs)");
        if (threads < 1 || threads > gc::GmwParty::kMaxGmwThreads)
          throw py::value_error("threads must be in 1.." + std::to_string(gc::GmwParty::kMaxGmwThreads));
        static_assert(gc::GmwParty::kMaxGmwThreads <= gc::SilentOtParams::kMaxLpnThreads, "thread limits");
        if (ot == "softspoken") {
          auto* p = new gc::GmwParty(ch, party, gc::GmwOptions{ot_k});
          p->set_threads(threads);
          return p;
        }
        gc::SilentOtParams params;
        if (ot == "silent")
          params = gc::SilentOtParams::ferret();
        else if (ot == "silent-test-only")  // NOT SECURE: tiny LPN parameters, for tests
          params = gc::SilentOtParams::test_only();
        else
          throw py::value_error("ot must be 'softspoken', 'silent' or 'silent-test-only', not '" + ot + "'");
        params.threads = threads;
        auto* p = new gc::GmwParty(ch, party, std::make_unique<gc::SilentRandomOt>(params));
        p->set_threads(threads);
        return p;
      }), "channel"_a, "role"_a, "ot_k"_a = gc::kDefaultOtK, "ot"_a = "softspoken", "threads"_a = 1,
      py::keep_alive<1, 2>(),
      "ot: where the triples' random OTs come from: 'softspoken' (ot_k), 'silent' (Ferret, "
      "silent_ot.h) or 'silent-test-only' (Ferret's code at an INSECURE size, for tests). "
      "threads: threads this party's AND layers and, on silent OT, its LPN encoding are split "
      "over (the same bits for any count; local to this party).")
      .def("setup", [](gc::GmwParty& s) { py::gil_scoped_release r; s.setup(); })
      .def("run", [](gc::GmwParty& s, const gc::Circuit& c, py::dict inputs, py::dict carried, py::object n) {
        // The same conversion as Garbler/Evaluator.run: the backends are interchangeable.
        const gc::InputOwner self = s.party() == 0 ? gc::InputOwner::Garbler : gc::InputOwner::Evaluator;
        return run_session(s, c, inputs, carried, n, self);
      }, "circuit"_a, "inputs"_a = py::dict(), "carried"_a = py::dict(), "n"_a = py::none())
      .def_property_readonly("runs", &gc::GmwParty::runs)
      .def_property_readonly("role", [](const gc::GmwParty& s) { return s.party() == 0 ? "garbler" : "evaluator"; })
      .def_property_readonly("triples_used", &gc::GmwParty::triples_used,
                             "Beaver triples consumed over every run so far (AND gates x instances).")
      .def_property_readonly("ots_used", &gc::GmwParty::ots_used,
                             "Random OTs received (= sent) over every run so far: one each way per "
                             "AND group (gates of a layer sharing an input) and instance.")
      .def_property_readonly("last_groups", &gc::GmwParty::last_groups,
                             "AND groups (gates of a layer sharing an input) of the last run's circuit.")
      .def_property_readonly("layers_used", &gc::GmwParty::layers_used,
                             "AND-layer exchanges (round trips) over every run so far.")
      .def_property_readonly("last_layers", &gc::GmwParty::last_layers,
                             "AND layers (one exchange each way) of the last run: its AND-depth.")
      .def_property_readonly("last_transcript", [](const gc::GmwParty& s) {
        const auto& t = s.last_transcript();
        return py::bytes(reinterpret_cast<const char*>(t.data()), t.size());
      }, "SHA-256 of the peer's openings in the last run (differs between runs: fresh triples).")
      .def("_claim_circuit_for_test", [](gc::GmwParty& s, const std::string& hash) {
        s.claim_circuit_for_test(circuit_hash_bytes(hash));
      }, "circuit_hash"_a, kClaimCircuitDoc);

  py::class_<gc::AuthSession>(m, "AuthSession",
      "What both authenticated backends (security: malicious; auth_session.h) share: run() takes "
      "and returns what GmwParty.run does; a peer caught deviating raises PeerDeviated before any "
      "output computed from its messages is revealed.")
      .def("setup", [](gc::AuthSession& s) { py::gil_scoped_release r; s.setup(); })
      .def("run", [](gc::AuthSession& s, const gc::Circuit& c, py::dict inputs, py::dict carried, py::object n) {
        const gc::InputOwner self = s.party() == 0 ? gc::InputOwner::Garbler : gc::InputOwner::Evaluator;
        return run_session(s, c, inputs, carried, n, self);
      }, "circuit"_a, "inputs"_a = py::dict(), "carried"_a = py::dict(), "n"_a = py::none())
      .def("prove", &session_prove, "mine"_a, "theirs"_a,
           "Zero-knowledge proofs on this session's authenticated bits (zk_proof.h), both parties at "
           "once: proves `mine` and checks the peer's `theirs`, each a dict of circuit, n, values "
           "(per input port; the peer's private ports empty), broadcast flags and carried ports "
           "((ProofResult, output index) or None), or None. Returns (own, checked) ProofResults; "
           "PeerDeviated when the peer's proof fails.")
      .def("bind_proved", &session_bind_proved, "sources"_a, "source"_a, "instance"_a, "width"_a, "port"_a,
           "A Kept for carried input `port` of `width` bits: instance i reads the kept bits of "
           "instance instance[i] of sources[source[i]] (a (ProofResult, output index) pair, a "
           "64-bit kept port). Both parties pass the same indices.")
      .def_property_readonly("ands_proved", &gc::AuthSession::ands_proved,
                             "AND gates this party proved in zero knowledge so far.")
      .def_property_readonly("runs", &gc::AuthSession::runs)
      .def_property_readonly("role", [](const gc::AuthSession& s) { return s.party() == 0 ? "garbler" : "evaluator"; })
      .def_property_readonly("rho", &gc::AuthSession::rho)
      .def_property_readonly("triples_used", &gc::AuthSession::triples_used,
                             "Authenticated AND triples consumed over every run (AND gates x instances).")
      .def_property_readonly("leaky_triples_made", &gc::AuthSession::leaky_triples_made,
                             "Leaky triples made for them (bucket size x triples).")
      .def_property_readonly("last_bucket_size", &gc::AuthSession::last_bucket_size)
      .def_property_readonly("triples_in_stock", &gc::AuthSession::triples_in_stock,
                             "Triples made and not used yet (each run takes its own).")
      .def_property_readonly("triples_made", &gc::AuthSession::triples_made)
      .def_property_readonly("triple_bytes", &gc::AuthSession::triple_bytes,
                             "Bytes (both ways) of the triples' own messages so far (phase tables).")
      .def_property_readonly("triple_cots", &gc::AuthSession::triple_cots,
                             "COTs each way the triples made so far took.")
      .def_property_readonly("last_layers", &gc::AuthSession::last_layers,
                             "Exchanges of the last run's gates (authenticated GMW: its AND layers; "
                             "authenticated garbling: one per chunk of instances).")
      .def_property_readonly("layers_used", &gc::AuthSession::layers_used,
                             "Exchanges of the gates (round trips) over every run so far.")
      .def_property_readonly("ots_used", &gc::AuthSession::ots_used,
                             "COTs received (= sent) for authenticated shares over every run so far.")
      .def_property_readonly("evidence_digest", [](const gc::AuthSession& s) {
        return gc::hex(s.evidence().data(), s.evidence().size());
      }, "Hex SHA-256 of everything the peer sent in the last run (kept as evidence on an abort).")
      .def("_deviate_for_test", [](gc::AuthSession& s, const std::string& kind, size_t index, py::object mac_offset) {
        gc::AuthDeviation d;
        if (kind == "flip_opening") d.kind = gc::AuthDeviation::Kind::FlipOpening;
        else if (kind == "flip_wire") d.kind = gc::AuthDeviation::Kind::FlipWire;
        else if (kind == "flip_output") d.kind = gc::AuthDeviation::Kind::FlipOutput;
        else if (kind == "flip_input_mask") d.kind = gc::AuthDeviation::Kind::FlipInputMask;
        else if (kind == "flip_row") d.kind = gc::AuthDeviation::Kind::FlipRow;
        else throw py::value_error("unknown deviation '" + kind + "'");
        d.index = index;
        if (!mac_offset.is_none()) {
          std::string b = mac_offset.cast<py::bytes>();
          if (b.size() != 16) throw py::value_error("mac_offset: 16 bytes");
          d.mac_offset = gc::load_block(b.data());
        }
        s.deviate_for_test(d);
      }, "kind"_a, "index"_a, "mac_offset"_a = py::none(), "Test hook: make this party deviate (never outside tests).")
      .def("_deviate_triples_for_test", [](gc::AuthSession& s, const std::string& kind, size_t index) {
        s.deviate_triples_for_test(triple_cheat(kind, index, -1));
      }, "kind"_a, "index"_a, "Test hook: make this party deviate in the leaky AND (never outside tests).")
      .def("_claim_circuit_for_test", [](gc::AuthSession& s, const std::string& hash) {
        s.claim_circuit_for_test(circuit_hash_bytes(hash));
      }, "circuit_hash"_a, kClaimCircuitDoc)
      .def("_delta_for_test", [](const gc::AuthSession& s) {
        uint8_t b[16];
        gc::store_block(b, s.delta_for_test());
        return py::bytes(reinterpret_cast<const char*>(b), 16);
      });

  // One constructor for both authenticated backends (the same arguments).
  auto auth_init = [](auto* tag) {
    using Party = std::remove_pointer_t<decltype(tag)>;
    return py::init([](gc::Channel& ch, const std::string& role, int rho, const std::string& ot,
                       size_t triple_batch) {
      const int party = role == "garbler" ? 0 : role == "evaluator" ? 1 : -1;
      if (party < 0) throw py::value_error("role must be 'garbler' or 'evaluator', not '" + role + "'");
      if (rho < 1 || rho > 128) throw py::value_error("rho must be in 1..128 (statistical security bits)");
      if (triple_batch > (size_t(1) << 24))
        throw py::value_error("triple_batch must be at most 2^24 (about 100 bytes of memory each)");
      return new Party(ch, party, rho, parse_auth_cots(ot), triple_batch);
    });
  };
  constexpr const char* kAuthInitDoc =
      "ot: where the COTs behind the authenticated shares come from: 'silent' (Ferret with its "
      "malicious check; the default), 'iknp' (with KOS's check; 16 bytes per COT each way) or "
      "'silent-test-only' (Ferret's code at an INSECURE size, for tests). triple_batch: triples "
      "made at once, at least (a stock used by later runs; 2^20 by default, where the bucket "
      "size is 3; 0: each batch of a run makes exactly what it needs).";
  py::class_<gc::AuthGmwParty, gc::AuthSession>(m, "AuthGmwParty",
      "One server of authenticated GMW (security: malicious; auth_gmw.h): role 'garbler' (H1) or "
      "'evaluator' (H2); one round trip per AND layer.")
      .def(auth_init((gc::AuthGmwParty*)nullptr), "channel"_a, "role"_a, "rho"_a = gc::kDefaultRho,
           "ot"_a = "silent", "triple_batch"_a = gc::AuthSession::kDefaultTripleBatch, py::keep_alive<1, 2>(),
           kAuthInitDoc);
  py::class_<gc::AuthGarbleParty, gc::AuthSession>(m, "AuthGarbleParty",
      "One server of authenticated garbling (security: malicious on backend gc; auth_garble.h, "
      "Wang-Ranellucci-Katz 2017): role 'garbler' (H1) or 'evaluator' (H2); a constant number of "
      "round trips a run, whatever the circuit's depth.")
      .def(auth_init((gc::AuthGarbleParty*)nullptr), "channel"_a, "role"_a, "rho"_a = gc::kDefaultRho,
           "ot"_a = "silent", "triple_batch"_a = gc::AuthSession::kDefaultTripleBatch, py::keep_alive<1, 2>(),
           kAuthInitDoc);
  m.attr("AUTH_TABLE_BYTES") = gc::kAuthTableBytes;

  m.def("garble_only", [](const gc::Circuit& c, size_t n, size_t chunk, const std::string& scheme) {
    gc::Scheme s = parse_scheme(scheme);
    py::gil_scoped_release r;
    return gc::garble_only_seconds(c, n, chunk, s);
  }, "circuit"_a, "n"_a, "chunk"_a = gc::kDefaultChunk, "scheme"_a = "threehalves",
  "Garbles n instances with random labels, no peer; returns seconds.");
  m.def("and_table_bytes", [](const std::string& scheme, size_t n) {
    return gc::and_table_bytes(parse_scheme(scheme), n);
  }, "scheme"_a, "n"_a, "Bytes of one AND gate's garbled table over n instances.");
  m.attr("GARBLING_SCHEMES") = py::make_tuple("threehalves", "halfgates");
  m.attr("DEFAULT_OT_K") = gc::kDefaultOtK;
  m.attr("DEFAULT_CHUNK") = gc::kDefaultChunk;

  m.def("and_kernel", []() { return std::string(gc::and_kernels().name); },
        "Name of the AND-gate kernels in use ('vaes' or 'aesni').");
  m.def("available_and_kernels", []() {
    std::vector<std::string> names;
    for (const char* const* p = gc::available_and_kernels(); *p; ++p) names.emplace_back(*p);
    return names;
  });
  m.def("set_and_kernel", [](const std::string& name) {
    if (!gc::select_and_kernels(name.c_str()))
      throw py::value_error("AND kernel '" + name + "' is not available on this CPU");
  }, "name"_a, "Both parties must produce identical tables whichever kernel they use.");

  // Building blocks exposed for tests.
  m.def("_transpose128", [](const py::array_t<uint8_t, py::array::c_style>& in) {
    if (in.ndim() != 2 || in.shape(0) != 128 || in.shape(1) != 16)
      throw py::value_error("expected a (128, 16) uint8 array");
    gc::block rows[128], out[128];
    for (int i = 0; i < 128; ++i) rows[i] = gc::load_block(in.data() + 16 * i);
    gc::transpose128(rows, 1, out);
    return blocks_to_array(out, 128);
  });
  // One three-halves AND gate over n instances with the current kernel: labels as (n, 16)
  // uint8 arrays, delta / salt as 16 bytes, coins as ceil(n / 4) bytes.
  auto blocks_of = [](const py::array_t<uint8_t, py::array::c_style>& a, const char* what) {
    if (a.ndim() != 2 || a.shape(1) != 16) throw py::value_error(std::string(what) + ": expected (n, 16) uint8");
    gc::BlockVector v((size_t)a.shape(0));
    for (size_t i = 0; i < v.size(); ++i) v[i] = gc::load_block(a.data() + 16 * i);
    return v;
  };
  auto block_of = [](const py::bytes& b, const char* what) {
    std::string s = b;
    if (s.size() != 16) throw py::value_error(std::string(what) + ": expected 16 bytes");
    return gc::load_block(reinterpret_cast<const uint8_t*>(s.data()));
  };
  m.def("_garble_and_threehalves", [blocks_of, block_of](
      const py::array_t<uint8_t, py::array::c_style>& a0, const py::array_t<uint8_t, py::array::c_style>& b0,
      const py::bytes& delta, const py::bytes& salt, uint64_t tweak, uint64_t first_instance,
      const py::bytes& coins) {
    gc::BlockVector a = blocks_of(a0, "a0"), b = blocks_of(b0, "b0");
    const size_t n = a.size();
    std::string cs = coins;
    if (b.size() != n || cs.size() != (n + 3) / 4) throw py::value_error("sizes do not match");
    if (first_instance % 8) throw py::value_error("first_instance must be a multiple of 8");
    gc::BlockVector c(n);
    std::vector<uint8_t> table(gc::threehalves_table_bytes(n));
    gc::garble_and_threehalves(a.data(), b.data(), c.data(), table.data(), n, first_instance,
                               gc::ThreeHalvesDelta(block_of(delta, "delta")), block_of(salt, "salt"), tweak,
                               reinterpret_cast<const uint8_t*>(cs.data()));
    return py::make_tuple(blocks_to_array(c.data(), n),
                          py::bytes(reinterpret_cast<const char*>(table.data()), table.size()));
  });
  m.def("_eval_and_threehalves", [blocks_of, block_of](
      const py::array_t<uint8_t, py::array::c_style>& a_in, const py::array_t<uint8_t, py::array::c_style>& b_in,
      const py::bytes& table, const py::bytes& salt, uint64_t tweak, uint64_t first_instance) {
    gc::BlockVector a = blocks_of(a_in, "a"), b = blocks_of(b_in, "b");
    const size_t n = a.size();
    std::string t = table;
    if (b.size() != n || t.size() != gc::threehalves_table_bytes(n)) throw py::value_error("sizes do not match");
    if (first_instance % 8) throw py::value_error("first_instance must be a multiple of 8");
    gc::BlockVector c(n);
    gc::eval_and_threehalves(a.data(), b.data(), c.data(), reinterpret_cast<const uint8_t*>(t.data()), n,
                             first_instance, block_of(salt, "salt"), tweak);
    return blocks_to_array(c.data(), n);
  });
  m.def("_cot_send", [block_of](gc::Channel& ch, size_t m_ots, int ot_k, bool checked, py::object delta_bytes,
                                 bool open_another_coin) {
    gc::block delta = delta_bytes.is_none()
                          ? gc::random_delta()
                          : block_of(delta_bytes.cast<py::bytes>(), "delta");
    gc::BlockVector q(m_ots);
    {
      py::gil_scoped_release r;
      if (ot_k > 0) {
        if (checked) throw std::invalid_argument("the KOS check is built for IKNP (ot_k = 0) only");
        gc::SoftSpokenCotSender sender(ot_k);
        sender.setup(ch, delta);
        sender.extend(ch, q.data(), m_ots);
      } else {
        gc::CotSender sender;
        // A sender that deviates: it opens another coin part than it committed to, one that
        // depends on the receiver's part (the steering a commitment must stop).
        if (open_another_coin)
          sender.deviate_for_test({[](gc::CotSender::Bytes16& opened, const gc::CotSender::Bytes16& theirs) {
            for (size_t i = 0; i < opened.size(); ++i) opened[i] ^= theirs[i];
          }});
        sender.setup(ch, delta);
        if (checked)
          sender.extend_checked(ch, q.data(), m_ots);
        else
          sender.extend(ch, q.data(), m_ots);
      }
      ch.flush();
    }
    return py::make_tuple(blocks_to_array(&delta, 1), blocks_to_array(q.data(), m_ots));
  }, "channel"_a, "m"_a, "ot_k"_a = 0, "checked"_a = false, "delta"_a = py::none(),
  "open_another_coin"_a = false,
  "Test hook: COT sender (IKNP, with KOS's check if checked, or SoftSpoken k) for m OTs; "
  "returns (delta, q). delta (16 bytes, lowest bit set) for tests that need to know it; "
  "open_another_coin makes it a sender that deviates in the coin toss.");
  m.def("_cot_recv", [](gc::Channel& ch, const py::array_t<uint8_t, py::array::c_style>& choices,
                        int ot_k, bool checked, const std::vector<std::pair<size_t, int>>& flips,
                        const std::vector<int>& guesses) {
    size_t m_ots = (size_t)choices.size() * 8;
    gc::BlockVector t(m_ots);
    std::vector<uint8_t> bits(choices.data(), choices.data() + choices.size());
    if (!guesses.empty() && guesses.size() != flips.size())
      throw py::value_error("guesses: one per flip, or none");
    for (const auto& f : flips)
      if (f.second < 0 || f.second >= 128 || f.first >= m_ots + gc::kKosExtraOts)
        throw py::value_error("a flip is (OT index < m + 256, column < 128)");
    {
      py::gil_scoped_release r;
      if (ot_k > 0) {
        if (checked || !flips.empty()) throw std::invalid_argument("checked and flips are for IKNP (ot_k = 0)");
        gc::SoftSpokenCotReceiver receiver(ot_k);
        receiver.setup(ch);
        receiver.extend(ch, bits.data(), t.data(), m_ots);
        ch.flush();
      } else {
        gc::CotReceiver receiver;
        // A receiver that deviates: flip (j, i) uses choice bit r_j + 1 in matrix column i only;
        // with guesses it then fixes its check values for the guess Delta_i = g.
        gc::CotReceiver::Deviation deviation;
        if (!flips.empty())
          deviation.matrix = [&flips](uint8_t* u, size_t tiles, size_t first_tile) {
            for (const auto& [ot, column] : flips) {
              size_t tile = ot / 128;
              if (tile < first_tile || tile >= first_tile + tiles) continue;
              size_t bit = ot % 128;
              u[16 * ((size_t)column * tiles + (tile - first_tile)) + bit / 8] ^= (uint8_t)(1u << (bit % 8));
            }
          };
        if (!guesses.empty())
          deviation.check = [&flips, &guesses](gc::CotReceiver::Bytes16&, gc::CotReceiver::Bytes16& t_sum,
                                               const std::function<gc::CotReceiver::Bytes16(size_t)>& chi) {
            gc::block t = gc::load_block(t_sum.data());
            for (size_t k = 0; k < flips.size(); ++k) {
              if (!guesses[k]) continue;
              int c = flips[k].second;
              gc::block e = c < 64 ? gc::make_block(0, 1ull << c) : gc::make_block(1ull << (c - 64), 0);
              t = gc::xor_block(t, gc::gf128_mul(gc::load_block(chi(flips[k].first).data()), e));
            }
            gc::store_block(t_sum.data(), t);
          };
        receiver.deviate_for_test(std::move(deviation));
        receiver.setup(ch);
        if (checked)
          receiver.extend_checked(ch, bits.data(), t.data(), m_ots);
        else
          receiver.extend(ch, bits.data(), t.data(), m_ots);
      }
    }
    return blocks_to_array(t.data(), m_ots);
  }, "channel"_a, "choices"_a, "ot_k"_a = 0, "checked"_a = false,
  "flips"_a = std::vector<std::pair<size_t, int>>{}, "guesses"_a = std::vector<int>{},
  "Test hook: COT receiver (IKNP, with KOS's check if checked, or SoftSpoken k) with packed "
  "choice bits; returns the labels. flips/guesses make it a receiver that deviates (above).");
  m.def("_gf128_mul", [block_of](py::bytes a, py::bytes b) {
    gc::block p = gc::gf128_mul(block_of(a, "a"), block_of(b, "b"));
    uint8_t out[16];
    gc::store_block(out, p);
    return py::bytes(reinterpret_cast<const char*>(out), 16);
  }, "a"_a, "b"_a, "Test hook: the product in GF(2^128) of gf128.h (16-byte little-endian elements).");
  m.def("_random_bytes", [](size_t n) {
    std::string s(n, '\0');
    gc::secure_random(s.data(), n);
    return py::bytes(s);
  });
  bind_gmw(m);
}
