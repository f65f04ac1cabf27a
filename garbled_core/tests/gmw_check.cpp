// Standalone check of the GMW backend (gmw.h) over a loopback TCP Channel, without Python.
//   g++ -std=c++17 -O2 -Wall -Wextra -maes -mssse3 -msse4.1 -mpclmul -Igarbled_core/include
//     garbled_core/tests/gmw_check.cpp $(ls garbled_core/src/*.cpp | grep -v bind)
//     -lssl -lcrypto -lpthread -o gmw_check
//   (one command line)
//   ./gmw_check      exit status 0 when every check passes
// Checks: random circuits of AND / XOR / NOT gates (both parties' inputs, every reveal kind)
// against Circuit::evaluate at several n (1, 63, 64, 777, 4099); a Keep output carried into a
// second run with and without a selection; the same on silent OT at its test size (many
// iterations, the two directions' LPN encodings paired); the same circuit with a plug-in RandomOtSource of
// the test's own (ROTs dealt from a seed both parties know: insecure, no bytes), which shows
// that the triple generator does not care where its random OTs come from.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "garbled_core/gmw.h"
#include "garbled_core/prg.h"

using namespace gc;

namespace {

int g_checks = 0, g_failures = 0;

#define CHECK(cond, ...)                                        \
  do {                                                          \
    ++g_checks;                                                 \
    if (!(cond)) {                                              \
      ++g_failures;                                             \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);                        \
      std::fprintf(stderr, "\n");                               \
    }                                                           \
  } while (0)

struct Link {
  std::unique_ptr<Channel> h1, h2;
};

Link make_link() {
  Link l;
  Listener listener("127.0.0.1", 0);
  const int port = listener.port();
  std::exception_ptr err;
  std::thread th([&] {
    try {
      l.h2 = Channel::connect("127.0.0.1", port, nullptr, 10.0);
    } catch (...) {
      err = std::current_exception();
    }
  });
  l.h1 = listener.accept(nullptr, 10.0);
  th.join();
  if (err) std::rethrow_exception(err);
  return l;
}

// Runs party 0 on a thread and party 1 here; rethrows either's exception.
void both(const std::function<void()>& p0, const std::function<void()>& p1) {
  std::exception_ptr e0, e1;
  std::thread th([&] {
    try {
      p0();
    } catch (...) {
      e0 = std::current_exception();
    }
  });
  try {
    p1();
  } catch (...) {
    e1 = std::current_exception();
  }
  th.join();
  if (e0) std::rethrow_exception(e0);
  if (e1) std::rethrow_exception(e1);
}

// A random circuit: "g" (16 bits, party 0), "e" (12 bits, party 1), gates over a pool, and
// outputs of every reveal kind.
std::unique_ptr<Circuit> random_circuit(uint32_t seed, int gates) {
  std::mt19937 rng(seed);
  std::vector<InputPort> inputs = {{"g", InputOwner::Garbler, 16, 0}, {"e", InputOwner::Evaluator, 12, 0}};
  std::vector<uint32_t> pool;
  for (uint32_t w = 1; w <= 28; ++w) pool.push_back(w);
  std::vector<RawGate> raw;
  uint32_t next = 29;
  for (int i = 0; i < gates; ++i) {
    const uint32_t a = pool[rng() % pool.size()], b = pool[rng() % pool.size()];
    const GateOp op = (GateOp)(rng() % 3);
    raw.push_back({op, a, op == GateOp::Not ? 0u : b, next});
    pool.push_back(next++);
  }
  auto last = [&](size_t count, size_t skip) {
    std::vector<uint32_t> w(pool.end() - (long)(count + skip), pool.end() - (long)skip);
    return w;
  };
  std::vector<OutputPort> outputs = {{"both", Reveal::Both, last(40, 0), {}},
                                     {"to_h1", Reveal::Garbler, last(7, 3), {}},
                                     {"to_h2", Reveal::Evaluator, last(9, 11), {}},
                                     {"shares", Reveal::Shares, last(20, 5), {}},
                                     {"keep", Reveal::Keep, last(16, 1), {}},
                                     {"input", Reveal::Both, {1, 2, 17, 0}, {}}};
  return std::make_unique<Circuit>(next, inputs, raw, outputs, "random" + std::to_string(seed));
}

// ROTs dealt from a seed both parties hold: every party can compute every ROT. INSECURE, for
// this check only: it shows that GmwParty runs on any RandomOtSource.
class DealtOt : public RandomOtSource {
 public:
  const char* name() const override { return "dealt-insecure"; }
  void setup(Channel&, int party, block) override { party_ = party; }
  void receive(Channel&, uint64_t* choice, block* chosen, size_t m) override {
    deal(1 - party_, m, nullptr, nullptr, choice, chosen);
  }
  void send(Channel&, block* s0, block* s1, size_t m) override { deal(party_, m, s0, s1, nullptr, nullptr); }
  bool receiver_speaks() const override { return true; }  // neither half uses the link
  double bytes_per_rot() const override { return 0; }

 private:
  int party_ = 0;
  Prg dir_[2] = {Prg(make_block(7, 0)), Prg(make_block(7, 1))};
  // Per ROT: two strings and one block whose lsb is the choice.
  void deal(int sender, size_t m, block* s0, block* s1, uint64_t* u, block* su) {
    BlockVector r(3 * m);
    dir_[sender].fill(r.data(), r.size());
    if (u) std::memset(u, 0, m / 8);
    for (size_t j = 0; j < m; ++j) {
      const block a = r[3 * j], b = r[3 * j + 1];
      const bool c = lsb(r[3 * j + 2]);
      if (s0) s0[j] = a, s1[j] = b;
      if (u) {
        u[j / 64] |= (uint64_t)c << (j % 64);
        su[j] = c ? b : a;
      }
    }
  }
};

std::vector<uint64_t> random_values(std::mt19937_64& rng, size_t n, int width) {
  std::vector<uint64_t> v(n);
  for (auto& x : v) x = rng() & ((uint64_t(1) << width) - 1);
  return v;
}

enum class Source { SoftSpoken, Dealt, Silent };

void check_circuit(const Circuit& c, size_t n, Source source) {
  const bool dealt = source == Source::Dealt;
  std::mt19937_64 rng(n * 31 + (size_t)source);
  auto g = random_values(rng, n, 16), e = random_values(rng, n, 12);
  auto want = c.evaluate({g.data(), e.data()}, n);
  Link link = make_link();
  std::unique_ptr<GmwParty> p0, p1;
  if (dealt) {
    p0 = std::make_unique<GmwParty>(*link.h1, 0, std::make_unique<DealtOt>());
    p1 = std::make_unique<GmwParty>(*link.h2, 1, std::make_unique<DealtOt>());
  } else if (source == Source::Silent) {  // paired LPN encoding, many iterations (test size)
    p0 = std::make_unique<GmwParty>(*link.h1, 0, std::make_unique<SilentRandomOt>(SilentOtParams::test_only()));
    p1 = std::make_unique<GmwParty>(*link.h2, 1, std::make_unique<SilentRandomOt>(SilentOtParams::test_only()));
  } else {
    p0 = std::make_unique<GmwParty>(*link.h1, 0);
    p1 = std::make_unique<GmwParty>(*link.h2, 1);
  }
  RunInputs in0, in1;
  in0.n = in1.n = n;
  in0.values = {g.data(), nullptr};
  in1.values = {nullptr, e.data()};
  in0.carried.resize(2);
  in1.carried.resize(2);
  RunOutputs o0, o1;
  both([&] { o0 = p0->run(c, in0); }, [&] { o1 = p1->run(c, in1); });
  const char* tag = dealt ? "dealt" : source == Source::Silent ? "silent" : "softspoken";
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const Reveal r = c.outputs()[o].reveal;
    const auto& name = c.outputs()[o].name;
    if (r == Reveal::Both || r == Reveal::Garbler)
      CHECK(o0.values[o] == want[o], "%s n=%zu: party 0 output %s", tag, n, name.c_str());
    if (r == Reveal::Both || r == Reveal::Evaluator)
      CHECK(o1.values[o] == want[o], "%s n=%zu: party 1 output %s", tag, n, name.c_str());
    if (r == Reveal::Garbler) CHECK(o1.values[o].empty(), "%s: party 1 got %s", tag, name.c_str());
    if (r == Reveal::Evaluator) CHECK(o0.values[o].empty(), "%s: party 0 got %s", tag, name.c_str());
    if (r == Reveal::Shares) {
      bool ok = o0.values[o].size() == n && o1.values[o].size() == n;
      for (size_t i = 0; ok && i < n; ++i) ok = (o0.values[o][i] ^ o1.values[o][i]) == want[o][i];
      CHECK(ok, "%s n=%zu: shares do not XOR to the value", tag, n);
    }
  }
  CHECK(link.h1->bytes_sent(Phase::OTExtension) == (dealt ? 0u : link.h2->bytes_received(Phase::OTExtension)),
        "%s: OT bytes", tag);

  // Keep -> carried, the whole Kept and a reversed selection of every other instance.
  const size_t keep = 4;
  std::vector<OutputPort> outs = {{"v", Reveal::Both, {}, {}}};
  for (uint32_t w = 1; w <= 16; ++w) outs[0].wires.push_back(w);
  Circuit carry(17, {{"keep", InputOwner::Carried, 16, 0}}, {}, outs, "carry");
  std::vector<uint64_t> picks;
  for (size_t i = n; i-- > 0;)
    if (i % 2 == 0) picks.push_back(i);
  for (int sel = 0; sel < 2; ++sel) {
    RunInputs c0, c1;
    c0.n = c1.n = sel ? picks.size() : n;
    c0.values = c1.values = {nullptr};
    c0.carried = {CarriedInput{o0.kept[keep], sel ? picks : std::vector<uint64_t>{}}};
    c1.carried = {CarriedInput{o1.kept[keep], sel ? picks : std::vector<uint64_t>{}}};
    RunOutputs r0, r1;
    both([&] { r0 = p0->run(carry, c0); }, [&] { r1 = p1->run(carry, c1); });
    bool ok = r0.values[0].size() == c0.n && r1.values[0] == r0.values[0];
    for (size_t i = 0; ok && i < c0.n; ++i) ok = r0.values[0][i] == want[keep][sel ? picks[i] : i];
    CHECK(ok, "%s n=%zu: carried keep (selection %d)", tag, n, sel);
  }
}

}  // namespace

int main() {
  try {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      auto c = random_circuit(seed, 300);
      for (size_t n : {1, 63, 64, 777, 4099}) check_circuit(*c, n, Source::SoftSpoken);
      check_circuit(*c, 1000, Source::Dealt);
      for (size_t n : {5, 4099}) check_circuit(*c, n, Source::Silent);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    ++g_failures;
  }
  std::printf("gmw_check: %d checks, %d failures\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
