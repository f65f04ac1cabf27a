// Python bindings of silent COT; see bind_silent_ot.h.
#include "garbled_core/bind_silent_ot.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "garbled_core/channel.h"
#include "garbled_core/random.h"
#include "garbled_core/silent_ot.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

py::array_t<uint8_t> labels_array(const gc::block* b, size_t m) {
  py::array_t<uint8_t> a({(py::ssize_t)m, (py::ssize_t)16});
  if (m) std::memcpy(a.mutable_data(), b, m * 16);
  return a;
}

// m: one extend of m COTs, or a sequence of extends (their outputs concatenated).
std::vector<size_t> extend_sizes(const py::object& m) {
  std::vector<size_t> sizes;
  if (py::isinstance<py::int_>(m)) {
    sizes.push_back(m.cast<size_t>());
  } else {
    for (const py::handle& x : m) sizes.push_back(x.cast<size_t>());
  }
  return sizes;
}

gc::SilentOtParams params_of(bool test_only, size_t threads = 1, bool malicious = false) {
  gc::SilentOtParams p = test_only ? gc::SilentOtParams::test_only() : gc::SilentOtParams::ferret();
  if (malicious) p = p.with_malicious_check();
  p.threads = threads;
  return p;
}

py::dict set_dict(const gc::FerretParams& p) {
  return py::dict("name"_a = p.name, "n"_a = p.n, "k"_a = p.k, "t"_a = p.t, "h"_a = p.h,
                  "reserve"_a = p.reserve(), "tree_bytes"_a = p.tree_bytes());
}

struct Counts {
  uint64_t setup_sent = 0, setup_received = 0, extend_sent = 0, extend_received = 0, iterations = 0;
  double setup_seconds = 0, extend_seconds = 0;  // wall clock of this side (spgc bench ot)
  py::dict to_dict() const {
    return py::dict("setup_sent"_a = setup_sent, "setup_received"_a = setup_received,
                    "extend_sent"_a = extend_sent, "extend_received"_a = extend_received,
                    "iterations"_a = iterations, "setup_seconds"_a = setup_seconds,
                    "extend_seconds"_a = extend_seconds);
  }
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

void bind_silent_ot(py::module_& m) {
  m.def("_silent_ot_params", [](bool test_only) {
    const gc::SilentOtParams p = params_of(test_only);
    return py::dict("secure"_a = p.secure, "setup"_a = set_dict(p.setup), "main"_a = set_dict(p.main),
                    "usable_per_iteration"_a = p.usable_per_iteration(), "base_cots"_a = p.base_cots(),
                    "bits_per_ot"_a = p.bits_per_ot());
  }, "test_only"_a = false,
  "Silent OT parameters (Ferret's, or the TEST-ONLY insecure set): sizes, bytes per main iteration "
  "(main.tree_bytes, sender to receiver; the receiver sends nothing after setup), bits_per_ot.");

  m.def("_silent_cot_send", [](gc::Channel& ch, const py::object& m_ots, bool test_only, bool stats,
                               size_t threads, bool malicious, long corrupt) {
    const std::vector<size_t> sizes = extend_sizes(m_ots);
    size_t total = 0;
    for (size_t s : sizes) total += s;
    gc::block delta = gc::random_delta();
    gc::BlockVector q(total);
    Counts c;
    {
      py::gil_scoped_release r;
      gc::SilentCotSender sender(ch, delta, params_of(test_only, threads, malicious));
      if (corrupt >= 0) sender.corrupt_for_test((size_t)corrupt);
      const uint64_t s0 = ch.total_sent(), r0 = ch.total_received();
      const auto t0 = std::chrono::steady_clock::now();
      sender.setup();
      ch.flush();
      const double setup_s = seconds_since(t0);
      const auto t1 = std::chrono::steady_clock::now();
      const uint64_t s1 = ch.total_sent(), r1 = ch.total_received();
      size_t done = 0;
      for (size_t s : sizes) {
        sender.extend(s, q.data() + done);
        done += s;
      }
      ch.flush();
      c = {s1 - s0, r1 - r0, ch.total_sent() - s1, ch.total_received() - r1, sender.iterations(),
           setup_s, seconds_since(t1)};
    }
    py::object d = labels_array(&delta, 1), labels = labels_array(q.data(), total);
    if (stats) return py::tuple(py::make_tuple(d, labels, c.to_dict()));
    return py::tuple(py::make_tuple(d, labels));
  }, "channel"_a, "m"_a, "test_only"_a = false, "stats"_a = false, "threads"_a = 1,
  "malicious"_a = false, "corrupt"_a = -1,
  "Test hook: silent COT sender for m OTs (an int, or a list of extend sizes); returns (delta, q) "
  "[, byte counts of this side]. lsb(q_i) = 0. malicious: with Ferret's consistency check and "
  "checked base COTs; corrupt: flip a bit of that tree message in the first iteration (setup).");

  m.def("_silent_cot_recv", [](gc::Channel& ch, const py::object& m_ots, bool test_only, bool stats,
                               size_t threads, bool malicious) {
    const std::vector<size_t> sizes = extend_sizes(m_ots);
    size_t total = 0;
    for (size_t s : sizes) total += s;
    gc::BlockVector t(total);
    std::vector<uint8_t> bits((total + 7) / 8);
    Counts c;
    {
      py::gil_scoped_release r;
      gc::SilentCotReceiver receiver(ch, params_of(test_only, threads, malicious));
      const uint64_t s0 = ch.total_sent(), r0 = ch.total_received();
      const auto t0 = std::chrono::steady_clock::now();
      receiver.setup();
      const double setup_s = seconds_since(t0);
      const auto t1 = std::chrono::steady_clock::now();
      const uint64_t s1 = ch.total_sent(), r1 = ch.total_received();
      size_t done = 0;
      std::vector<uint8_t> part;
      for (size_t s : sizes) {
        part.assign((s + 7) / 8, 0);
        receiver.extend(s, part.data(), t.data() + done);
        for (size_t j = 0; j < s; ++j)
          bits[(done + j) >> 3] |= (uint8_t)(((part[j >> 3] >> (j & 7)) & 1) << ((done + j) & 7));
        done += s;
      }
      ch.flush();
      c = {s1 - s0, r1 - r0, ch.total_sent() - s1, ch.total_received() - r1, receiver.iterations(),
           setup_s, seconds_since(t1)};
    }
    py::array_t<uint8_t> choices((py::ssize_t)bits.size());
    if (!bits.empty()) std::memcpy(choices.mutable_data(), bits.data(), bits.size());
    py::object labels = labels_array(t.data(), total);
    if (stats) return py::tuple(py::make_tuple(choices, labels, c.to_dict()));
    return py::tuple(py::make_tuple(choices, labels));
  }, "channel"_a, "m"_a, "test_only"_a = false, "stats"_a = false, "threads"_a = 1,
  "malicious"_a = false,
  "Test hook: silent COT receiver for m OTs (an int, or a list of extend sizes); returns "
  "(choices packed LSB-first, labels) [, byte counts of this side]; labels = q ^ b * delta.");
}
