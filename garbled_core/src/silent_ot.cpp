// Silent correlated OT (Ferret, semi-honest or with its malicious check); see silent_ot.h.
#include "garbled_core/silent_ot.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "garbled_core/aes.h"
#include "garbled_core/gf128.h"
#include "garbled_core/iknp.h"
#include "garbled_core/prg.h"
#include "garbled_core/random.h"
#include "garbled_core/sha256.h"
#include "garbled_core/softspoken.h"
#include "garbled_core/vaes.h"

namespace gc {

namespace {

// Fixed public AES keys: the GGM PRG's two halves and the TCCR hash's permutation.
const AesKey& prg_key0() {
  static const AesKey k = aes_key(make_block(0x5350474346455230ull, 0x47474d2d6c656674ull));  // "SPGCFER0" "GGM-left"
  return k;
}
const AesKey& prg_key1() {
  static const AesKey k = aes_key(make_block(0x5350474346455231ull, 0x47474d2d72676874ull));  // "SPGCFER1" "GGM-rght"
  return k;
}
const AesKey& hash_key() {
  static const AesKey k = aes_key(make_block(0x5350474346455248ull, 0x5443435268617368ull));  // "SPGCFERH" "TCCRhash"
  return k;
}
// The LPN code's public seed: fixed per parameter set (both parties derive it).
AesKey lpn_key(const FerretParams& p) {
  return aes_key(make_block(0x535047434c504e43ull ^ (uint64_t)p.n, ((uint64_t)p.k << 8) | (uint64_t)p.h));
}

const block kClearLsb = make_block(~0ull, ~1ull);

// TCCR hash H(x, tw) = pi(pi(x) ^ tw) ^ pi(x) (Guo, Katz, Wang, Yu, S&P 2020).
inline block tccr(block x, block tw) {
  block a[1] = {x};
  aes_encrypt_blocks<1>(hash_key(), a);
  block b[1] = {xor_block(a[0], tw)};
  aes_encrypt_blocks<1>(hash_key(), b);
  return xor_block(b[0], a[0]);
}

// One GGM level in place: nodes nd[0..cnt) become nd[0..2 cnt), node x's children at
// 2x (left) and 2x + 1 (right), G(s) = (AES_K0(s) ^ s, AES_K1(s) ^ s). s0 / s1 get the XOR
// of the new left / right children. Parents are read before any child overwrites them
// (descending order; a batch reads its 4 parents first).
void expand_level_aesni(block* nd, size_t cnt, block* s0, block* s1) {
  block l0 = zero_block(), l1 = zero_block();
  size_t p = cnt;
  while (p >= 4) {
    p -= 4;
    block par[4], a[4], b[4];
    for (int i = 0; i < 4; ++i) par[i] = a[i] = b[i] = nd[p + i];
    aes_encrypt_blocks<4>(prg_key0(), a);
    aes_encrypt_blocks<4>(prg_key1(), b);
    for (int i = 0; i < 4; ++i) {
      const block c0 = xor_block(a[i], par[i]), c1 = xor_block(b[i], par[i]);
      nd[2 * (p + i)] = c0;
      nd[2 * (p + i) + 1] = c1;
      l0 = xor_block(l0, c0);
      l1 = xor_block(l1, c1);
    }
  }
  while (p > 0) {
    --p;
    const block par = nd[p];
    block a[1] = {par}, b[1] = {par};
    aes_encrypt_blocks<1>(prg_key0(), a);
    aes_encrypt_blocks<1>(prg_key1(), b);
    const block c0 = xor_block(a[0], par), c1 = xor_block(b[0], par);
    nd[2 * p] = c0;
    nd[2 * p + 1] = c1;
    l0 = xor_block(l0, c0);
    l1 = xor_block(l1, c1);
  }
  *s0 = l0;
  *s1 = l1;
}

#if GC_X86
// The same level with VAES + AVX-512 (the same bits), for cnt a multiple of 8: 8 parents a
// step, each key's round keys broadcast to the four lanes once per level.
GC_VAES_TARGET void expand_level_vaes(block* nd, size_t cnt, block* s0, block* s1) {
  __m512i k0[11], k1[11];
  for (int r = 0; r < 11; ++r) {
    k0[r] = _mm512_maskz_broadcast_i32x4(0xffff, prg_key0().rk[r]);  // maskz: see vaes.h
    k1[r] = _mm512_maskz_broadcast_i32x4(0xffff, prg_key1().rk[r]);
  }
  // Children of the four parents in a vector, interleaved: (left 0, right 0, left 1, right 1)
  // from the low two lanes of the lefts and of the rights, the rest from the high two.
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i hi = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  __m512i l0 = _mm512_setzero_si512(), l1 = _mm512_setzero_si512();
  for (size_t p = cnt; p >= 8;) {
    p -= 8;
    const __m512i par[2] = {_mm512_loadu_si512(nd + p), _mm512_loadu_si512(nd + p + 4)};
    __m512i a[2], b[2];
    for (int i = 0; i < 2; ++i) {
      a[i] = _mm512_xor_si512(par[i], k0[0]);
      b[i] = _mm512_xor_si512(par[i], k1[0]);
    }
    for (int r = 1; r < 10; ++r)
      for (int i = 0; i < 2; ++i) {
        a[i] = _mm512_aesenc_epi128(a[i], k0[r]);
        b[i] = _mm512_aesenc_epi128(b[i], k1[r]);
      }
    for (int i = 0; i < 2; ++i) {
      const __m512i c0 = _mm512_xor_si512(_mm512_aesenclast_epi128(a[i], k0[10]), par[i]);
      const __m512i c1 = _mm512_xor_si512(_mm512_aesenclast_epi128(b[i], k1[10]), par[i]);
      l0 = _mm512_xor_si512(l0, c0);
      l1 = _mm512_xor_si512(l1, c1);
      _mm512_storeu_si512(nd + 2 * p + 8 * i, _mm512_permutex2var_epi64(c0, lo, c1));
      _mm512_storeu_si512(nd + 2 * p + 8 * i + 4, _mm512_permutex2var_epi64(c0, hi, c1));
    }
  }
  alignas(64) block t0[4], t1[4];
  _mm512_store_si512(t0, l0);
  _mm512_store_si512(t1, l1);
  *s0 = xor_block(xor_block(t0[0], t0[1]), xor_block(t0[2], t0[3]));
  *s1 = xor_block(xor_block(t1[0], t1[1]), xor_block(t1[2], t1[3]));
}
#endif

const bool kGgmVaes = [] {
#if GC_X86
  return cpu_has_vaes();
#else
  return false;
#endif
}();

void expand_level(block* nd, size_t cnt, block* s0, block* s1) {
#if GC_X86
  if (kGgmVaes && cnt % 8 == 0) return expand_level_vaes(nd, cnt, s0, s1);
#endif
  expand_level_aesni(nd, cnt, s0, s1);
}

// out[i] ^= XOR_{j < 10} base[idx(i, j)] for i < n: Ferret's local linear code (d = 10).
// Indices for outputs i .. i + 7 come from 3 AES blocks each (12 32-bit words, the first 10
// scaled to [0, k)). The encoder is bound by the random reads of the base (larger than L2,
// often than what L3 keeps of it), so a batch's indices are computed, and their base lines
// prefetched into L2, kLpnAhead batches ahead of the XORs: L2 takes far more misses in flight
// than L1, and a prefetch into L1 that far ahead would evict the lines before their use. On
// this project's 2-core machine that took the paired encoder from 37 to 79 ns per output
// (one batch ahead into L1) to 32 ns, both parties encoding at once.
constexpr int kD = 10;
constexpr size_t kLpnAhead = 4;  // batches of 8 outputs between a prefetch and its use
// (stride 2: the base is a pair array, entry x at base[2x], see lpn_encode_pair)
void lpn_indices(const AesKey& key, uint64_t k, size_t i, const block* base, size_t stride, uint32_t* idx) {
  block r[24];
  for (int j = 0; j < 8; ++j)
    for (int w = 0; w < 3; ++w) r[3 * j + w] = make_block((uint64_t)w, (uint64_t)(i + j));
  aes_encrypt_blocks<8>(key, r);
  aes_encrypt_blocks<8>(key, r + 8);
  aes_encrypt_blocks<8>(key, r + 16);
  uint32_t words[96];
  std::memcpy(words, r, sizeof words);
  for (int j = 0; j < 8; ++j)
    for (int w = 0; w < kD; ++w) {
      const uint32_t x = (uint32_t)(((uint64_t)words[12 * j + w] * k) >> 32);
      idx[kD * j + w] = x;
#if GC_X86
      _mm_prefetch((const char*)(base + stride * x), _MM_HINT_T1);
#else
      __builtin_prefetch(base + stride * x, 0, 2);
#endif
    }
}

// Outputs [begin, end) only: an iteration encodes its outputs as they are taken (below).
// Ways = 2 encodes two COT objects of one party at once (a sender and a receiver on the same
// parameter set, in the same iteration): their outputs use the same indices, and `base` holds
// their bases interleaved (base[2x] the sender's entry x, base[2x + 1] the receiver's), 32
// bytes that share one cache line. One random read then serves both encodings: the encoder
// is bound by those reads (DRAM, whenever the bases exceed the cache).
template <int Ways>
void lpn_encode_ways(const FerretParams& p, const block* base, block* const* out, size_t begin, size_t end) {
  if (begin >= end) return;
  const AesKey key = lpn_key(p);
  constexpr size_t kRing = kLpnAhead + 1;  // index batches in flight, the one in use included
  uint32_t idx[kRing][8 * kD];
  size_t ahead = begin;  // the first output whose indices are not computed yet
  for (size_t b = 0; b < kLpnAhead && ahead < end; ++b, ahead += 8)
    lpn_indices(key, p.k, ahead, base, Ways, idx[b % kRing]);
  for (size_t i = begin, batch = 0; i < end; i += 8, ++batch) {
    if (ahead < end) {
      lpn_indices(key, p.k, ahead, base, Ways, idx[(batch + kLpnAhead) % kRing]);
      ahead += 8;
    }
    const size_t cnt = std::min<size_t>(8, end - i);
    const uint32_t* ix = idx[batch % kRing];
    for (size_t j = 0; j < cnt; ++j) {
      block acc[Ways];
      for (int v = 0; v < Ways; ++v) acc[v] = out[v][i + j];
      for (int w = 0; w < kD; ++w) {
        const block* e = base + Ways * (size_t)ix[kD * j + w];
        for (int v = 0; v < Ways; ++v) acc[v] = xor_block(acc[v], e[v]);
      }
      for (int v = 0; v < Ways; ++v) out[v][i + j] = acc[v];
    }
  }
}

// Outputs per thread below which a range is not split (a thread's start costs about what
// encoding a few hundred outputs does).
constexpr size_t kMinOutputsPerThread = 2048;

// lpn_encode_ways over up to `threads` threads (the caller's included), each a contiguous
// slice of [begin, end) cut at multiples of 8. Every output depends only on its own index, its
// own leaf and the base (read-only here), and the indices come from a public fixed-key AES in
// counter mode, so the outputs are the same bits for any thread count; nothing random is drawn.
template <int Ways>
void lpn_encode_threads(const FerretParams& p, const block* base, block* const* out, size_t begin, size_t end,
                        size_t threads) {
  const size_t count = end > begin ? end - begin : 0;
  const size_t parts = std::max<size_t>(1, std::min(threads, count / kMinOutputsPerThread));
  if (parts == 1) {
    lpn_encode_ways<Ways>(p, base, out, begin, end);
    return;
  }
  const size_t slice = (count / parts + 7) / 8 * 8;
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(parts);
  for (size_t t = 1; t < parts; ++t) {
    const size_t lo = std::min(end, begin + t * slice), hi = t + 1 == parts ? end : std::min(end, lo + slice);
    workers.emplace_back([&, lo, hi, t] {
      try {
        lpn_encode_ways<Ways>(p, base, out, lo, hi);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  }
  lpn_encode_ways<Ways>(p, base, out, begin, std::min(end, begin + slice));
  for (auto& w : workers) w.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void lpn_encode(const FerretParams& p, const block* base, block* out, size_t begin, size_t end,
                size_t threads = 1) {
  block* const outs[1] = {out};
  lpn_encode_threads<1>(p, base, outs, begin, end, threads);
}

void lpn_encode_pair(const FerretParams& p, const block* pair, block* out_s, block* out_r, size_t begin,
                     size_t end, size_t threads) {
  block* const outs[2] = {out_s, out_r};
  lpn_encode_threads<2>(p, pair, outs, begin, end, threads);
}

inline block tweak(uint64_t iteration, size_t tree, int level) {
  return make_block(iteration, ((uint64_t)tree << 8) | (uint64_t)level);
}

struct PhaseGuard {
  Channel& ch;
  Phase previous;
  PhaseGuard(Channel& c, Phase p) : ch(c), previous(c.phase()) { c.set_phase(p); }
  ~PhaseGuard() { ch.set_phase(previous); }
};

void wipe(BlockVector& v) {
  if (v.size()) std::memset((void*)v.data(), 0, v.size() * sizeof(block));
}
void wipe(detail::HugeBlocks& v) { v.wipe(); }

constexpr int kSoftSpokenK = 7;
constexpr size_t kCheckCots = 128;  // the malicious check's x* (one GF(2^128) element)

// ---- the malicious consistency check (silent_ot.h)

// sum_j chi_j x_j over GF(2^128), chi_j the PRG stream of `seed`; also the sum of chi at the
// increasing positions `at` (the receiver's punctured leaves), into *chi_at.
block chi_sum(block seed, const block* x, size_t n, const std::vector<size_t>& at, block* chi_at) {
  Prg prg(seed);
  constexpr size_t kStep = 4096;
  BlockVector chi(kStep);
  Wide acc{zero_block(), zero_block()}, acc_at{zero_block(), zero_block()};
  size_t next_at = 0;
  for (size_t j0 = 0; j0 < n; j0 += kStep) {
    const size_t m = std::min(kStep, n - j0);
    prg.fill(chi.data(), m);
    for (size_t j = 0; j < m; ++j) acc = xor_wide(acc, clmul_wide(chi[j], x[j0 + j]));
    while (next_at < at.size() && at[next_at] < j0 + m) {
      acc_at.lo = xor_block(acc_at.lo, chi[at[next_at] - j0]);
      ++next_at;
    }
  }
  if (chi_at) *chi_at = acc_at.lo;
  return gf128_reduce(acc);
}

// sum_k c_k X^k over GF(2^128) for the 128 check COTs.
block basis_sum(const block* c) {
  Wide acc{zero_block(), zero_block()};
  for (size_t k = 0; k < kCheckCots; ++k) {
    const block xk = k < 64 ? make_block(0, uint64_t(1) << k) : make_block(uint64_t(1) << (k - 64), 0);
    acc = xor_wide(acc, clmul_wide(c[k], xk));
  }
  return gf128_reduce(acc);
}

std::array<uint8_t, 32> check_digest(block v) {
  static const char kTag[] = "spgc.silent-ot.spcot-check.v1";
  Sha256 h;
  h.update(kTag, sizeof kTag);
  h.update(&v, sizeof v);
  return h.digest();
}

// The end of an iteration, both roles. Bootstrapping: outputs [0, next) are encoded now and
// kept as the next main iteration's base. Outputs past them are encoded as the caller takes
// them (take_encoded), against this iteration's base, which stays in place until the next
// iteration: a run that needs few OTs pays the LPN for those only, not for the whole
// iteration, and the setup iteration's other outputs, dropped, are never encoded.
void finish_iteration(const FerretParams& p, size_t next, const detail::HugeBlocks& base,
                      detail::HugeBlocks& next_base, detail::HugeBlocks& out, size_t* encoded, size_t threads) {
  lpn_encode(p, base.data(), out.data(), 0, next, threads);
  next_base.resize(next);
  std::memcpy((void*)next_base.data(), out.data(), next * sizeof(block));
  *encoded = next;
}

// Makes outputs [.., end) of the current main iteration final (see finish_iteration).
void take_encoded(const FerretParams& main, const detail::HugeBlocks& base, detail::HugeBlocks& out,
                  size_t end, size_t* encoded, size_t threads) {
  if (*encoded >= end) return;
  lpn_encode(main, base.data(), out.data(), *encoded, end, threads);
  *encoded = end;
}

}  // namespace

// ---------------------------------------------------------------- HugeBlocks

namespace detail {

HugeBlocks::~HugeBlocks() {
  wipe();
  std::free(p_);
}

void HugeBlocks::swap(HugeBlocks& other) noexcept {
  std::swap(p_, other.p_);
  std::swap(n_, other.n_);
  std::swap(cap_, other.cap_);
}

void HugeBlocks::wipe() {
  if (n_) std::memset((void*)p_, 0, n_ * sizeof(block));
}

void HugeBlocks::resize(size_t n) {
  if (n > cap_) {
    constexpr size_t kHuge = size_t(2) << 20;
    const size_t bytes = (n * sizeof(block) + kHuge - 1) / kHuge * kHuge;
    block* p = static_cast<block*>(std::aligned_alloc(kHuge, bytes));
    if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE);  // advice only: fine if refused
#endif
    if (n_) std::memcpy((void*)p, p_, n_ * sizeof(block));
    wipe();
    std::free(p_);
    p_ = p;
    cap_ = bytes / sizeof(block);
  }
  n_ = n;
}

}  // namespace detail

// ---------------------------------------------------------------- parameters

SilentOtParams SilentOtParams::ferret() {
  SilentOtParams s;
  s.setup = FerretParams{"ferret-setup", 642048, 19870, 2508, 8};
  s.main = FerretParams{"ferret-main", 10805248, 589760, 1319, 13};
  s.secure = true;
  return s;
}

SilentOtParams SilentOtParams::test_only() {
  SilentOtParams s;
  s.setup = FerretParams{"TEST-ONLY-insecure-setup", 4096, 512, 64, 6};
  s.main = FerretParams{"TEST-ONLY-insecure-main", 16384, 2048, 64, 8};
  s.secure = false;
  return s;
}

SilentOtParams SilentOtParams::with_malicious_check() const {
  SilentOtParams s = *this;
  s.malicious = true;
  s.setup.check = s.main.check = kCheckCots;
  return s;
}

void SilentOtParams::validate() const {
  if (malicious != (setup.check == kCheckCots && main.check == kCheckCots) ||
      (!malicious && (setup.check || main.check)))
    throw std::invalid_argument("silent OT: the malicious check needs 128 check COTs in both sets");
  if (threads < 1 || threads > kMaxLpnThreads)
    throw std::invalid_argument("silent OT: threads must be in 1.." + std::to_string(kMaxLpnThreads));
  for (const FerretParams* p : {&setup, &main}) {
    if (p->h < 1 || p->h > 24 || p->k < 1 || p->t < 1 || p->n != (p->t << p->h) || p->k >= p->n)
      throw std::invalid_argument(std::string("silent OT: inconsistent parameter set ") + p->name);
  }
  if (setup.n < main.reserve())
    throw std::invalid_argument("silent OT: the setup iteration yields fewer COTs than a main iteration needs");
  if (main.n <= main.reserve())
    throw std::invalid_argument("silent OT: a main iteration yields no COTs beyond its own base");
}

// ---------------------------------------------------------------- paired encoding

void encode_jointly(SilentCotSender& s, SilentCotReceiver& r, size_t end) {
  const FerretParams& p = s.params_.main;
  size_t &es = s.encoded_, &er = r.encoded_;
  const size_t join = std::max(es, er);
  // The side behind (it took outputs while the other was still in its last iteration)
  // catches up alone; from there both are encoded together.
  const size_t threads = s.params_.threads;
  if (es < join) {
    lpn_encode(p, s.base_.data(), s.out_.data(), es, std::min(join, end), threads);
    es = std::min(join, end);
  }
  if (er < join) {
    lpn_encode(p, r.base_.data(), r.out_.data(), er, std::min(join, end), threads);
    er = std::min(join, end);
  }
  if (join >= end) return;
  if (s.pair_iteration_ != s.iterations_) {  // this iteration's bases, interleaved
    s.pair_base_.resize(2 * p.k);
    block* pair = s.pair_base_.data();
    for (size_t x = 0; x < p.k; ++x) {
      pair[2 * x] = s.base_[x];
      pair[2 * x + 1] = r.base_[x];
    }
    s.pair_iteration_ = s.iterations_;
  }
  lpn_encode_pair(p, s.pair_base_.data(), s.out_.data(), r.out_.data(), join, end, threads);
  es = er = end;
}

void SilentCotSender::pair_encoding_with(SilentCotReceiver& r) {
  const FerretParams &a = params_.main, &b = r.params_.main;
  if (a.n != b.n || a.k != b.k || a.t != b.t || a.h != b.h)
    throw std::invalid_argument("silent OT: paired encoding needs the same main parameter set");
  partner_ = &r;
  r.partner_ = this;
}

bool SilentCotSender::paired_now() const {
  return partner_ && partner_->ready_ && partner_->iterations_ == iterations_ && iterations_ > 0;
}

bool SilentCotReceiver::paired_now() const {
  return partner_ && partner_->ready_ && partner_->iterations_ == iterations_ && iterations_ > 0;
}

// ---------------------------------------------------------------- sender

SilentCotSender::SilentCotSender(Channel& ch, block delta, const SilentOtParams& params)
    : ch_(ch), delta_(delta), params_(params) {
  if (!lsb(delta)) throw std::invalid_argument("silent OT: delta must have its lowest bit set");
  params_.validate();
}

SilentCotSender::~SilentCotSender() {
  if (partner_) partner_->partner_ = nullptr;
  wipe(base_);
  wipe(next_base_);
  wipe(pair_base_);
  wipe(out_);
  delta_ = zero_block();
}

void SilentCotSender::setup() {
  ready_ = false;
  const size_t m0 = params_.base_cots();
  {
    BlockVector q0(m0);
    if (params_.malicious) {  // checked IKNP: the receiver's random choices, KOS's check
      CotSender iknp;
      iknp.setup(ch_, delta_);
      iknp.extend_checked(ch_, q0.data(), m0);
    } else {
      SoftSpokenCotSender ss(kSoftSpokenK);
      ss.setup(ch_, delta_);
      ss.extend_random(ch_, q0.data(), m0);
    }
    base_.resize(params_.setup.reserve());
    for (size_t j = 0; j < base_.size(); ++j) base_[j] = and_block(q0[j], kClearLsb);
    wipe(q0);
  }
  {
    PhaseGuard phase(ch_, Phase::BaseOT);
    iterate(params_.setup);
  }
  pos_ = out_size_;  // the setup iteration's other outputs are dropped
  ready_ = true;
}

void SilentCotSender::iterate(const FerretParams& p) {
  const size_t h = (size_t)p.h, leaves = size_t(1) << h, per_tree = 2 * h + 1;
  out_.resize(p.n);
  msg_.resize(p.t * per_tree);
  BlockVector roots(p.t);
  secure_random(roots.data(), p.t * sizeof(block));
  const block* tree_cots = base_.data() + p.k;
  for (size_t i = 0; i < p.t; ++i) {
    block* nd = out_.data() + i * leaves;
    block* msg = msg_.data() + i * per_tree;
    nd[0] = roots[i];
    for (size_t l = 0; l < h; ++l) {
      block s0, s1;
      expand_level(nd, size_t(1) << l, &s0, &s1);
      const block q = tree_cots[i * h + l], tw = tweak(tweak_base_, i, (int)l);
      msg[2 * l] = xor_block(s0, tccr(q, tw));
      msg[2 * l + 1] = xor_block(s1, tccr(xor_block(q, delta_), tw));
    }
    block c = delta_;
    for (size_t x = 0; x < leaves; ++x) {
      nd[x] = and_block(nd[x], kClearLsb);
      c = xor_block(c, nd[x]);
    }
    msg[2 * h] = c;
  }
  wipe(roots);
  if (corrupt_at_ < msg_.size()) {
    msg_[corrupt_at_] = xor_block(msg_[corrupt_at_], make_block(0, 2));
    corrupt_at_ = ~size_t(0);
  }
  ch_.send(msg_.data(), msg_.size() * sizeof(block));
  ch_.flush();
  if (p.check) {  // the receiver's challenge, then our answer
    block challenge[2];  // seed of chi, X'
    ch_.recv(challenge, sizeof challenge);
    const block y = xor_block(basis_sum(base_.data() + p.k + p.t * h), gf128_mul(challenge[1], delta_));
    const block v = xor_block(chi_sum(challenge[0], out_.data(), p.n, {}, nullptr), y);
    const std::array<uint8_t, 32> d = check_digest(v);
    ch_.send(d.data(), d.size());
    ch_.flush();
  }
  const size_t next = params_.main.reserve();
  finish_iteration(p, next, base_, next_base_, out_, &encoded_, params_.threads);
  out_size_ = p.n;
  pos_ = next;
  ++tweak_base_;
}

void SilentCotSender::extend(size_t m, block* q) {
  if (!ready_) throw std::logic_error("silent OT: extend before setup (or after a failed one)");
  size_t done = 0;
  while (done < m) {
    if (pos_ == out_size_) {
      ready_ = false;
      PhaseGuard phase(ch_, Phase::OTExtension);
      base_.swap(next_base_);  // the last iteration's first outputs
      iterate(params_.main);
      ++iterations_;
      ready_ = true;
    }
    const size_t take = std::min(m - done, out_size_ - pos_);
    if (encoded_ < pos_ + take) {
      if (paired_now())
        encode_jointly(*this, *partner_, pos_ + take);
      else
        take_encoded(params_.main, base_, out_, pos_ + take, &encoded_, params_.threads);
    }
    std::memcpy((void*)(q + done), out_.data() + pos_, take * sizeof(block));
    done += take;
    pos_ += take;
  }
}

// ---------------------------------------------------------------- receiver

SilentCotReceiver::SilentCotReceiver(Channel& ch, const SilentOtParams& params) : ch_(ch), params_(params) {
  params_.validate();
}

SilentCotReceiver::~SilentCotReceiver() {
  if (partner_) partner_->partner_ = nullptr;
  wipe(base_);
  wipe(next_base_);
  wipe(out_);
}

void SilentCotReceiver::setup() {
  ready_ = false;
  const size_t m0 = params_.base_cots();
  {
    BlockVector t0(m0);
    std::vector<uint8_t> r(m0 / 8);
    if (params_.malicious) {
      CotReceiver iknp;
      iknp.setup(ch_);
      secure_random(r.data(), r.size());
      iknp.extend_checked(ch_, r.data(), t0.data(), m0);
    } else {
      SoftSpokenCotReceiver ss(kSoftSpokenK);
      ss.setup(ch_);
      ss.extend_random(ch_, r.data(), t0.data(), m0);
    }
    base_.resize(params_.setup.reserve());
    for (size_t j = 0; j < base_.size(); ++j) {
      const uint64_t bit = (r[j >> 3] >> (j & 7)) & 1;
      base_[j] = xor_block(and_block(t0[j], kClearLsb), make_block(0, bit));
    }
    wipe(t0);
    std::fill(r.begin(), r.end(), 0);
  }
  {
    PhaseGuard phase(ch_, Phase::BaseOT);
    iterate(params_.setup);
  }
  pos_ = out_size_;
  ready_ = true;
}

void SilentCotReceiver::iterate(const FerretParams& p) {
  const size_t h = (size_t)p.h, leaves = size_t(1) << h, per_tree = 2 * h + 1;
  out_.resize(p.n);
  msg_.resize(p.t * per_tree);
  ch_.recv(msg_.data(), msg_.size() * sizeof(block));
  const block* tree_cots = base_.data() + p.k;
  std::vector<size_t> alpha;  // the punctured leaf of each tree, as an index into out_
  if (p.check) alpha.reserve(p.t);
  for (size_t i = 0; i < p.t; ++i) {
    block* nd = out_.data() + i * leaves;
    const block* msg = msg_.data() + i * per_tree;
    size_t punct = 0;  // index of the one node not known at the current level
    nd[0] = zero_block();
    for (size_t l = 0; l < h; ++l) {
      block s[2];
      expand_level(nd, size_t(1) << l, &s[0], &s[1]);
      const block t = tree_cots[i * h + l];
      const size_t r = lsb(t) ? 1 : 0;  // the opened side; the path goes the other way
      const block k = xor_block(msg[2 * l + r], tccr(t, tweak(tweak_base_, i, (int)l)));
      // s[r] holds the punctured node's (meaningless) child once: remove it.
      block& known = nd[2 * punct + r];
      known = xor_block(xor_block(k, s[r]), known);
      nd[2 * punct + 1 - r] = zero_block();
      punct = 2 * punct + 1 - r;
    }
    block c = msg[2 * h];
    for (size_t x = 0; x < leaves; ++x) {
      nd[x] = and_block(nd[x], kClearLsb);
      c = xor_block(c, nd[x]);
    }
    nd[punct] = c;  // v_alpha ^ Delta (nd[punct] was zero in the sum)
    if (p.check) alpha.push_back(i * leaves + punct);
  }
  if (p.check) {  // chi drawn after every tree message it constrains
    const block* z = base_.data() + p.k + p.t * h;
    uint64_t xs[2] = {0, 0};  // X*: the check COTs' choice bits
    for (size_t k = 0; k < kCheckCots; ++k) xs[k >> 6] |= (low64(z[k]) & 1) << (k & 63);
    block challenge[2];
    challenge[0] = random_block();
    block chi_alpha;
    block w = chi_sum(challenge[0], out_.data(), p.n, alpha, &chi_alpha);
    challenge[1] = xor_block(chi_alpha, make_block(xs[1], xs[0]));
    ch_.send(challenge, sizeof challenge);
    ch_.flush();
    w = xor_block(w, basis_sum(z));
    std::array<uint8_t, 32> theirs{};
    ch_.recv(theirs.data(), theirs.size());
    if (theirs != check_digest(w))
      throw PeerDeviated("the silent OT sender's trees are inconsistent (Ferret's malicious check)");
  }
  const size_t next = params_.main.reserve();
  finish_iteration(p, next, base_, next_base_, out_, &encoded_, params_.threads);
  out_size_ = p.n;
  pos_ = next;
  ++tweak_base_;
}

void SilentCotReceiver::extend(size_t m, uint8_t* choices, block* t) {
  if (!ready_) throw std::logic_error("silent OT: extend before setup (or after a failed one)");
  if (choices) std::memset(choices, 0, (m + 7) / 8);
  size_t done = 0;
  while (done < m) {
    if (pos_ == out_size_) {
      ready_ = false;
      PhaseGuard phase(ch_, Phase::OTExtension);
      base_.swap(next_base_);  // the last iteration's first outputs
      iterate(params_.main);
      ++iterations_;
      ready_ = true;
    }
    const size_t take = std::min(m - done, out_size_ - pos_);
    if (encoded_ < pos_ + take) {
      if (paired_now())
        encode_jointly(*partner_, *this, pos_ + take);
      else
        take_encoded(params_.main, base_, out_, pos_ + take, &encoded_, params_.threads);
    }
    const block* src = out_.data() + pos_;
    std::memcpy((void*)(t + done), src, take * sizeof(block));
    if (choices)
      for (size_t j = 0; j < take; ++j)
        choices[(done + j) >> 3] |= (uint8_t)((low64(src[j]) & 1) << ((done + j) & 7));
    done += take;
    pos_ += take;
  }
}

}  // namespace gc
