// Standalone check (and benchmark) of silent COT (Ferret, silent_ot.h) over a loopback TCP
// Channel, without Python.
//   g++ -std=c++17 -O3 -Wall -Wextra -maes -mssse3 -msse4.1 -mpclmul -Igarbled_core/include
//     garbled_core/tests/silent_ot_check.cpp garbled_core/src/silent_ot.cpp
//     garbled_core/src/softspoken.cpp garbled_core/src/iknp.cpp garbled_core/src/base_ot.cpp
//     garbled_core/src/channel.cpp garbled_core/src/listener.cpp garbled_core/src/sockets.cpp
//     garbled_core/src/random.cpp garbled_core/src/halfgates.cpp
//     -lssl -lcrypto -lpthread -o silent_ot_check
//   (one command line)
//   ./silent_ot_check            checks on the TEST-ONLY (insecure) parameter set, then on
//                                Ferret's set: a setup and 2.5 main iterations, every output
//                                checked; prints bytes per COT after setup and COTs/s.
//   ./silent_ot_check --quick    the test-only set only
// Checks: t_i == q_i ^ b_i * Delta for every output of several extends (sizes crossing
// iteration boundaries, 1 OT, odd sizes); b_i == lsb(t_i) and lsb(q_i) == 0; choice bits
// balanced; no two sender outputs equal; after setup the receiver sends nothing and the
// sender exactly iterations * t (2h + 1) * 16 bytes, all under Phase::OTExtension.
// Exit status 0 when all pass.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "garbled_core/channel.h"
#include "garbled_core/random.h"
#include "garbled_core/silent_ot.h"

using namespace gc;

namespace {

int g_failures = 0, g_checks = 0;

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
  std::unique_ptr<Channel> sender, receiver;
};

Link make_link() {
  Link l;
  Listener listener("127.0.0.1", 0);
  int port = listener.port();
  std::exception_ptr err;
  std::thread th([&] {
    try {
      l.receiver = Channel::connect("127.0.0.1", port, nullptr, 10.0);
    } catch (...) {
      err = std::current_exception();
    }
  });
  l.sender = listener.accept(nullptr, 10.0);
  th.join();
  if (err) std::rethrow_exception(err);
  l.sender->set_timeout(120);
  l.receiver->set_timeout(120);
  return l;
}

void both(const std::function<void()>& a, const std::function<void()>& b) {
  std::exception_ptr aerr, berr;
  std::thread th([&] {
    try {
      a();
    } catch (...) {
      aerr = std::current_exception();
    }
  });
  try {
    b();
  } catch (...) {
    berr = std::current_exception();
  }
  th.join();
  if (aerr) std::rethrow_exception(aerr);
  if (berr) std::rethrow_exception(berr);
}

block random_delta() {
  block d = random_block();
  return xor_block(and_block(d, make_block(~0ull, ~1ull)), make_block(0, 1));
}

inline bool bit(const uint8_t* bits, size_t j) { return (bits[j >> 3] >> (j & 7)) & 1; }

double thread_cpu() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Checks one batch; returns the number of ones among the choices.
size_t check_batch(const char* what, const BlockVector& q, const BlockVector& t, const std::vector<uint8_t>& b,
                   size_t m, block delta) {
  size_t bad = 0, bad_lsb = 0, ones = 0;
  for (size_t j = 0; j < m; ++j) {
    const bool r = bit(b.data(), j);
    ones += r;
    const block want = r ? xor_block(q[j], delta) : q[j];
    if (!equal_block(want, t[j])) ++bad;
    if (lsb(q[j]) || lsb(t[j]) != r) ++bad_lsb;
  }
  CHECK(bad == 0, "%s: %zu of %zu outputs break t = q ^ b Delta", what, bad, m);
  CHECK(bad_lsb == 0, "%s: %zu outputs with lsb(q) != 0 or lsb(t) != b", what, bad_lsb);
  if (m % 8) CHECK((b[m / 8] >> (m % 8)) == 0, "%s: bits past m set", what);
  return ones;
}

bool distinct(const BlockVector& q, size_t m) {
  std::vector<std::pair<uint64_t, uint64_t>> v(m);
  for (size_t j = 0; j < m; ++j) v[j] = {high64(q[j]), low64(q[j])};
  std::sort(v.begin(), v.end());
  return std::adjacent_find(v.begin(), v.end()) == v.end();
}

struct RunStats {
  double setup_s = 0, extend_s = 0, sender_cpu = 0, receiver_cpu = 0;
  uint64_t setup_bytes = 0, extend_bytes = 0, ots = 0, iterations = 0;
};

RunStats run(const SilentOtParams& P, const std::vector<size_t>& ms, bool check) {
  Link link = make_link();
  Channel& sch = *link.sender;
  Channel& rch = *link.receiver;
  const block delta = random_delta();
  SilentCotSender sender(sch, delta, P);
  SilentCotReceiver receiver(rch, P);
  RunStats st;
  double t0 = now();
  both([&] { sender.setup(); }, [&] { receiver.setup(); });
  st.setup_s = now() - t0;
  st.setup_bytes = sch.total_sent() + rch.total_sent();
  const uint64_t s_ext0 = sch.bytes_sent(Phase::OTExtension), r_tot0 = rch.total_sent(), s_tot0 = sch.total_sent();
  size_t ones = 0, total = 0;
  for (size_t m : ms) {
    BlockVector q(m), t(m);
    std::vector<uint8_t> b((m + 7) / 8, 0xAA);
    const double t1 = now();
    both(
        [&] {
          const double c = thread_cpu();
          sender.extend(m, q.data());
          st.sender_cpu += thread_cpu() - c;
        },
        [&] {
          const double c = thread_cpu();
          receiver.extend(m, b.data(), t.data());
          st.receiver_cpu += thread_cpu() - c;
        });
    st.extend_s += now() - t1;
    if (check) {
      char what[96];
      std::snprintf(what, sizeof what, "%s m=%zu", P.main.name, m);
      ones += check_batch(what, q, t, b, m, delta);
      if (m > 1) CHECK(distinct(q, m), "%s: repeated sender outputs", what);
    }
    total += m;
  }
  st.iterations = sender.iterations();
  st.ots = total;
  st.extend_bytes = (sch.total_sent() - s_tot0) + (rch.total_sent() - r_tot0);
  CHECK(sender.iterations() == receiver.iterations(), "iteration counts differ");
  CHECK(rch.total_sent() == r_tot0, "%s: receiver sent %llu bytes after setup", P.main.name,
        (unsigned long long)(rch.total_sent() - r_tot0));
  const uint64_t want = sender.iterations() * P.main.tree_bytes();
  CHECK(sch.bytes_sent(Phase::OTExtension) - s_ext0 == want && sch.total_sent() - s_tot0 == want,
        "%s: sender sent %llu bytes after setup, want %llu", P.main.name,
        (unsigned long long)(sch.total_sent() - s_tot0), (unsigned long long)want);
  const uint64_t need_iters = (total + P.usable_per_iteration() - 1) / P.usable_per_iteration();
  CHECK(sender.iterations() == need_iters, "%s: %llu iterations, want %llu", P.main.name,
        (unsigned long long)sender.iterations(), (unsigned long long)need_iters);
  if (check && total >= 100000) {
    const double frac = (double)ones / (double)total;
    CHECK(std::fabs(frac - 0.5) < 0.01, "%s: choice bits not balanced: %.4f ones", P.main.name, frac);
  }
  return st;
}

void report(const SilentOtParams& P, const RunStats& st) {
  std::printf("%s: setup %.3f s, %llu bytes (both directions); %llu OTs in %.3f s wall (%.2f M OT/s, both "
              "parties on this machine; per CPU-second: sender %.2f M, receiver %.2f M), %llu main iterations, "
              "%llu bytes after setup = %.4f bits/OT (formula: %.4f bits/OT at full iterations)\n",
              P.main.name, st.setup_s, (unsigned long long)st.setup_bytes, (unsigned long long)st.ots,
              st.extend_s, st.ots / st.extend_s / 1e6, st.ots / st.sender_cpu / 1e6, st.ots / st.receiver_cpu / 1e6,
              (unsigned long long)st.iterations, (unsigned long long)st.extend_bytes, 8.0 * st.extend_bytes / st.ots,
              P.bits_per_ot());
}

void check_errors() {
  // Bad parameters and a bad delta are refused.
  SilentOtParams bad = SilentOtParams::test_only();
  bad.setup.n = 1024;  // fewer than the main set's base
  bool threw = false;
  try {
    bad.validate();
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw, "inconsistent parameters accepted");
  Link link = make_link();
  threw = false;
  try {
    SilentCotSender s(*link.sender, make_block(1, 2), SilentOtParams::test_only());
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw, "delta with lsb 0 accepted");
  // Extend before setup.
  threw = false;
  try {
    SilentCotReceiver r(*link.receiver, SilentOtParams::test_only());
    BlockVector t(4);
    r.extend(4, nullptr, t.data());
  } catch (const std::logic_error&) {
    threw = true;
  }
  CHECK(threw, "extend before setup accepted");
  // The sender's peer closes mid-extend: the receiver gets a ChannelError, not outputs.
  Link l2 = make_link();
  const SilentOtParams P = SilentOtParams::test_only();
  SilentCotSender s(*l2.sender, random_delta(), P);
  SilentCotReceiver r(*l2.receiver, P);
  both([&] { s.setup(); }, [&] { r.setup(); });
  l2.sender->close();
  threw = false;
  try {
    BlockVector t(P.usable_per_iteration() + 10);
    r.extend(t.size(), nullptr, t.data());
  } catch (const ChannelError&) {
    threw = true;
  }
  CHECK(threw, "receiver did not fail when the sender closed");
  CHECK(!r.ready(), "receiver still ready after a failed iteration");
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  try {
    const SilentOtParams T = SilentOtParams::test_only();
    const size_t u = T.usable_per_iteration();
    // Odd sizes, 1 OT, exactly the rest of an iteration, several iterations in one call.
    RunStats st = run(T, {1, 1000, u - 1001, u, 7, 3 * u + 5, 128 * 1000, 12345}, true);
    report(T, st);
    check_errors();
    if (!quick) {
      const SilentOtParams F = SilentOtParams::ferret();
      const size_t uf = F.usable_per_iteration();
      // 2.5 iterations' worth over three extends, every output checked.
      st = run(F, {1000, uf, uf / 2 + 4321}, true);
      report(F, st);
      // Timing without the checks: two whole iterations.
      st = run(F, {2 * uf}, false);
      report(F, st);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    return 1;
  }
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
