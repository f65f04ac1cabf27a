// GMW backend (see gmw.h for the protocol and its message order).
#include "garbled_core/gmw.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <thread>
#include <utility>

#include "garbled_core/aes.h"
#include "garbled_core/gmw_plan.h"
#include "garbled_core/prg.h"
#include "garbled_core/random.h"
#include "garbled_core/sha256.h"
#include "garbled_core/vaes.h"

namespace gc {

namespace {

constexpr uint32_t kGmwVersion = 2;  // 2: AND gates grouped by a shared input
constexpr char kHello0[8] = {'S', 'P', 'G', 'C', 'G', 'M', 'W', '0'};
constexpr char kHello1[8] = {'S', 'P', 'G', 'C', 'G', 'M', 'W', '1'};
constexpr char kEndTag[4] = {'G', 'M', 'W', 'E'};
// ROTs per SoftSpoken extend call (bounds the COT buffer: 1 MiB of blocks).
constexpr size_t kRotBatch = size_t(1) << 16;
// Triples per generation step: a step's receiver half is sent one step ahead of
// its sender half, so the link stays busy whatever its latency.
constexpr size_t kTripleBatch = size_t(1) << 16;

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

uint32_t fnv1a(const char* s) {
  uint32_t h = 2166136261u;
  for (; *s; ++s) h = (h ^ (uint8_t)*s) * 16777619u;
  return h;
}

// Key of the hash for group `group` (8 consecutive ROTs) of the direction whose
// sender is party `sender`. The high word names the domain and the direction.
inline AesKey rot_key(block salt, int sender, uint64_t group) {
  const uint64_t hi = 0x474d57524f540000ull | (uint64_t)(sender & 1);  // "GMWROT", direction
  return aes_key(xor_block(salt, make_block(hi, group)));
}

// Receiver side of mb ROTs (mb a multiple of 8) from COT labels t: the chosen
// string j is H(t_j) = AES_key(t_j) ^ t_j. `index` is the direction's ROT
// counter before this batch.
void hash_received_aesni(block salt, int sender, uint64_t index, const block* t, size_t mb, block* dst) {
  for (size_t j = 0; j < mb; j += 8) {
    const AesKey key = rot_key(salt, sender, (index + j) / 8);
    block x[8];
    for (int i = 0; i < 8; ++i) x[i] = t[j + i];
    aes_encrypt_blocks<8>(key, x);
    for (int i = 0; i < 8; ++i) dst[j + i] = xor_block(x[i], t[j + i]);
  }
}

// Sender side: s0 = H(q_j), s1 = H(q_j ^ Delta), same keys as the receiver's.
void hash_sent_aesni(block salt, int sender, uint64_t index, block delta, const block* q, size_t mb,
                     block* s0, block* s1) {
  for (size_t j = 0; j < mb; j += 8) {
    const AesKey key = rot_key(salt, sender, (index + j) / 8);
    block x[16], in[16];
    for (int i = 0; i < 8; ++i) {
      in[i] = q[j + i];
      in[8 + i] = xor_block(q[j + i], delta);
    }
    std::memcpy(x, in, sizeof(x));
    aes_encrypt_blocks<16>(key, x);
    for (int i = 0; i < 8; ++i) {
      s0[j + i] = xor_block(x[i], in[i]);
      s1[j + i] = xor_block(x[8 + i], in[8 + i]);
    }
  }
}

#if GC_X86
// The same hashes with VAES + AVX-512 (the same keys and bits): four groups of 8 ROTs a step,
// their four keys expanded at once (one per 128-bit lane; the AES-NI key schedule is a chain
// of dependent steps that costs about what the group's encryptions do), each group's round
// keys broadcast from there. mb must be a multiple of 32 (the ROT batches are of 128).
// Round keys of four consecutive groups: rk[r] holds group (g0 + L)'s round r in lane L.
GC_VAES_TARGET inline void rot_keys4(block salt, int sender, uint64_t g0, __m512i* rk) {
  const uint64_t hi = 0x474d57524f540000ull | (uint64_t)(sender & 1);  // as rot_key
  alignas(64) block keys[4];
  for (int L = 0; L < 4; ++L) keys[L] = xor_block(salt, make_block(hi, g0 + (uint64_t)L));
  zexpand4(_mm512_load_si512(keys), rk);
}

// Round r of each of the four groups' keys, broadcast to all lanes: k[L] is group L's.
GC_VAES_TARGET inline void group_round_keys(const __m512i* rk_r, __m512i* k) {
  k[0] = zlane_load<0>(rk_r);
  k[1] = zlane_load<1>(rk_r);
  k[2] = zlane_load<2>(rk_r);
  k[3] = zlane_load<3>(rk_r);
}

// 4 * Per zmm of blocks, group L's (x[L * Per .. (L + 1) * Per)) under group L's key.
template <int Per>
GC_VAES_TARGET inline void aes4_groups(const __m512i* rk, __m512i* x) {
  __m512i k[4];
  group_round_keys(rk, k);
  for (int L = 0; L < 4; ++L)
    for (int i = 0; i < Per; ++i) x[L * Per + i] = _mm512_xor_si512(x[L * Per + i], k[L]);
  for (int r = 1; r < 10; ++r) {
    group_round_keys(rk + r, k);
    for (int L = 0; L < 4; ++L)
      for (int i = 0; i < Per; ++i) x[L * Per + i] = _mm512_aesenc_epi128(x[L * Per + i], k[L]);
  }
  group_round_keys(rk + 10, k);
  for (int L = 0; L < 4; ++L)
    for (int i = 0; i < Per; ++i) x[L * Per + i] = _mm512_aesenclast_epi128(x[L * Per + i], k[L]);
}

GC_VAES_TARGET void hash_received_vaes(block salt, int sender, uint64_t index, const block* t, size_t mb,
                                       block* dst) {
  alignas(64) __m512i rk[11];
  for (size_t j = 0; j < mb; j += 32) {
    rot_keys4(salt, sender, (index + j) / 8, rk);
    __m512i in[8], x[8];
    for (int i = 0; i < 8; ++i) x[i] = in[i] = _mm512_loadu_si512(t + j + 4 * i);
    aes4_groups<2>(rk, x);
    for (int i = 0; i < 8; ++i) _mm512_storeu_si512(dst + j + 4 * i, _mm512_xor_si512(x[i], in[i]));
  }
}

GC_VAES_TARGET void hash_sent_vaes(block salt, int sender, uint64_t index, block delta, const block* q, size_t mb,
                                   block* s0, block* s1) {
  alignas(64) __m512i rk[11];
  const __m512i d = _mm512_maskz_broadcast_i32x4(0xffff, delta);  // maskz: see vaes.h
  for (size_t j = 0; j < mb; j += 32) {
    rot_keys4(salt, sender, (index + j) / 8, rk);
    __m512i in[16], x[16];  // group L: its q in 4L, 4L + 1, its q ^ Delta in 4L + 2, 4L + 3
    for (int L = 0; L < 4; ++L)
      for (int i = 0; i < 2; ++i) {
        in[4 * L + i] = _mm512_loadu_si512(q + j + 8 * L + 4 * i);
        in[4 * L + 2 + i] = _mm512_xor_si512(in[4 * L + i], d);
      }
    for (int i = 0; i < 16; ++i) x[i] = in[i];
    aes4_groups<4>(rk, x);
    for (int L = 0; L < 4; ++L)
      for (int i = 0; i < 2; ++i) {
        _mm512_storeu_si512(s0 + j + 8 * L + 4 * i, _mm512_xor_si512(x[4 * L + i], in[4 * L + i]));
        _mm512_storeu_si512(s1 + j + 8 * L + 4 * i, _mm512_xor_si512(x[4 * L + 2 + i], in[4 * L + 2 + i]));
      }
  }
}
#endif

const bool kRotHashVaes = [] {
#if GC_X86
  return cpu_has_vaes();
#else
  return false;
#endif
}();

void hash_received(block salt, int sender, uint64_t index, const block* t, size_t mb, block* dst) {
#if GC_X86
  if (kRotHashVaes && mb % 32 == 0) return hash_received_vaes(salt, sender, index, t, mb, dst);
#endif
  hash_received_aesni(salt, sender, index, t, mb, dst);
}

void hash_sent(block salt, int sender, uint64_t index, block delta, const block* q, size_t mb, block* s0,
               block* s1) {
#if GC_X86
  if (kRotHashVaes && mb % 32 == 0) return hash_sent_vaes(salt, sender, index, delta, q, mb, s0, s1);
#endif
  hash_sent_aesni(salt, sender, index, delta, q, mb, s0, s1);
}

// cnt (<= 64) bits of a packed stream from bit `first` on, in the low bits of the result.
inline uint64_t read_bits(const uint64_t* stream, size_t first, size_t cnt) {
  const size_t q = first >> 6;
  const unsigned s = (unsigned)(first & 63);
  uint64_t v = stream[q] >> s;
  if (s && s + cnt > 64) v |= stream[q + 1] << (64 - s);
  return cnt == 64 ? v : v & ((uint64_t(1) << cnt) - 1);
}

// Transposes cnt (<= 64) strings into bit-sliced rows: bit p of s[j] goes to bit off + j of
// rows[p * stride] for p < width (off + cnt <= 64). The strings are read as two 64-bit halves.
void scatter_bits_scalar(const block* s, size_t cnt, uint32_t width, unsigned off, uint64_t* rows, size_t stride) {
  uint64_t half[2][64];
  for (size_t j = 0; j < cnt; ++j) {
    half[0][j] = low64(s[j]);
    half[1][j] = high64(s[j]);
  }
  for (uint32_t p = 0; p < width; ++p) {
    const uint64_t* h = half[p >> 6];
    const unsigned bit = p & 63;
    uint64_t word = 0;
    for (size_t j = 0; j < cnt; ++j) word |= ((h[j] >> bit) & 1) << j;
    rows[(size_t)p * stride] |= word << off;
  }
}

#if GC_X86
// The same transpose with AVX-512: the strings' low and high halves gathered eight to a
// vector, then one bit-test mask per vector gives 8 of a row's 64 bits (the scalar loop takes
// one bit at a time; the triples' transposes were about 7% of a gmw round's CPU).
GC_VAES_TARGET void scatter_bits_avx512(const block* s, size_t cnt, uint32_t width, unsigned off, uint64_t* rows,
                                        size_t stride) {
  alignas(64) block pad[64];
  const block* src = s;
  if (cnt < 64) {  // short runs (group and batch edges): zero strings give zero bits
    std::memcpy((void*)pad, s, cnt * sizeof(block));
    std::memset((void*)(pad + cnt), 0, (64 - cnt) * sizeof(block));
    src = pad;
  }
  const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
  const __m512i odd = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
  __m512i half[2][8];  // half[h][q] lane i: half h of string 8q + i
  for (int q = 0; q < 8; ++q) {
    const __m512i a = _mm512_loadu_si512(src + 8 * q), b = _mm512_loadu_si512(src + 8 * q + 4);
    half[0][q] = _mm512_permutex2var_epi64(a, even, b);
    half[1][q] = width > 64 ? _mm512_permutex2var_epi64(a, odd, b) : _mm512_setzero_si512();
  }
  for (uint32_t p = 0; p < width; ++p) {
    const __m512i* h = half[p >> 6];
    const __m512i bit = _mm512_set1_epi64((long long)(uint64_t(1) << (p & 63)));
    uint64_t word = 0;
    for (int q = 0; q < 8; ++q) word |= (uint64_t)_mm512_test_epi64_mask(h[q], bit) << (8 * q);
    rows[(size_t)p * stride] |= word << off;
  }
}
#endif

const bool kScatterAvx512 = [] {
#if GC_X86
  return cpu_has_vaes();  // AVX-512 F, BW, DQ (and VAES, unused here)
#else
  return false;
#endif
}();

void scatter_bits(const block* s, size_t cnt, uint32_t width, unsigned off, uint64_t* rows, size_t stride) {
#if GC_X86
  if (kScatterAvx512) return scatter_bits_avx512(s, cnt, width, off, rows, stride);
#endif
  scatter_bits_scalar(s, cnt, width, off, rows, stride);
}

// Words of a row below which a layer is not split over threads (a thread's start costs about
// what a few thousand words of gates do).
constexpr size_t kMinWordsPerThread = 256;

// f(w0, w1) over [0, words) in up to `threads` contiguous ranges, one per thread (the caller's
// included). The ranges are disjoint and f only touches its own words of every row, so the
// result is the same bits for any thread count; nothing random is drawn.
template <typename F>
void for_word_ranges(size_t words, size_t threads, const F& f) {
  const size_t parts = std::max<size_t>(1, std::min(threads, words / kMinWordsPerThread));
  if (parts == 1) {
    if (words) f(0, words);
    return;
  }
  const size_t slice = (words + parts - 1) / parts;
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(parts);
  for (size_t t = 1; t < parts; ++t)
    workers.emplace_back([&, t] {
      try {
        f(t * slice, std::min(words, (t + 1) * slice));
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  f(0, slice);
  for (auto& w : workers) w.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

// ------------------------------------------------------------ random OT

SoftSpokenRandomOt::SoftSpokenRandomOt(int k) : sender_(k), receiver_(k) {}

void SoftSpokenRandomOt::setup(Channel& ch, int party, block salt) {
  party_ = party;
  salt_ = salt;
  delta_ = random_delta();
  // Direction 0 (party 0 sends ROTs) first, then direction 1.
  if (party == 0) {
    sender_.setup(ch, delta_);
    receiver_.setup(ch);
  } else {
    receiver_.setup(ch);
    sender_.setup(ch, delta_);
  }
  ch.flush();
}

double SoftSpokenRandomOt::bytes_per_rot() const {
  return (double)receiver_.params().extend_bytes(128, true) / 128.0;
}

void SoftSpokenRandomOt::receive(Channel& ch, uint64_t* choice, block* chosen, size_t m) {
  if (m % 128) throw std::invalid_argument("random OT: m must be a multiple of 128");
  buf_.resize(std::min(m, kRotBatch));
  for (size_t done = 0; done < m;) {
    const size_t mb = std::min(kRotBatch, m - done);
    receiver_.extend_random(ch, reinterpret_cast<uint8_t*>(choice + done / 64), buf_.data(), mb);
    hash_received(salt_, 1 - party_, received_, buf_.data(), mb, chosen + done);
    received_ += mb;
    done += mb;
  }
}

void SoftSpokenRandomOt::send(Channel& ch, block* s0, block* s1, size_t m) {
  if (m % 128) throw std::invalid_argument("random OT: m must be a multiple of 128");
  buf_.resize(std::min(m, kRotBatch));
  for (size_t done = 0; done < m;) {
    const size_t mb = std::min(kRotBatch, m - done);
    sender_.extend_random(ch, buf_.data(), mb);
    hash_sent(salt_, party_, sent_, delta_, buf_.data(), mb, s0 + done, s1 + done);
    sent_ += mb;
    done += mb;
  }
}

SilentRandomOt::SilentRandomOt(const SilentOtParams& params) : params_(params) { params_.validate(); }

SilentRandomOt::~SilentRandomOt() = default;

void SilentRandomOt::setup(Channel& ch, int party, block salt) {
  party_ = party;
  salt_ = salt;
  delta_ = random_delta();
  sender_ = std::make_unique<SilentCotSender>(ch, delta_, params_);
  receiver_ = std::make_unique<SilentCotReceiver>(ch, params_);
  sender_->pair_encoding_with(*receiver_);  // both directions share the LPN's random reads
  // Direction 0 (party 0 sends ROTs) first, then direction 1.
  if (party == 0) {
    sender_->setup();
    receiver_->setup();
  } else {
    receiver_->setup();
    sender_->setup();
  }
  ch.flush();
}

void SilentRandomOt::receive(Channel& ch, uint64_t* choice, block* chosen, size_t m) {
  if (m % 128) throw std::invalid_argument("random OT: m must be a multiple of 128");
  buf_.resize(std::min(m, kRotBatch));
  for (size_t done = 0; done < m;) {
    const size_t mb = std::min(kRotBatch, m - done);
    receiver_->extend(mb, reinterpret_cast<uint8_t*>(choice + done / 64), buf_.data());
    hash_received(salt_, 1 - party_, received_, buf_.data(), mb, chosen + done);
    received_ += mb;
    done += mb;
  }
  (void)ch;  // the COT objects hold the channel
}

void SilentRandomOt::send(Channel& ch, block* s0, block* s1, size_t m) {
  if (m % 128) throw std::invalid_argument("random OT: m must be a multiple of 128");
  buf_.resize(std::min(m, kRotBatch));
  for (size_t done = 0; done < m;) {
    const size_t mb = std::min(kRotBatch, m - done);
    sender_->extend(mb, buf_.data());
    hash_sent(salt_, party_, sent_, delta_, buf_.data(), mb, s0 + done, s1 + done);
    sent_ += mb;
    done += mb;
  }
  ch.flush();  // the trees of any iteration just run
}

// -------------------------------------------------------------- triples

void generate_triples(RandomOtSource& ot, Channel& ch, const std::vector<uint32_t>& widths, size_t n,
                      GroupTriples& out) {
  size_t members = 0;
  for (uint32_t w : widths) {
    if (w < 1 || w > kMaxGroupWidth)
      throw std::invalid_argument("triples: a group's width must be in 1.." + std::to_string(kMaxGroupWidth));
    members += w;
  }
  const size_t groups = widths.size(), real = groups * n, m = round_up(real, 128);
  out.n = n;
  out.words = (n + 63) / 64;
  out.a.assign(groups * out.words, 0);
  out.b.assign(members * out.words, 0);
  out.c.assign(members * out.words, 0);
  out.rots = m;
  if (!m) return;
  std::vector<size_t> first_member(groups);
  for (size_t g = 0, acc = 0; g < groups; ++g) {
    first_member[g] = acc;
    acc += widths[g];
  }
  // ROT r = g * n + i serves group g's instance i (one each way). A step's speaking half runs
  // one step ahead of its listening half, so the link stays busy whatever its latency.
  const size_t step = std::min(m, kTripleBatch), steps = (m + step - 1) / step;
  const bool receiver_first = ot.receiver_speaks();
  struct Half {
    std::vector<uint64_t> choice;
    BlockVector x, y;  // receiver: chosen strings in x; sender: s0 in x, s1 in y
  };
  auto sized = [&](bool receiver) {
    Half h;
    h.x.resize(step);
    if (receiver) h.choice.assign(step / 64 + 1, 0); else h.y.resize(step);
    return h;
  };
  Half spoken[2] = {sized(receiver_first), sized(receiver_first)}, heard = sized(!receiver_first);
  auto size_of = [&](size_t i) { return std::min(step, m - i * step); };
  auto speak = [&](size_t i) {
    Half& h = spoken[i & 1];
    if (receiver_first)
      ot.receive(ch, h.choice.data(), h.x.data(), size_of(i));
    else
      ot.send(ch, h.x.data(), h.y.data(), size_of(i));
  };
  block bs[64], cs[64];
  speak(0);
  for (size_t i = 0; i < steps; ++i) {
    if (i + 1 < steps) speak(i + 1);
    if (receiver_first)
      ot.send(ch, heard.x.data(), heard.y.data(), size_of(i));
    else
      ot.receive(ch, heard.choice.data(), heard.x.data(), size_of(i));
    const Half& rx = receiver_first ? spoken[i & 1] : heard;
    const Half& tx = receiver_first ? heard : spoken[i & 1];
    // This party's a = its choices u, b = s0 ^ s1 of its sender strings, c = u b ^ s0 ^ s_u'.
    const size_t r0 = i * step, r1 = std::min(r0 + size_of(i), real);
    for (size_t r = r0; r < r1;) {
      const size_t g = r / n, inst = r % n, word = inst >> 6;
      const unsigned off = (unsigned)(inst & 63);
      const size_t cnt = std::min({r1 - r, n - inst, (size_t)(64 - off)});
      const uint64_t u = read_bits(rx.choice.data(), r - r0, cnt);
      for (size_t j = 0; j < cnt; ++j) {
        const block s0 = tx.x[r - r0 + j], bj = xor_block(s0, tx.y[r - r0 + j]);
        bs[j] = bj;
        cs[j] = xor_block(xor_block(and_block(bj, select_mask((u >> j) & 1)), s0), rx.x[r - r0 + j]);
      }
      out.a[g * out.words + word] |= u << off;
      const size_t row = first_member[g] * out.words + word;
      scatter_bits(bs, cnt, widths[g], off, out.b.data() + row, out.words);
      scatter_bits(cs, cnt, widths[g], off, out.c.data() + row, out.words);
      r += cnt;
    }
  }
}

// ------------------------------------------------------------ GMW party

GmwParty::GmwParty(Channel& ch, int party, GmwOptions options)
    : Session(ch, SessionOptions{kDefaultChunk, 1, Scheme::ThreeHalves, options.ot_k}),
      party_(party) {
  if (party != 0 && party != 1) throw std::invalid_argument("GMW party must be 0 (H1) or 1 (H2)");
  if (options.ot_k < 1 || options.ot_k > kMaxOtK)
    throw std::invalid_argument("GMW ot_k must be in 1..8 (SoftSpoken k)");
  ot_ = std::make_unique<SoftSpokenRandomOt>(options.ot_k);
}

GmwParty::GmwParty(Channel& ch, int party, std::unique_ptr<RandomOtSource> ot)
    : Session(ch, SessionOptions{kDefaultChunk, 1, Scheme::ThreeHalves, 0}), party_(party),
      ot_(std::move(ot)) {
  if (party != 0 && party != 1) throw std::invalid_argument("GMW party must be 0 (H1) or 1 (H2)");
  if (!ot_) throw std::invalid_argument("GMW needs a random OT source");
}

void GmwParty::set_threads(size_t threads) {
  if (threads < 1 || threads > kMaxGmwThreads)
    throw std::invalid_argument("GMW threads must be in 1.." + std::to_string(kMaxGmwThreads));
  threads_ = threads;
}

void GmwParty::exchange_gmw_hello() {
  ch_.set_phase(Phase::Setup);
  // 20 bytes, like the garbled-circuit hello, so a party of the other backend
  // reads a whole hello and fails cleanly instead of waiting.
  struct Hello {
    char magic[8];
    uint32_t version, ot_k, source;
  } mine{}, theirs{};
  std::memcpy(mine.magic, party_ == 0 ? kHello0 : kHello1, 8);
  mine.version = kGmwVersion;
  mine.ot_k = (uint32_t)options_.ot_k;
  mine.source = fnv1a(ot_->name());
  static_assert(sizeof(Hello) == 20, "hello layout");
  ch_.send(&mine, sizeof(mine));
  ch_.recv(&theirs, sizeof(theirs));
  if (std::memcmp(theirs.magic, mine.magic, 8) == 0)
    throw ProtocolError(std::string("both parties are GMW party ") + (party_ == 0 ? "0 (H1)" : "1 (H2)") +
                        ": one side must run as the " + (party_ == 0 ? "evaluator" : "garbler"));
  if (std::memcmp(theirs.magic, "SPGCGC-", 7) == 0)
    throw ProtocolError("backend mismatch: this party runs GMW, the peer the garbled-circuit backend "
                        "(both servers must use the same backend)");
  if (std::memcmp(theirs.magic, party_ == 0 ? kHello1 : kHello0, 8) != 0)
    throw ProtocolError("the peer is not an SPGC GMW party");
  if (theirs.version != kGmwVersion)
    throw ProtocolError("GMW protocol version mismatch: " + std::to_string(kGmwVersion) + " here, " +
                        std::to_string(theirs.version) + " at the peer");
  if (theirs.source != mine.source || theirs.ot_k != mine.ot_k)
    throw ProtocolError("random OT mismatch: " + std::string(ot_->name()) + " with ot_k " +
                        std::to_string(mine.ot_k) + " here, ot_k " + std::to_string(theirs.ot_k) +
                        " at the peer (both servers must set the same ot_k)");
}

void GmwParty::setup() {
  if (ready_) return;
  exchange_gmw_hello();
  // Party 0 draws the session id, the hash salt and the input-mask seed.
  block input_seed;
  if (party_ == 0) {
    secure_random(&session_id_, sizeof(session_id_));
    salt_ = random_block();
    input_seed = random_block();
    ch_.send(&session_id_, 8);
    ch_.send(&salt_, 16);
    ch_.send(&input_seed, 16);
    ch_.flush();
  } else {
    ch_.recv(&session_id_, 8);
    ch_.recv(&salt_, 16);
    ch_.recv(&input_seed, 16);
  }
  garbler_input_prg_ = std::make_unique<Prg>(input_seed);
  ot_->setup(ch_, party_, salt_);
  ch_.flush();
  ready_ = true;
}

void GmwParty::send_gmw_header(const Circuit& c, const RunInputs& in) {
  ch_.set_phase(Phase::Setup);
  static_assert(sizeof(Header) == 88, "header layout");
  Header& mine = sent_header_;
  mine = Header{};
  std::memcpy(mine.magic, "GMWH", 4);
  mine.party = (uint32_t)party_;
  mine.run_id = run_id_;
  mine.and_layers = 0;
  mine.n = in.n;
  const std::array<uint8_t, 32> stated = stated_circuit(c);
  std::memcpy(mine.circuit, stated.data(), 32);
  auto cd = carried_digest(c, in);
  std::memcpy(mine.carried, cd.data(), 32);
  ch_.send(&mine, sizeof(mine));
}

void GmwParty::check_gmw_header(const Circuit& c) {
  const Phase was = ch_.phase();
  ch_.set_phase(Phase::Setup);
  const Header& mine = sent_header_;
  Header theirs{};
  ch_.recv(&theirs, sizeof(theirs));
  ch_.set_phase(was);
  if (std::memcmp(theirs.magic, "GMWH", 4) != 0)
    throw ProtocolError("the peer's run header is not a GMW header (out of step or another backend)");
  if (theirs.party == mine.party)
    throw ProtocolError("both parties run as GMW party " + std::to_string(party_));
  check_run_facts(c, {mine.run_id, mine.n, mine.circuit, mine.carried},
                  {theirs.run_id, theirs.n, theirs.circuit, theirs.carried});
}

RunOutputs GmwParty::run(const Circuit& c, const RunInputs& in) {
  if (broken_)
    throw ProtocolError("this GMW party's link is out of step after a failed run; start a new session");
  // A Kept of another backend or session is refused before anything is sent.
  for (size_t p = 0; p < c.inputs().size() && p < in.carried.size(); ++p) {
    if (c.inputs()[p].owner != InputOwner::Carried || !in.carried[p].source) continue;
    const KeptLabels& k = *in.carried[p].source;
    const size_t need = ((size_t)k.width * ((k.n + 63) / 64) + 1) / 2;
    if (!ready_ || k.session_id != session_id_ || k.labels.size() != need)
      throw std::invalid_argument("run: carried input '" + c.inputs()[p].name +
                                  "' was not kept by this GMW party (a garbled-circuit Kept, or "
                                  "another session's, cannot feed a GMW run)");
  }
  check_inputs(c, in, party_ == 0 ? InputOwner::Garbler : InputOwner::Evaluator);
  setup();
  try {
    return run_checked(c, in);
  } catch (...) {
    broken_ = true;
    throw;
  }
}

RunOutputs GmwParty::run_checked(const Circuit& c, const RunInputs& in) {
  const GmwPlan plan = plan_circuit(c);
  const size_t n = in.n, W = (n + 63) / 64, row_bytes = (n + 7) / 8;
  const uint64_t tail = (n & 63) ? (uint64_t(1) << (n & 63)) - 1 : ~uint64_t(0);
  layers_ = plan.layers;

  // The header goes first in this party's stream, and the peer's is the first thing read.
  // When the triples read nothing from the link, that read waits for the first layer's (or
  // the outputs') exchange: the openings sent before it are one-time pads of fresh triples
  // (dropped if the check fails), so a mismatched peer learns nothing from them.
  send_gmw_header(c, in);
  bool header_checked = false;
  auto check_header_once = [&]() {
    if (!header_checked) check_gmw_header(c);
    header_checked = true;
  };
  if (!ot_->reads_nothing_for(round_up(plan.groups.size() * n, 128))) check_header_once();

  // Triples: one group triple per AND group and instance (a per group, b and c per gate),
  // fresh for this run, each used once below and dropped at the end.
  GroupTriples triples;
  ch_.set_phase(Phase::OTExtension);
  generate_triples(*ot_, ch_, plan.widths, n, triples);
  groups_ = plan.groups.size();
  triples_used_ += (uint64_t)c.and_count() * n;
  ots_used_ += triples.rots;
  layers_used_ += plan.layers;

  // Inputs: no bytes. Shared masks r from the common stream, the owner adds its bits.
  ch_.set_phase(Phase::Inputs);
  std::vector<uint64_t> wires((size_t)plan.slots * W + 1, 0);
  auto row = [&](uint32_t slot) { return wires.data() + (size_t)slot * W; };
  const InputOwner self = party_ == 0 ? InputOwner::Garbler : InputOwner::Evaluator;
  BlockVector masks((W + 1) / 2);
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    const InputPort& port = c.inputs()[p];
    if (port.owner == InputOwner::Carried) {
      const CarriedInput& src = in.carried[p];
      const KeptLabels& kept = *src.source;
      const size_t ws = (kept.n + 63) / 64;
      const uint64_t* words = reinterpret_cast<const uint64_t*>(kept.labels.data());
      for (int bit = 0; bit < port.width; ++bit) {
        uint64_t* dst = row(plan.input_slots[p][bit]);
        const uint64_t* from = words + (size_t)bit * ws;
        if (src.indices.empty()) {
          if (W) std::memcpy(dst, from, W * sizeof(uint64_t));
        } else {
          std::memset(dst, 0, W * sizeof(uint64_t));
          for (size_t i = 0; i < n; ++i) {
            const uint64_t j = src.indices[i];
            dst[i >> 6] |= ((from[j >> 6] >> (j & 63)) & 1) << (i & 63);
          }
        }
      }
      continue;
    }
    for (int bit = 0; bit < port.width; ++bit) {
      uint64_t* dst = row(plan.input_slots[p][bit]);
      garbler_input_prg_->fill(masks.data(), masks.size());
      if (W) std::memcpy(dst, masks.data(), W * sizeof(uint64_t));
      if (W) dst[W - 1] &= tail;
      if (port.owner == self) {
        const uint64_t* v = in.values[p];
        for (size_t i = 0; i < n; ++i) dst[i >> 6] ^= ((v[i] >> bit) & 1) << (i & 63);
      }
    }
  }

  // Gates, stage by stage; one exchange per AND layer.
  ch_.set_phase(Phase::Tables);
  Sha256 transcript;
  std::vector<uint64_t> mine(plan.max_layer * W + 1), pd(W + 1);
  std::vector<uint8_t> out_msg(plan.max_layer * row_bytes), in_msg(out_msg.size());
  auto a_row = [&](size_t g) { return triples.a.data() + g * W; };
  auto b_row = [&](size_t m) { return triples.b.data() + m * W; };
  auto c_row = [&](size_t m) { return triples.c.data() + m * W; };
  for (const GmwPlan::Stage& st : plan.stages) {
    for (size_t k = st.local_begin; k < st.local_end; ++k) {
      const GmwPlan::Op& op = plan.ops[k];
      const uint64_t* a = row(op.a);
      uint64_t* out = row(op.out);
      if (op.op == GateOp::Xor) {
        const uint64_t* b = row(op.b);
        for (size_t w = 0; w < W; ++w) out[w] = a[w] ^ b[w];
      } else if (party_ == 0) {  // NOT: party 0 flips its share
        for (size_t w = 0; w < W; ++w) out[w] = ~a[w];
      } else if (out != a) {
        std::memcpy(out, a, W * sizeof(uint64_t));
      }
    }
    if (st.and_end == st.and_begin || !n) continue;
    // This party's shares of d = key ^ a (once per group) and e = y ^ b (per gate), group by
    // group: [d, e_1 .. e_w], padding bits cleared. Rows are split by words over the threads.
    std::vector<std::pair<const uint64_t*, const uint64_t*>> sources;  // (value, triple mask)
    for (size_t g = st.group_begin; g < st.group_end; ++g) {
      const GmwPlan::Group& grp = plan.groups[g];
      sources.push_back({row(grp.key), a_row(g)});
      for (size_t k = grp.first; k < grp.last; ++k)
        sources.push_back({row(plan.ops[k].b), b_row(st.member_base + (k - st.and_begin))});
    }
    const size_t rows = sources.size();
    for_word_ranges(W, threads_, [&](size_t w0, size_t w1) {
      const size_t b0 = 8 * w0, b1 = std::min(8 * w1, row_bytes);
      for (size_t r = 0; r < rows; ++r) {
        uint64_t* dst = mine.data() + r * W;
        const uint64_t *v = sources[r].first, *mask = sources[r].second;
        for (size_t w = w0; w < w1; ++w) dst[w] = v[w] ^ mask[w];
        if (w1 == W) dst[W - 1] &= tail;
        if (b0 < b1) std::memcpy(out_msg.data() + r * row_bytes + b0, reinterpret_cast<uint8_t*>(dst) + b0, b1 - b0);
      }
    });
    const size_t msg = rows * row_bytes;
    ch_.send(out_msg.data(), msg);
    check_header_once();           // flushes ours first (the first layer: with the header)
    ch_.recv(in_msg.data(), msg);
    transcript.update(in_msg.data(), msg);
    const uint64_t own = party_ == 0 ? ~uint64_t(0) : 0;
    for_word_ranges(W, threads_, [&](size_t w0, size_t w1) {
      const size_t b0 = 8 * w0, b1 = std::min(8 * w1, row_bytes), span = w1 - w0;
      std::vector<uint64_t> peer_d(span), peer_e(span);  // the peer's shares, this word range
      auto peer = [&](size_t r, std::vector<uint64_t>& dst) {
        dst[span - 1] = 0;
        if (b0 < b1) std::memcpy(dst.data(), in_msg.data() + r * row_bytes + b0, b1 - b0);
      };
      size_t r = 0;
      for (size_t g = st.group_begin; g < st.group_end; ++g) {
        const GmwPlan::Group& grp = plan.groups[g];
        const uint64_t* ta = a_row(g) + w0;
        const uint64_t* d = mine.data() + r * W + w0;
        peer(r++, peer_d);
        for (size_t w = 0; w < span; ++w) peer_d[w] ^= d[w];  // the opened key ^ a
        for (size_t k = grp.first; k < grp.last; ++k) {
          const size_t mem = st.member_base + (k - st.and_begin);
          const uint64_t *tb = b_row(mem) + w0, *tc = c_row(mem) + w0, *e = mine.data() + r * W + w0;
          peer(r++, peer_e);
          uint64_t* z = row(plan.ops[k].out) + w0;
          for (size_t w = 0; w < span; ++w) {
            const uint64_t dd = peer_d[w], ee = e[w] ^ peer_e[w];
            z[w] = tc[w] ^ (dd & tb[w]) ^ (ee & ta[w]) ^ (dd & ee & own);
          }
        }
      }
    });
  }
  transcript_ = transcript.digest();
  triples = GroupTriples();  // used up: dropped, never reused

  // Outputs: one message each way (shares of what the peer learns, end tag).
  ch_.set_phase(Phase::Outputs);
  RunOutputs out;
  out.values.resize(c.outputs().size());
  out.kept.resize(c.outputs().size());
  const Reveal mine_only = party_ == 0 ? Reveal::Garbler : Reveal::Evaluator;
  const Reveal peer_only = party_ == 0 ? Reveal::Evaluator : Reveal::Garbler;
  std::vector<uint8_t> send_buf, recv_buf;
  size_t recv_rows = 0;
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const Reveal r = c.outputs()[o].reveal;
    if (r == Reveal::Both || r == peer_only)
      for (uint32_t slot : plan.output_slots[o]) {
        uint64_t* src = row(slot);
        if (W) src[W - 1] &= tail;
        send_buf.insert(send_buf.end(), reinterpret_cast<uint8_t*>(src),
                        reinterpret_cast<uint8_t*>(src) + row_bytes);
      }
    if (r == Reveal::Both || r == mine_only) recv_rows += plan.output_slots[o].size();
  }
  uint8_t tag[8];
  std::memcpy(tag, kEndTag, 4);
  std::memcpy(tag + 4, &run_id_, 4);
  send_buf.insert(send_buf.end(), tag, tag + 8);
  recv_buf.resize(recv_rows * row_bytes + 8);
  ch_.send(send_buf.data(), send_buf.size());
  check_header_once();  // a run without AND layers
  ch_.recv(recv_buf.data(), recv_buf.size());
  ch_.flush();
  if (std::memcmp(recv_buf.data() + recv_rows * row_bytes, tag, 8) != 0)
    throw ProtocolError("GMW run " + std::to_string(run_id_) +
                        ": the peer's end-of-run tag is wrong (the parties are out of step)");
  size_t recv_row = 0;
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const OutputPort& port = c.outputs()[o];
    const Reveal r = port.reveal;
    if (r == Reveal::Keep) {
      auto kept = new_kept(port, n, (port.wires.size() * W + 1) / 2);
      uint64_t* words = reinterpret_cast<uint64_t*>(kept->labels.data());
      for (size_t bit = 0; bit < plan.output_slots[o].size(); ++bit)
        if (W) std::memcpy(words + bit * W, row(plan.output_slots[o][bit]), W * sizeof(uint64_t));
      out.kept[o] = kept;
      continue;
    }
    const bool learns = r == Reveal::Both || r == Reveal::Shares || r == mine_only;
    const bool opened = r == Reveal::Both || r == mine_only;
    if (!learns) continue;
    std::vector<uint64_t>& v = out.values[o];
    v.assign(n, 0);
    for (size_t bit = 0; bit < plan.output_slots[o].size(); ++bit) {
      uint64_t* share = row(plan.output_slots[o][bit]);
      if (opened) {
        pd.assign(W + 1, 0);
        if (row_bytes) std::memcpy(pd.data(), recv_buf.data() + recv_row * row_bytes, row_bytes);
        ++recv_row;
        for (size_t w = 0; w < W; ++w) pd[w] ^= share[w];
        share = pd.data();
      }
      for (size_t i = 0; i < n; ++i) v[i] |= ((share[i >> 6] >> (i & 63)) & 1) << bit;
    }
  }
  ++run_id_;
  return out;
}

}  // namespace gc
