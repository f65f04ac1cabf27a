#include "garbled_core/bind_auth_bits.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "garbled_core/auth_bits.h"
#include "garbled_core/auth_triples.h"
#include "garbled_core/iknp.h"
#include "garbled_core/random.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

// A party that deviates when it opens: flips bit `index` and XORs `mac_offset` into its MAC
// (the other party's Delta when the test hands it over, to show that only the MAC stops it).
struct FlipOpening {
  long index = -1;
  gc::block mac_offset{};
  static void apply(std::vector<uint8_t>& bits, gc::BlockVector& macs, void* self) {
    auto* f = static_cast<FlipOpening*>(self);
    if (f->index < 0 || (size_t)f->index >= bits.size()) return;
    bits[(size_t)f->index] ^= 1;
    macs[(size_t)f->index] = gc::xor_block(macs[(size_t)f->index], f->mac_offset);
  }
};

py::bytes block_bytes(gc::block b) {
  uint8_t out[16];
  gc::store_block(out, b);
  return py::bytes(reinterpret_cast<const char*>(out), 16);
}

py::list bits_list(const std::vector<uint8_t>& v) {
  py::list l;
  for (uint8_t b : v) l.append((int)b);
  return l;
}

}  // namespace

gc::AuthCots parse_auth_cots(const std::string& name) {
  if (name == "silent") return gc::AuthCots::Silent;
  if (name == "iknp") return gc::AuthCots::Iknp;
  if (name == "silent-test-only") return gc::AuthCots::SilentTestOnly;
  throw py::value_error("ot must be 'silent', 'iknp' or 'silent-test-only', not '" + name + "'");
}

gc::TripleCheat triple_cheat(const std::string& kind, size_t index, int guess) {
  gc::TripleCheat c;
  c.index = index;
  c.guess = guess;
  if (kind == "u_error") {
    c.kind = gc::TripleCheat::Kind::UError;
    c.error = gc::random_block();
  } else if (kind == "half_and_flip") {
    c.kind = gc::TripleCheat::Kind::HalfAndFlip;
  } else if (kind == "correction_flip") {
    c.kind = gc::TripleCheat::Kind::CorrectionFlip;
  } else if (kind == "check_flip") {
    c.kind = gc::TripleCheat::Kind::CheckFlip;
  } else {
    throw py::value_error("unknown triple cheat '" + kind + "'");
  }
  return c;
}

void bind_auth_bits(py::module_& m) {
  m.attr("_LEAKY_CHUNK") = gc::TripleFactory::kLeakyChunk;  // leaky triples a chunk of a batch
  m.def("_bucket_size", &gc::bucket_size, "n"_a, "rho"_a,
        "The bucket size the triples use for n triples at 2^-rho (auth_triples.h).");
  m.def("_bucketing_error_log2", &gc::bucketing_error_log2, "n"_a, "bucket"_a,
        "log2 of the bucketing bound for n buckets of the given size (auth_triples.h).");
  m.def("_auth_triples_session", [](gc::Channel& ch, bool first, size_t n, int rho, bool leaky_only,
                                    const std::string& cheat, size_t index, int guess, const std::string& ot) {
    const gc::AuthCots cots = parse_auth_cots(ot);
    gc::TripleCheat c;
    if (!cheat.empty()) c = triple_cheat(cheat, index, guess);
    py::dict out;
    std::vector<uint8_t> own_x, a, b, cv;
    bool caught = false;
    std::string message;
    size_t bucket = 0;
    {
      py::gil_scoped_release release;
      gc::AuthParty party(ch, first, nullptr, cots);
      gc::TripleFactory factory(party);
      gc::TripleDeviation hooks = c.hooks();
      if (cheat.empty()) {  // the honest party shows the test its x bits (what a cheater bets on)
        hooks = gc::TripleDeviation{};
        hooks.context = &own_x;
        hooks.observe_x = [](const std::vector<uint8_t>& x, void* self) {
          *static_cast<std::vector<uint8_t>*>(self) = x;
        };
      }
      factory.deviate_for_test(hooks);
      try {
        gc::AuthTriples t = leaky_only ? factory.leaky(n) : factory.make(n, rho);
        bucket = factory.last_bucket_size();
        a = party.open(t.a);
        b = party.open(t.b);
        cv = party.open(t.c);
      } catch (const gc::PeerDeviated& e) {
        caught = true;
        message = e.what();
      }
    }
    out["caught"] = caught;
    out["message"] = message;
    out["bucket"] = bucket;
    out["own_x"] = bits_list(own_x);
    out["a"] = bits_list(a);
    out["b"] = bits_list(b);
    out["c"] = bits_list(cv);
    return out;
  }, "channel"_a, "first"_a, "n"_a, "rho"_a = 40, "leaky_only"_a = false, "cheat"_a = "", "index"_a = 0,
  "guess"_a = -1, "ot"_a = "silent-test-only",
  "Test hook: n authenticated triples (or leaky ones), opened with checks; a cheat makes this "
  "party deviate in the leaky AND. Returns caught / message (PeerDeviated), the bucket size, "
  "the honest party's x bits of the (last) leaky batch and the opened a, b, c.");

  m.def("_auth_bits_session", [](gc::Channel& ch, bool first, size_t n, const std::vector<uint8_t>& public_bits,
                                 long flip_index, py::object mac_offset, py::object delta_bytes,
                                 const std::string& ot) {
    const gc::AuthCots cots = parse_auth_cots(ot);
    if (public_bits.size() != n) throw py::value_error("public_bits: one per share");
    FlipOpening flip;
    flip.index = flip_index;
    if (!mac_offset.is_none()) {
      std::string s = mac_offset.cast<py::bytes>();
      if (s.size() != 16) throw py::value_error("mac_offset: 16 bytes");
      flip.mac_offset = gc::load_block(s.data());
    }
    gc::block given_delta{};
    bool delta_given = !delta_bytes.is_none();
    if (delta_given) {
      std::string s = delta_bytes.cast<py::bytes>();
      if (s.size() != 16) throw py::value_error("delta: 16 bytes");
      given_delta = gc::load_block(s.data());
    }
    py::dict out;
    std::vector<uint8_t> r_open, r_xor_c, r_xor_r2, r_bits, c_open;
    gc::block delta;
    {
      py::gil_scoped_release release;
      gc::AuthParty party(ch, first, delta_given ? &given_delta : nullptr, cots);
      delta = party.delta();
      gc::AuthShares r = party.random(n), r2 = party.random(n);
      r_bits = r.bits;
      if (flip.index >= 0) party.deviate_for_test({&FlipOpening::apply, &flip});
      r_open = party.open(r);
      party.deviate_for_test({});
      r_xor_c = party.open(party.xor_public(r, public_bits));
      r_xor_r2 = party.open(gc::AuthParty::xor_shares(r, r2));
      c_open = party.open(party.constant(public_bits));
    }
    out["delta"] = block_bytes(delta);
    out["own_bits"] = r_bits;
    out["r"] = r_open;
    out["r_xor_public"] = r_xor_c;
    out["r_xor_r2"] = r_xor_r2;
    out["public"] = c_open;
    return out;
  }, "channel"_a, "first"_a, "n"_a, "public_bits"_a, "flip_index"_a = -1, "mac_offset"_a = py::none(), "delta"_a = py::none(),
  "ot"_a = "iknp",
  "Test hook: random authenticated shares r, r2 opened with checks, then r ^ public, r ^ r2 "
  "and the public bits as shares; flip_index / mac_offset make this party deviate in r's opening; "
  "delta fixes this party's Delta (for a cheater who is given it).");
}
