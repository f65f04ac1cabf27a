#include "garbled_core/bind_zk_proof.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "garbled_core/auth_bits.h"
#include "garbled_core/bind_auth_bits.h"
#include "garbled_core/channel.h"
#include "garbled_core/chacha20.h"
#include "garbled_core/circuit.h"
#include "garbled_core/iknp.h"
#include "garbled_core/session.h"
#include "garbled_core/zk_proof.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

using U64In = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>;

std::vector<uint64_t> u64_values(const py::handle& h) {
  U64In a = py::cast<U64In>(h);
  return std::vector<uint64_t>(a.data(), a.data() + a.size());
}

// {"circuit": Circuit, "n": int, "values": per input port (numpy or a list), "broadcast":
// [bool], "carried": [None or a reference] per input port} or None; `resolve` turns a
// reference into the kept shares it names.
gc::ProofStatement parse_statement(const py::object& spec, std::shared_ptr<gc::Circuit>& hold,
                                   const std::function<const gc::AuthShares*(const py::handle&)>& resolve) {
  gc::ProofStatement st;
  if (spec.is_none()) return st;
  py::dict d = spec.cast<py::dict>();
  hold = d["circuit"].cast<std::shared_ptr<gc::Circuit>>();
  st.circuit = hold.get();
  st.n = d["n"].cast<size_t>();
  for (const py::handle& v : d["values"].cast<py::list>()) st.values.push_back(u64_values(v));
  st.broadcast = d["broadcast"].cast<std::vector<bool>>();
  if (d.contains("carried"))
    for (const py::handle& ref : d["carried"].cast<py::list>())
      st.carried.push_back(ref.is_none() ? nullptr : resolve(ref));
  return st;
}

// The test hook's references: (step, output port) of an earlier step on the same side.
gc::ProofStatement statement(const py::object& spec, std::shared_ptr<gc::Circuit>& hold,
                             const std::vector<gc::ProofResult>& results) {
  return parse_statement(spec, hold, [&](const py::handle& ref) {
    const auto [step, port] = ref.cast<std::pair<size_t, size_t>>();
    if (step >= results.size() || port >= results[step].kept.size())
      throw py::value_error("a carried port names a step or output that is not there");
    return &results[step].kept[port];
  });
}

// AuthSession.prove's references: (ProofResult, output port), held while the proof runs.
gc::ProofStatement session_statement(const py::object& spec, std::shared_ptr<gc::Circuit>& hold,
                                     std::vector<std::shared_ptr<gc::ProofResult>>& held) {
  return parse_statement(spec, hold, [&](const py::handle& ref) {
    py::tuple t = ref.cast<py::tuple>();
    auto r = t[0].cast<std::shared_ptr<gc::ProofResult>>();
    const size_t port = t[1].cast<size_t>();
    if (port >= r->kept.size() || r->kept[port].size() == 0)
      throw py::value_error("a carried port names an output the proof did not keep");
    held.push_back(r);
    return &r->kept[port];
  });
}

gc::block block_arg(const py::object& o, const char* what) {
  if (o.is_none()) return gc::zero_block();
  std::string s = o.cast<py::bytes>();
  if (s.size() != 16) throw py::value_error(std::string(what) + ": 16 bytes");
  return gc::load_block(s.data());
}

py::list opened_list(const gc::ProofResult& r) {
  py::list l;
  for (const auto& v : r.opened) l.append(py::cast(v));
  return l;
}

}  // namespace

py::tuple session_prove(gc::AuthSession& s, const py::object& mine, const py::object& theirs) {
  std::shared_ptr<gc::Circuit> hold_mine, hold_theirs;
  std::vector<std::shared_ptr<gc::ProofResult>> held;
  const gc::ProofStatement a = session_statement(mine, hold_mine, held);
  const gc::ProofStatement b = session_statement(theirs, hold_theirs, held);
  auto own = std::make_shared<gc::ProofResult>(), checked = std::make_shared<gc::ProofResult>();
  {
    py::gil_scoped_release release;
    auto result = s.prove(a, b);
    *own = std::move(result.first);
    *checked = std::move(result.second);
  }
  return py::make_tuple(own, checked);
}

std::shared_ptr<gc::KeptLabels> session_bind_proved(gc::AuthSession& s, const py::list& sources,
                                                    const py::object& source, const py::object& instance,
                                                    int width, const std::string& port) {
  std::vector<std::shared_ptr<gc::ProofResult>> held;
  std::vector<const gc::AuthShares*> from;
  for (const py::handle& ref : sources) {
    py::tuple t = ref.cast<py::tuple>();
    auto r = t[0].cast<std::shared_ptr<gc::ProofResult>>();
    const size_t p = t[1].cast<size_t>();
    if (p >= r->kept.size() || r->kept[p].size() == 0)
      throw py::value_error("bind_proved: a source names an output the proof did not keep");
    held.push_back(r);
    from.push_back(&r->kept[p]);
  }
  const std::vector<uint64_t> src64 = u64_values(source), inst = u64_values(instance);
  std::vector<uint32_t> src(src64.begin(), src64.end());
  py::gil_scoped_release release;
  try {
    return s.bind_proved(from, src, inst, width, port);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(e.what());
  }
}

void bind_zk_proof(py::module_& m) {
  m.def("chacha_blocks", [](py::bytes key, const U64In& counters, const U64In& nonces, int rounds) {
    const std::string k = key;
    if (k.size() != 32) throw py::value_error("chacha_blocks: a 32-byte key");
    if (nonces.ndim() != 2 || nonces.shape(1) != 3 || counters.ndim() != 1 || nonces.shape(0) != counters.shape(0))
      throw py::value_error("chacha_blocks: counters (n,) and nonces (n, 3)");
    if (rounds < 2 || rounds > 20 || rounds % 2) throw py::value_error("chacha_blocks: rounds 2, 4, .., 20");
    const size_t n = (size_t)counters.shape(0);
    uint32_t kw[8];
    for (int i = 0; i < 8; ++i) {
      kw[i] = 0;
      for (int j = 0; j < 4; ++j) kw[i] |= (uint32_t)(uint8_t)k[(size_t)(4 * i + j)] << (8 * j);
    }
    py::array_t<uint32_t> out({(py::ssize_t)n, (py::ssize_t)16});
    uint32_t* o = out.mutable_data();
    const uint64_t* c = counters.data();
    const uint64_t* nn = nonces.data();
    {
      py::gil_scoped_release release;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t nonce[3] = {(uint32_t)nn[3 * i], (uint32_t)nn[3 * i + 1], (uint32_t)nn[3 * i + 2]};
        gc::chacha_block(kw, (uint32_t)c[i], nonce, rounds, o + 16 * i);
      }
    }
    return out;
  }, "key"_a, "counters"_a, "nonces"_a, "rounds"_a = 20,
  "ChaCha's block function (RFC 8439; rounds 20, or 8 for ChaCha8) for n blocks under one "
  "32-byte key: counters (n,) and nonces (n, 3) as 32-bit words; returns (n, 16) uint32 words "
  "(the key stream, little endian).");
  py::class_<gc::ProofResult, std::shared_ptr<gc::ProofResult>>(m, "ProofResult",
      "One side of a zero-knowledge proof (zk_proof.h): the opened outputs' values and the kept "
      "outputs' authenticated bits (carried into later proofs and, by AuthSession.bind_proved, "
      "into runs).")
      .def_property_readonly("opened", [](const gc::ProofResult& r) {
        py::list l;
        for (const auto& v : r.opened) {
          if (v.empty()) {
            l.append(py::none());
            continue;
          }
          py::array_t<uint64_t> a((py::ssize_t)v.size());
          std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(uint64_t));
          l.append(a);
        }
        return l;
      }, "Per output port: the opened values (numpy uint64), or None for a kept port.");

  m.attr("_ZK_ANDS_PER_BATCH") = gc::ZkProofs::kAndsPerBatch;
  m.def("_zk_proof_session", [](gc::Channel& ch, bool first, py::list mine_steps, py::list theirs_steps,
                                 const std::string& cheat, size_t index, py::object offset, bool coin_first,
                                 py::object delta_bytes, bool open_kept, const std::string& ot) {
    if (mine_steps.size() != theirs_steps.size()) throw py::value_error("mine and theirs: one statement a step each");
    gc::ProofCheat c;
    c.index = index;
    c.offset = block_arg(offset, "offset");
    if (cheat == "flip_and") {
      c.kind = gc::ProofCheat::Kind::FlipAnd;
    } else if (cheat == "flip_opened") {
      c.kind = gc::ProofCheat::Kind::FlipOpened;
    } else if (cheat == "forge_with_early_coin") {
      c.kind = gc::ProofCheat::Kind::ForgeWithEarlyCoin;
    } else if (cheat == "misstate_length") {
      c.kind = gc::ProofCheat::Kind::MisstateLength;
    } else if (!cheat.empty()) {
      throw py::value_error("unknown proof cheat '" + cheat + "'");
    }
    const gc::AuthCots cots = parse_auth_cots(ot);
    const bool delta_given = !delta_bytes.is_none();
    const gc::block given = block_arg(delta_bytes, "delta");
    std::vector<gc::ProofResult> own, checked;
    std::vector<std::vector<std::vector<uint8_t>>> kept_mine, kept_theirs;
    bool caught = false;
    std::string message;
    uint64_t ands = 0, batches = 0, sent = 0;
    gc::AuthParty party(ch, first, delta_given ? &given : nullptr, cots);
    gc::ZkProofs proofs(party);
    proofs.cheat_for_test(c);
    if (coin_first) proofs.coin_first_for_test();
    const uint64_t before = ch.total_sent();
    try {
      for (size_t k = 0; k < mine_steps.size(); ++k) {
        std::shared_ptr<gc::Circuit> hold_mine, hold_theirs;
        const gc::ProofStatement mine = statement(mine_steps[k], hold_mine, own);
        const gc::ProofStatement theirs = statement(theirs_steps[k], hold_theirs, checked);
        py::gil_scoped_release release;
        auto result = proofs.run(mine, theirs);
        own.push_back(std::move(result.first));
        checked.push_back(std::move(result.second));
      }
      sent = ch.total_sent() - before;
      if (open_kept) {  // the kept outputs are authenticated shares: open them as any other
        py::gil_scoped_release release;
        auto open_all = [&](const std::vector<gc::ProofResult>& rs, std::vector<std::vector<std::vector<uint8_t>>>& to) {
          for (const gc::ProofResult& r : rs) {
            to.emplace_back();
            for (const gc::AuthShares& s : r.kept) to.back().push_back(s.size() ? party.open(s) : std::vector<uint8_t>{});
          }
        };
        if (first) {
          open_all(own, kept_mine);
          open_all(checked, kept_theirs);
        } else {
          open_all(checked, kept_theirs);
          open_all(own, kept_mine);
        }
      }
    } catch (const gc::PeerDeviated& e) {
      caught = true;
      message = e.what();
    }
    ands = proofs.ands_proved();
    batches = proofs.batches();
    py::dict out;
    py::list own_opened, checked_opened;
    for (const auto& r : own) own_opened.append(opened_list(r));
    for (const auto& r : checked) checked_opened.append(opened_list(r));
    out["caught"] = caught;
    out["message"] = message;
    out["own_opened"] = own_opened;
    out["checked_opened"] = checked_opened;
    out["kept_mine"] = py::cast(kept_mine);
    out["kept_theirs"] = py::cast(kept_theirs);
    out["ands"] = ands;
    out["batches"] = batches;
    out["bytes_sent"] = sent;
    return out;
  }, "channel"_a, "first"_a, "mine"_a, "theirs"_a, "cheat"_a = "", "index"_a = 0, "offset"_a = py::none(),
  "coin_first"_a = false, "delta"_a = py::none(), "open_kept"_a = false, "ot"_a = "silent-test-only",
  "Test hook: step by step, this party proves mine[k] and checks the peer's theirs[k] "
  "(zk_proof.h); a statement is a dict of circuit, n, values (per input port; the peer's "
  "private ports empty), broadcast flags and optionally carried ports ((step, output) of an "
  "earlier step's kept outputs on the same side), or None. cheat: 'flip_and' (AND gate "
  "`index`, its W moved by chi times `offset`), 'flip_opened' (opened bit `index`, its MAC "
  "moved by `offset`), 'forge_with_early_coin' (with coin_first on both sides) or "
  "'misstate_length' (the first message's length `index` bytes off). Returns "
  "caught / message, per step the opened outputs of both proofs, the kept outputs opened as "
  "authenticated shares (open_kept), the AND gates proved, the batches and the bytes this "
  "party sent.");
}
