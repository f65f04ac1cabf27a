#include "garbled_core/bind_auth_bits.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "garbled_core/auth_bits.h"

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

}  // namespace

void bind_auth_bits(py::module_& m) {
  m.def("_auth_bits_session", [](gc::Channel& ch, bool first, size_t n, const std::vector<uint8_t>& public_bits,
                                 long flip_index, py::object mac_offset, py::object delta_bytes) {
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
      gc::AuthParty party(ch, first, delta_given ? &given_delta : nullptr);
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
  "Test hook: random authenticated shares r, r2 opened with checks, then r ^ public, r ^ r2 "
  "and the public bits as shares; flip_index / mac_offset make this party deviate in r's opening; "
  "delta fixes this party's Delta (for a cheater who is given it).");
}
