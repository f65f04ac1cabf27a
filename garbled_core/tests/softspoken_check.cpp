// Standalone check (and benchmark) of SoftSpoken OT extension against the COT
// correlation, over a loopback TCP Channel, without Python.
//   g++ -std=c++17 -O3 -Wall -Wextra -maes -mssse3 -msse4.1 -mpclmul -Igarbled_core/include
//     garbled_core/tests/softspoken_check.cpp garbled_core/src/softspoken.cpp
//     garbled_core/src/iknp.cpp garbled_core/src/base_ot.cpp garbled_core/src/channel.cpp
//     garbled_core/src/listener.cpp garbled_core/src/sockets.cpp garbled_core/src/random.cpp garbled_core/src/halfgates.cpp -lssl -lcrypto -lpthread
//     -o softspoken_check
//   (one command line; halfgates.cpp holds the engine's AES path switch)
//   ./softspoken_check           checks only, on every AES path the CPU has (aesni, and
//                                vaes when present, plus one side on each); exit status 0
//                                when all pass
//   ./softspoken_check --bench   checks, then OTs/s at k = 2, 4, 7, 8 and IKNP (m = 2^20)
//   ./softspoken_check --bench-only [reps] [--k 2,4,7,8] [--m 1024]
//                                (--k: those k only, no IKNP; --m: OTs per extend, default 2^20)
//   SPGC_GC_KERNEL=aesni ./softspoken_check --bench-only    benchmarks the portable path
// Checks, for k in {1, 2, 3, 4, 5, 6, 7, 8, 10} (3, 5, 6, 7, 10 do not divide 128), m in
// {128, 1024, 128000} (and 13, 67 tiles), chosen and random choices, several extends in a row on
// one setup: t[j] == q[j] ^ r_j * Delta for every j; the exact bytes each side
// sends and receives per phase; the garbler's labels all distinct and
// nonzero; successive extends giving different outputs; random choices
// balanced; the evaluator running extends ahead of the garbler (the session's
// lookahead pattern). All of it on each AES path (and_kernels(): aesni, and
// vaes where the CPU has it); then, with both paths, the evaluator on one and
// the garbler on the other (1, 13, 16, 67 tiles), which holds only if the
// paths agree bit for bit. SPGC_SS_NO_GFNI=1 makes the vaes path use its
// VPMOVB2M transpose instead of the GFNI one.
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
#include <type_traits>
#include <vector>

#include "garbled_core/channel.h"
#include "garbled_core/halfgates.h"
#include "garbled_core/iknp.h"
#include "garbled_core/random.h"
#include "garbled_core/softspoken.h"

using namespace gc;

namespace {

int g_failures = 0, g_checks = 0;

#define CHECK(cond, ...)                                          \
  do {                                                            \
    ++g_checks;                                                   \
    if (!(cond)) {                                                \
      ++g_failures;                                               \
      std::fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);   \
      std::fprintf(stderr, __VA_ARGS__);                          \
      std::fprintf(stderr, "\n");                                 \
    }                                                             \
  } while (0)

struct Link {
  std::unique_ptr<Channel> garbler, evaluator;
};

Link make_link() {
  Link l;
  Listener listener("127.0.0.1", 0);
  int port = listener.port();
  std::exception_ptr err;
  std::thread th([&] {
    try {
      l.evaluator = Channel::connect("127.0.0.1", port, nullptr, 10.0);
    } catch (...) {
      err = std::current_exception();
    }
  });
  l.garbler = listener.accept(nullptr, 10.0);
  th.join();
  if (err) std::rethrow_exception(err);
  l.garbler->set_timeout(120);
  l.evaluator->set_timeout(120);
  return l;
}

// Runs the garbler's part on a thread and the evaluator's here; rethrows.
void both(const std::function<void()>& garbler, const std::function<void()>& evaluator) {
  std::exception_ptr gerr, eerr;
  std::thread th([&] {
    try {
      garbler();
    } catch (...) {
      gerr = std::current_exception();
    }
  });
  try {
    evaluator();
  } catch (...) {
    eerr = std::current_exception();
  }
  th.join();
  if (gerr) std::rethrow_exception(gerr);
  if (eerr) std::rethrow_exception(eerr);
}

block random_delta() {
  block d = random_block();
  return xor_block(and_block(d, make_block(~0ull, ~1ull)), make_block(0, 1));
}

inline bool bit(const uint8_t* bits, size_t j) { return (bits[j >> 3] >> (j & 7)) & 1; }

// Positions j where t[j] != q[j] ^ r_j * delta.
size_t mismatches(const block* q, const block* t, const uint8_t* r, size_t m, block delta) {
  size_t bad = 0;
  for (size_t j = 0; j < m; ++j) {
    block want = bit(r, j) ? xor_block(q[j], delta) : q[j];
    if (!equal_block(want, t[j])) ++bad;
  }
  return bad;
}

bool all_distinct_nonzero(const block* q, size_t m) {
  std::vector<std::pair<uint64_t, uint64_t>> v(m);
  for (size_t j = 0; j < m; ++j) {
    v[j] = {high64(q[j]), low64(q[j])};
    if (v[j].first == 0 && v[j].second == 0) return false;
  }
  std::sort(v.begin(), v.end());
  return std::adjacent_find(v.begin(), v.end()) == v.end();
}

size_t popcount(const uint8_t* bits, size_t m) {
  size_t c = 0;
  for (size_t j = 0; j < m; ++j) c += bit(bits, j);
  return c;
}

size_t same_positions(const BlockVector& a, const BlockVector& b, size_t m) {
  size_t s = 0;
  for (size_t j = 0; j < m; ++j) s += equal_block(a[j], b[j]);
  return s;
}

void check_k(int k) {
  Link link = make_link();
  Channel& gch = *link.garbler;
  Channel& ech = *link.evaluator;
  const block delta = random_delta();
  SoftSpokenCotSender sender(k);
  SoftSpokenCotReceiver receiver(k);
  const SoftSpokenParams& P = sender.params();
  both([&] { sender.setup(gch, delta); }, [&] { receiver.setup(ech); });
  const uint64_t setup_e = 33 + P.setup_extra_bytes(), setup_g = 128 * 33;
  CHECK(ech.bytes_sent(Phase::BaseOT) == setup_e, "k=%d setup: evaluator sent %llu, want %llu", k,
        (unsigned long long)ech.bytes_sent(Phase::BaseOT), (unsigned long long)setup_e);
  CHECK(gch.bytes_sent(Phase::BaseOT) == setup_g, "k=%d setup: garbler sent %llu, want %llu", k,
        (unsigned long long)gch.bytes_sent(Phase::BaseOT), (unsigned long long)setup_g);
  CHECK(gch.bytes_received(Phase::BaseOT) == setup_e && ech.bytes_received(Phase::BaseOT) == setup_g,
        "k=%d setup: received counts", k);
  CHECK(ech.total_sent() == setup_e && gch.total_sent() == setup_g, "k=%d setup: bytes outside BaseOT", k);

  // 13 and 67 tiles: partial AES groups (8 + 5) and a partial batch (64 + 3).
  const size_t ms[] = {128, 1024, 128 * 1000, 128 * 13, 128 * 67};
  for (size_t m : ms) {
    for (int random_mode = 0; random_mode < 2; ++random_mode) {
      BlockVector prev_q, prev_t;
      for (int rep = 0; rep < 3; ++rep) {
        BlockVector q(m), t(m);
        std::vector<uint8_t> r(m / 8);
        if (!random_mode) {
          if (rep == 0) secure_random(r.data(), r.size());
          if (rep == 1) std::fill(r.begin(), r.end(), 0xff);
          if (rep == 2) std::fill(r.begin(), r.end(), 0x00);
        }
        const uint64_t e0 = ech.bytes_sent(Phase::OTExtension), g0 = gch.bytes_sent(Phase::OTExtension);
        const uint64_t gr0 = gch.bytes_received(Phase::OTExtension);
        const uint64_t et0 = ech.total_sent(), gt0 = gch.total_sent();
        both(
            [&] {
              if (random_mode)
                sender.extend_random(gch, q.data(), m);
              else
                sender.extend(gch, q.data(), m);
            },
            [&] {
              if (random_mode)
                receiver.extend_random(ech, r.data(), t.data(), m);
              else
                receiver.extend(ech, r.data(), t.data(), m);
            });
        const uint64_t want = P.extend_bytes(m, random_mode != 0);
        const uint64_t esent = ech.bytes_sent(Phase::OTExtension) - e0;
        CHECK(esent == want, "k=%d m=%zu random=%d rep=%d: evaluator sent %llu, want %llu", k, m, random_mode,
              rep, (unsigned long long)esent, (unsigned long long)want);
        CHECK(ech.total_sent() - et0 == want, "k=%d m=%zu: evaluator sent bytes outside OTExtension", k, m);
        CHECK(gch.bytes_sent(Phase::OTExtension) == g0 && gch.total_sent() == gt0,
              "k=%d m=%zu random=%d: garbler sent bytes in extend", k, m, random_mode);
        CHECK(gch.bytes_received(Phase::OTExtension) - gr0 == want, "k=%d m=%zu: garbler received count", k, m);
        CHECK(gch.phase() == Phase::Setup && ech.phase() == Phase::Setup, "k=%d: phase not restored", k);
        size_t bad = mismatches(q.data(), t.data(), r.data(), m, delta);
        CHECK(bad == 0, "k=%d m=%zu random=%d rep=%d: %zu of %zu OTs violate t = q ^ r*Delta", k, m,
              random_mode, rep, bad, m);
        CHECK(all_distinct_nonzero(q.data(), m), "k=%d m=%zu random=%d rep=%d: garbler labels not distinct",
              k, m, random_mode, rep);
        if (random_mode) {
          // Binomial(m, 1/2): within 6 standard deviations.
          double dev = std::fabs((double)popcount(r.data(), m) - m / 2.0) / (std::sqrt((double)m) / 2);
          CHECK(dev < 6, "k=%d m=%zu rep=%d: random choices unbalanced (%.1f sigma)", k, m, rep, dev);
        }
        if (rep > 0) {
          CHECK(same_positions(q, prev_q, m) == 0, "k=%d m=%zu random=%d rep=%d: q repeats the previous extend",
                k, m, random_mode, rep);
          CHECK(same_positions(t, prev_t, m) == 0, "k=%d m=%zu random=%d rep=%d: t repeats the previous extend",
                k, m, random_mode, rep);
        }
        prev_q = std::move(q);
        prev_t = std::move(t);
      }
    }
  }

  // The session's pattern: the evaluator runs several extends ahead (it never
  // waits for the garbler), the garbler reads them later, in order.
  {
    const size_t m = 128 * 64 * 3, n = 6;
    std::vector<BlockVector> q(n, BlockVector(m)), t(n, BlockVector(m));
    std::vector<std::vector<uint8_t>> r(n, std::vector<uint8_t>(m / 8));
    for (auto& x : r) secure_random(x.data(), x.size());
    both(
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          for (size_t i = 0; i < n; ++i) {
            if (i % 2)
              sender.extend_random(gch, q[i].data(), m);
            else
              sender.extend(gch, q[i].data(), m);
          }
        },
        [&] {
          for (size_t i = 0; i < n; ++i) {
            if (i % 2)
              receiver.extend_random(ech, r[i].data(), t[i].data(), m);
            else
              receiver.extend(ech, r[i].data(), t[i].data(), m);
          }
        });
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += mismatches(q[i].data(), t[i].data(), r[i].data(), m, delta);
    CHECK(bad == 0, "k=%d lookahead: %zu mismatches", k, bad);
  }

  std::printf("k=%d ok so far (chunks=%d, setup extra %zu B, %.3f B/OT chosen, %.3f B/OT random)\n", k,
              P.chunks, P.setup_extra_bytes(), P.extend_bytes(128000, false) / 128000.0,
              P.extend_bytes(128000, true) / 128000.0);
}

// The two AES paths (and_kernels(): "aesni", "vaes") must give the same
// outputs bit for bit: the evaluator extends on one path, then the garbler
// on the other (the evaluator only sends, so it can finish first; the
// switch is process-wide, so the two must not overlap), and the correlation
// holds only if both sides' leaf streams, reductions and transposes agree.
void check_mixed_paths(int k, const char* first, const char* second) {
  Link link = make_link();
  Channel& gch = *link.garbler;
  Channel& ech = *link.evaluator;
  const block delta = random_delta();
  SoftSpokenCotSender sender(k);
  SoftSpokenCotReceiver receiver(k);
  select_and_kernels(first);
  both([&] { sender.setup(gch, delta); }, [&] { receiver.setup(ech); });
  // One extend's corrections must fit the loopback socket buffers (the
  // garbler reads only after the evaluator is done): at most 64 KiB.
  const size_t ms[] = {128, 128 * 13, 128 * 16, 128 * 67};
  for (int swap = 0; swap < 2; ++swap)
    for (size_t m : ms)
      for (int random_mode = 0; random_mode < 2; ++random_mode) {
        if (sender.params().extend_bytes(m, false) > 65536) continue;
        BlockVector q(m), t(m);
        std::vector<uint8_t> r(m / 8);
        if (!random_mode) secure_random(r.data(), r.size());
        select_and_kernels(swap ? second : first);
        if (random_mode)
          receiver.extend_random(ech, r.data(), t.data(), m);
        else
          receiver.extend(ech, r.data(), t.data(), m);
        select_and_kernels(swap ? first : second);
        if (random_mode)
          sender.extend_random(gch, q.data(), m);
        else
          sender.extend(gch, q.data(), m);
        size_t bad = mismatches(q.data(), t.data(), r.data(), m, delta);
        CHECK(bad == 0, "k=%d m=%zu random=%d: evaluator on %s, garbler on %s: %zu of %zu OTs differ", k, m,
              random_mode, swap ? second : first, swap ? first : second, bad, m);
      }
}

void check_misc() {
  // The verifier itself catches a single flipped bit.
  {
    const size_t m = 256;
    BlockVector q(m), t(m);
    std::vector<uint8_t> r(m / 8);
    secure_random(r.data(), r.size());
    block delta = random_delta();
    for (size_t j = 0; j < m; ++j) {
      q[j] = random_block();
      t[j] = bit(r.data(), j) ? xor_block(q[j], delta) : q[j];
    }
    CHECK(mismatches(q.data(), t.data(), r.data(), m, delta) == 0, "verifier: clean input");
    t[77] = xor_block(t[77], make_block(0, 1ull << 40));
    CHECK(mismatches(q.data(), t.data(), r.data(), m, delta) == 1, "verifier misses a flipped bit");
  }
  // Parameter validation.
  bool threw = false;
  try {
    SoftSpokenParams p(0);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw, "k=0 accepted");
  threw = false;
  try {
    SoftSpokenParams p(11);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  CHECK(threw, "k=11 accepted");
  for (int k = 1; k <= 10; ++k) {
    SoftSpokenParams p(k);
    int sum = 0;
    bool balanced = true;
    for (int b = 0; b < p.chunks; ++b) {
      balanced = balanced && p.first_bit(b) == sum && (p.depth[b] == k || p.depth[b] == k - 1) &&
                 (b == 0 || p.depth[b] <= p.depth[b - 1]);
      sum += p.depth[b];
    }
    CHECK(sum == 128 && p.chunks == (128 + k - 1) / k && balanced, "k=%d: chunk layout", k);
  }
  // extend before setup, m not a multiple of 128
  SoftSpokenCotSender s(8);
  threw = false;
  Link link = make_link();
  try {
    BlockVector q(128);
    s.extend(*link.garbler, q.data(), 128);
  } catch (const std::logic_error&) {
    threw = true;
  }
  CHECK(threw, "extend before setup accepted");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of the calling thread (its compute plus its socket system calls,
// not the time it waits for the peer).
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

size_t g_bench_m = size_t(1) << 20;

// Each side times its own extends; both run at once over loopback. Each rep
// is 2^20 OTs: 2^20 / m extends of m OTs (--m).
template <typename Sender, typename Receiver>
void bench_one(const char* name, Sender& sender, Receiver& receiver, bool random_mode, int reps) {
  const size_t m = g_bench_m, calls = std::max<size_t>(1, (size_t(1) << 20) / m);
  Link link = make_link();
  Channel& gch = *link.garbler;
  Channel& ech = *link.evaluator;
  const block delta = random_delta();
  auto s0 = std::chrono::steady_clock::now();
  both([&] { sender.setup(gch, delta); }, [&] { receiver.setup(ech); });
  const double setup_ms = seconds_since(s0) * 1e3;
  BlockVector q(m), t(m);
  std::vector<uint8_t> r(m / 8);
  secure_random(r.data(), r.size());
  double gs = 0, es = 0, gc_ = 0, ec = 0;
  uint64_t bytes = 0;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    uint64_t b0 = ech.bytes_sent(Phase::OTExtension);
    double g = 0, e = 0, gcpu = 0, ecpu = 0;
    both(
        [&] {
          auto t0 = std::chrono::steady_clock::now();
          double c0 = thread_cpu_seconds();
          if constexpr (std::is_same<Sender, CotSender>::value)
            for (size_t c = 0; c < calls; ++c) sender.extend(gch, q.data(), m);
          else if (random_mode)
            for (size_t c = 0; c < calls; ++c) sender.extend_random(gch, q.data(), m);
          else
            for (size_t c = 0; c < calls; ++c) sender.extend(gch, q.data(), m);
          g = seconds_since(t0);
          gcpu = thread_cpu_seconds() - c0;
        },
        [&] {
          auto t0 = std::chrono::steady_clock::now();
          double c0 = thread_cpu_seconds();
          if constexpr (std::is_same<Receiver, CotReceiver>::value)
            for (size_t c = 0; c < calls; ++c) receiver.extend(ech, r.data(), t.data(), m);
          else if (random_mode)
            for (size_t c = 0; c < calls; ++c) receiver.extend_random(ech, r.data(), t.data(), m);
          else
            for (size_t c = 0; c < calls; ++c) receiver.extend(ech, r.data(), t.data(), m);
          e = seconds_since(t0);
          ecpu = thread_cpu_seconds() - c0;
        });
    if (rep >= 0) {
      gs += g;
      es += e;
      gc_ += gcpu;
      ec += ecpu;
      bytes += ech.bytes_sent(Phase::OTExtension) - b0;
    }
  }
  size_t bad = mismatches(q.data(), t.data(), r.data(), m, delta);
  CHECK(bad == 0, "bench %s: %zu mismatches", name, bad);
  double ots = (double)m * calls * reps;
  std::printf(
      "%-22s m=%zu x%zu x%d  wall: garbler %6.2f evaluator %6.2f M OT/s | per CPU-s: garbler %6.2f evaluator %6.2f M OT/s"
      " | evaluator sent %.4f B/OT | setup %.0f ms\n",
      name, m, calls, reps, ots / gs / 1e6, ots / es / 1e6, ots / gc_ / 1e6, ots / ec / 1e6, (double)bytes / ots, setup_ms);
  std::fflush(stdout);
}

std::vector<int> g_bench_ks = {2, 4, 7, 8};
bool g_bench_iknp = true;

void bench(int reps) {
  std::printf("benchmark (loopback TCP, plaintext channel, one thread per party, both at once; wall = OTs / each"
              " side's elapsed time in extend, per CPU-s = OTs / that thread's CPU time)\n");
  if (g_bench_iknp) {
    CotSender s;
    CotReceiver r;
    bench_one("IKNP", s, r, false, reps);
  }
  for (int k : g_bench_ks) {
    for (int random_mode = 0; random_mode < 2; ++random_mode) {
      SoftSpokenCotSender s(k);
      SoftSpokenCotReceiver r(k);
      char name[64];
      std::snprintf(name, sizeof name, "SoftSpoken k=%d %s", k, random_mode ? "random" : "chosen");
      bench_one(name, s, r, random_mode != 0, reps);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool run_checks = true, run_bench = false;
  int reps = 4;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--bench") run_bench = true;
    else if (a == "--bench-only") run_bench = true, run_checks = false;
    else if (a == "--m" && i + 1 < argc) {  // OTs per extend in the benchmark (multiple of 128)
      g_bench_m = std::max<size_t>(128, (size_t)std::strtoull(argv[++i], nullptr, 10) / 128 * 128);
    } else if (a == "--k" && i + 1 < argc) {  // e.g. --k 8 or --k 2,4,7,8 (SoftSpoken only)
      g_bench_ks.clear();
      g_bench_iknp = false;
      for (const char* p = argv[++i]; *p;) {
        char* end;
        g_bench_ks.push_back((int)std::strtol(p, &end, 10));
        p = *end ? end + 1 : end;
      }
    }
    else reps = std::max(1, std::atoi(argv[i]));
  }
  try {
    const std::string initial = and_kernels().name;
    if (run_checks) {
      // Every check on every AES path this CPU has.
      std::vector<std::string> kernels;
      for (const char* const* p = available_and_kernels(); *p; ++p) kernels.emplace_back(*p);
      for (const std::string& kernel : kernels) {
        select_and_kernels(kernel.c_str());
        std::printf("AES path: %s\n", and_kernels().name);
        check_misc();
        for (int k : {1, 2, 3, 4, 5, 6, 7, 8, 10}) check_k(k);
      }
      if (kernels.size() > 1) {
        for (int k : {1, 2, 3, 4, 5, 6, 7, 8, 10}) check_mixed_paths(k, kernels[0].c_str(), kernels[1].c_str());
        std::printf("mixed paths (%s / %s) ok so far\n", kernels[0].c_str(), kernels[1].c_str());
      } else {
        std::printf("only the %s path on this CPU: mixed-path check skipped\n", kernels[0].c_str());
      }
      select_and_kernels(initial.c_str());
    }
    if (run_bench) {
      std::printf("AES path: %s (SPGC_GC_KERNEL=aesni forces the portable one)\n", and_kernels().name);
      bench(reps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: exception: %s\n", e.what());
    return 2;
  }
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures ? 1 : 0;
}
