// Authenticated AND triples (see auth_triples.h for the protocol and its bound).
#include "garbled_core/auth_triples.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "garbled_core/aes.h"
#include "garbled_core/iknp.h"
#include "garbled_core/prg.h"
#include "garbled_core/random.h"
#include "garbled_core/sha256.h"

namespace gc {

namespace {

constexpr uint64_t kHalfAnd = 1, kCheck = 2;  // hash purposes (the tweak's top byte)
// The check runs on the low 72 bits of every value (a linear projection: G_A ^ G_B = (x y ^ z)
// times the joint Delta's low 72 bits, 71 of them unknown to either party, as lsb(Delta_A ^
// Delta_B) = 0), so U travels as 9 bytes: a wrong z passes with probability 2^-71 a triple.
constexpr size_t kCheckBytes = 9;
// Triples whose hashes the leaky AND computes at a time (its scratch: 5 blocks each, 160 KB).
constexpr size_t kHashBlock = 2048;
const block kCheckMask = make_block(0xFF, ~uint64_t(0));

// Three consecutive ranges of one AuthShares, written in place.
struct SharesView {
  uint8_t* bits;
  block* macs;
  block* keys;
};

// One leaky triple as bucketing reads it: the permutation sends every read to a random place
// in arrays far larger than the cache, so a triple's nine values share two cache lines instead
// of sitting in nine arrays (one miss per array).
struct alignas(64) LeakyRecord {
  block b_mac, b_key, a_mac, a_key;  // the first line: what the opened d needs (and b's bit)
  block c_mac, c_key;
  uint8_t a, b, c;
};
static_assert(sizeof(LeakyRecord) == 128, "a leaky triple fills two cache lines");

// H(x, tweak) = AES_k(sigma(x) ^ tweak) ^ sigma(x), sigma(hi, lo) = (hi ^ lo, hi): the
// tweakable correlation-robust hash of Guo, Katz, Wang and Yu (S&P 2020) from a fixed key.
class TweakHash {
 public:
  explicit TweakHash(block seed) : key_(aes_key(seed)) {}
  // out[i] = H(x[i], tweak(first + i)) for one purpose and owner.
  void hash(const block* x, size_t n, uint64_t purpose, int owner, uint64_t first, block* out) const {
    const uint64_t hi = (purpose << 56) | ((uint64_t)(owner & 1) << 48);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      block s[8], t[8];
      for (int j = 0; j < 8; ++j) {
        s[j] = sigma(x[i + j]);
        t[j] = xor_block(s[j], make_block(hi, first + i + j));
      }
      aes_encrypt_blocks<8>(key_, t);
      for (int j = 0; j < 8; ++j) out[i + j] = xor_block(t[j], s[j]);
    }
    for (; i < n; ++i) {
      block s = sigma(x[i]);
      block t[1] = {xor_block(s, make_block(hi, first + i))};
      aes_encrypt_blocks<1>(key_, t);
      out[i] = xor_block(t[0], s);
    }
  }

 private:
  static block sigma(block x) { return make_block(high64(x) ^ low64(x), high64(x)); }
  AesKey key_;
};

double log2_choose(double n, double k) {
  return (std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1)) / std::log(2.0);
}

// A uniform index below `bound` from the stream (rejection: no modulo bias).
uint64_t uniform_below(Prg& prg, uint64_t bound) {
  const uint64_t limit = ~uint64_t(0) - (~uint64_t(0) % bound);
  for (;;) {
    block b;
    prg.fill(&b, 1);
    const uint64_t v = low64(b);
    if (v < limit) return v % bound;
  }
}

}  // namespace

// ------------------------------------------------------------------ the bound

double bucketing_error_log2(size_t n, size_t bucket) {
  if (n == 0 || bucket == 0) return 0.0;
  const double N = (double)n * (double)bucket, B = (double)bucket;
  // f(t) = 2^-t n C(t, B) / C(N, B) grows while t + 1 < 2B and falls after: its maximum over
  // t >= B is within [B, 2B]; the range below is wider for safety.
  double worst = -INFINITY;
  for (double t = B; t <= std::min(N, 4 * B + 8); t += 1) {
    const double f = -t + std::log2((double)n) + log2_choose(t, B) - log2_choose(N, B);
    worst = std::max(worst, f);
  }
  return std::min(0.0, worst);
}

size_t bucket_size(size_t n, int rho) {
  if (rho < 1 || rho > 128) throw std::invalid_argument("rho must be in 1..128");
  for (size_t b = 2; b <= 64; ++b)
    if (bucketing_error_log2(std::max<size_t>(n, 1), b) <= -(double)rho) return b;
  throw std::invalid_argument("no bucket size up to 64 reaches 2^-" + std::to_string(rho) + " for " +
                              std::to_string(n) + " triples");
}

// ------------------------------------------------------------------ coin toss

block coin_toss(AuthParty& party, const char* purpose) {
  static const char kTag[] = "spgc.auth-triples.coin.v1";
  Channel& ch = party.channel();
  auto commit = [&](const block& coin) {
    Sha256 h;
    h.update(kTag, sizeof kTag);
    h.update(purpose, std::strlen(purpose));
    h.update(&coin, sizeof coin);
    return h.digest();
  };
  const block mine = random_block();
  block first_coin, second_coin;
  if (party.first()) {
    const auto c = commit(mine);
    ch.send(c.data(), c.size());
    ch.flush();
    ch.recv(&second_coin, sizeof second_coin);
    party.log_received(&second_coin, sizeof second_coin);
    ch.send(&mine, sizeof mine);
    ch.flush();
    first_coin = mine;
  } else {
    std::array<uint8_t, 32> c{};
    ch.recv(c.data(), c.size());
    party.log_received(c.data(), c.size());
    ch.send(&mine, sizeof mine);
    ch.flush();
    ch.recv(&first_coin, sizeof first_coin);
    party.log_received(&first_coin, sizeof first_coin);
    if (commit(first_coin) != c) throw PeerDeviated("the peer's coin does not open its commitment (coin toss)");
    second_coin = mine;
  }
  Sha256 h;
  h.update(kTag, sizeof kTag);
  h.update(purpose, std::strlen(purpose));
  h.update(&first_coin, sizeof first_coin);
  h.update(&second_coin, sizeof second_coin);
  const auto d = h.digest();
  return load_block(d.data());
}

AuthTriples AuthTriples::slice(size_t begin, size_t count) const {
  AuthTriples out;
  out.a = AuthParty::slice(a, begin, count);
  out.b = AuthParty::slice(b, begin, count);
  out.c = AuthParty::slice(c, begin, count);
  return out;
}

void AuthTriples::append(const AuthTriples& more) {
  AuthParty::append(a, more.a);
  AuthParty::append(b, more.b);
  AuthParty::append(c, more.c);
}

// ------------------------------------------------------------------ test cheaters

TripleDeviation TripleCheat::hooks() {
  // `index` counts the batch's triples: each hook sees one chunk at a time (its own count of
  // the triples before it, as the chunks of a batch are interleaved).
  TripleDeviation d;
  d.context = this;
  d.messages = [](std::vector<uint8_t>& half_and, BlockVector& u, void* self) {
    auto* c = static_cast<TripleCheat*>(self);
    const size_t before = c->seen_messages;
    c->seen_messages += u.size();
    if (c->index < before || c->index - before >= u.size()) return;
    const size_t i = c->index - before;
    if (c->kind == Kind::UError) u[i] = xor_block(u[i], and_block(c->error, kCheckMask));
    if (c->kind == Kind::HalfAndFlip) {  // both of P's bits: Q's t is wrong whatever x_Q
      half_and[2 * i] ^= 1;
      half_and[2 * i + 1] ^= 1;
    }
  };
  d.z_corrections = [](std::vector<uint8_t>& e, void* self) {
    auto* c = static_cast<TripleCheat*>(self);
    const size_t before = c->seen_corrections;
    c->seen_corrections += e.size();
    if (c->kind == Kind::CorrectionFlip && c->index >= before && c->index - before < e.size())
      e[c->index - before] ^= 1;
  };
  d.check = [](BlockVector& g, void* self) {
    auto* c = static_cast<TripleCheat*>(self);
    const size_t before = c->seen_checks;
    c->seen_checks += g.size();
    if (c->index < before || c->index - before >= g.size()) return;
    const size_t i = c->index - before;
    if (c->kind == Kind::UError && c->guess == 1) g[i] = xor_block(g[i], and_block(c->error, kCheckMask));
    if (c->kind == Kind::CheckFlip) g[i] = xor_block(g[i], make_block(0, 2));
  };
  return d;
}

// ------------------------------------------------------------------ leaky AND

TripleFactory::TripleFactory(AuthParty& party) : party_(party) {}

// One chunk of leaky triples between its messages. A batch's chunks are interleaved: each
// chunk's corrections e travel with the next chunk's half-AND message, and the checks of all
// chunks are compared once, at the end (check_batch), before anything depends on them (the
// bucketing's permutation is drawn after it). A chunk's messages depend only on its own fresh
// random shares, so the order changes nothing a cheater sees, except that it learns later.
struct TripleFactory::LeakyChunk {
  size_t n = 0;
  AuthShares all;                   // [x] in [0, n), [y] in [n, 2n), [r] then [z] in [2n, 3n)
  std::vector<uint8_t> s, mac_bit;  // P's half-AND pads; lsb H1(M[x_P]) (reads the peer's)
  BlockVector psi, c_key, c_mac, u_in;
  std::vector<uint8_t> message;     // the half-AND bits, then each U's low kCheckBytes bytes
  std::vector<uint8_t> e;           // z_P ^ r_P, one byte a triple
  std::vector<uint8_t> e_out;       // e packed
  SharesView x() { return {all.bits.data(), all.macs.data(), all.keys.data()}; }
  SharesView y() { return {all.bits.data() + n, all.macs.data() + n, all.keys.data() + n}; }
  SharesView z() { return {all.bits.data() + 2 * n, all.macs.data() + 2 * n, all.keys.data() + 2 * n}; }
};

TripleFactory::LeakyChunk TripleFactory::leaky_start(size_t n) {
  if (!keyed_) {
    hash_key_seed_ = coin_toss(party_, "hash key");
    keyed_ = true;
  }
  const TweakHash H(hash_key_seed_);
  const block delta = party_.delta();
  const int me = party_.first() ? 0 : 1, peer = 1 - me;
  const uint64_t base = next_tweak_;
  next_tweak_ += n;
  leaky_made_ += n;

  LeakyChunk c;
  c.n = n;
  c.all = party_.random(3 * n);
  const SharesView x = c.x(), y = c.y();
  // What outlives this step, sized without zeroing (every element is written below).
  BlockVector u;
  for (BlockVector* v : {&u, &c.psi, &c.c_key, &c.c_mac}) v->resize_for_overwrite(n);
  std::vector<uint8_t> half_and(2 * n);
  {
    std::vector<uint8_t> coins((n + 7) / 8);
    secure_random(coins.data(), coins.size());
    c.s = unpack_bits(coins, n);
  }
  c.mac_bit.resize(n);
  // Half AND and U, kHashBlock triples at a time: the hashes needed only here stay in a
  // scratch the size of one block (the tweaks are the triples' own, as in one pass).
  BlockVector scratch;
  scratch.resize_for_overwrite(5 * kHashBlock);
  block *keys_delta = scratch.data(), *h_key = keys_delta + kHashBlock, *h_key_delta = h_key + kHashBlock,
        *h_mac = h_key_delta + kHashBlock, *c_key_delta = h_mac + kHashBlock;
  for (size_t lo = 0; lo < n; lo += kHashBlock) {
    const size_t m = std::min(kHashBlock, n - lo);
    for (size_t i = 0; i < m; ++i) keys_delta[i] = xor_block(x.keys[lo + i], delta);
    H.hash(x.keys + lo, m, kHalfAnd, peer, base + lo, h_key);
    H.hash(keys_delta, m, kHalfAnd, peer, base + lo, h_key_delta);
    H.hash(x.macs + lo, m, kHalfAnd, me, base + lo, h_mac);
    for (size_t i = 0; i < m; ++i) {
      const size_t t = lo + i;
      half_and[2 * t] = (uint8_t)(lsb(h_key[i]) ^ c.s[t]);
      half_and[2 * t + 1] = (uint8_t)(lsb(h_key_delta[i]) ^ c.s[t] ^ y.bits[t]);
      c.mac_bit[t] = (uint8_t)lsb(h_mac[i]);
    }
    H.hash(x.keys + lo, m, kCheck, peer, base + lo, c.c_key.data() + lo);
    H.hash(keys_delta, m, kCheck, peer, base + lo, c_key_delta);
    H.hash(x.macs + lo, m, kCheck, me, base + lo, c.c_mac.data() + lo);
    for (size_t i = 0; i < m; ++i) {
      const size_t t = lo + i;
      c.psi[t] = xor_block(xor_block(and_block(delta, select_mask(y.bits[t])), y.keys[t]), y.macs[t]);
      u[t] = xor_block(xor_block(c.c_key[t], c_key_delta[i]), c.psi[t]);
    }
  }
  if (deviation_.messages) deviation_.messages(half_and, u, deviation_.context);
  c.message = pack_bits(half_and);
  const size_t half_bytes = c.message.size();
  c.message.resize(half_bytes + n * kCheckBytes);
  for (size_t t = 0; t < n; ++t) {
    uint8_t b[16];
    store_block(b, u[t]);
    std::memcpy(c.message.data() + half_bytes + t * kCheckBytes, b, kCheckBytes);
  }
  return c;
}

void TripleFactory::leaky_respond(LeakyChunk& c, const uint8_t* heard) {
  const size_t n = c.n, half_bytes = (2 * n + 7) / 8;
  const std::vector<uint8_t> peer_half = unpack_bits(std::vector<uint8_t>(heard, heard + half_bytes), 2 * n);
  c.u_in.resize_for_overwrite(n);
  for (size_t t = 0; t < n; ++t) {
    uint8_t b[16] = {};
    std::memcpy(b, heard + half_bytes + t * kCheckBytes, kCheckBytes);
    c.u_in[t] = load_block(b);
  }
  // z_P = x_P y_P ^ s_P ^ t_P, authenticated through r.
  const SharesView x = c.x(), y = c.y(), zs = c.z();
  c.e.resize(n);
  for (size_t t = 0; t < n; ++t) {
    const uint8_t got = (uint8_t)(c.mac_bit[t] ^ peer_half[2 * t + (x.bits[t] & 1)]);
    const uint8_t z = (uint8_t)((x.bits[t] & y.bits[t]) ^ c.s[t] ^ got);
    c.e[t] = (uint8_t)(z ^ zs.bits[t]);
  }
  if (deviation_.z_corrections) deviation_.z_corrections(c.e, deviation_.context);
  c.e_out = pack_bits(c.e);
}

void TripleFactory::leaky_finish(LeakyChunk& c, const uint8_t* peer_e_packed, LeakyCheck& check) {
  const size_t n = c.n;
  const block delta = party_.delta();
  const std::vector<uint8_t> peer_e = unpack_bits(std::vector<uint8_t>(peer_e_packed, peer_e_packed + (n + 7) / 8), n);
  const SharesView x = c.x(), zs = c.z();
  for (size_t t = 0; t < n; ++t) {
    zs.bits[t] ^= c.e[t];
    if (peer_e[t]) zs.keys[t] = xor_block(zs.keys[t], delta);
  }
  // The check: G_P ^ G_Q = (x y ^ z) Delta for every triple.
  BlockVector g;
  g.resize_for_overwrite(n);
  for (size_t t = 0; t < n; ++t) {
    block v = xor_block(c.c_key[t], c.c_mac[t]);
    if (x.bits[t]) v = xor_block(v, xor_block(c.psi[t], c.u_in[t]));
    if (zs.bits[t]) v = xor_block(v, delta);
    g[t] = and_block(xor_block(v, xor_block(zs.keys[t], zs.macs[t])), kCheckMask);
  }
  if (deviation_.observe_x) deviation_.observe_x(std::vector<uint8_t>(x.bits, x.bits + n), deviation_.context);
  check.expected.update(g.data(), n * sizeof(block));  // what the peer's digest must be
  if (deviation_.check) deviation_.check(g, deviation_.context);
  check.ours.update(g.data(), n * sizeof(block));
  // Only the shares stay: the chunk's temporaries go now, not with the batch.
  c.psi = BlockVector();
  c.c_key = BlockVector();
  c.c_mac = BlockVector();
  c.u_in = BlockVector();
}

TripleFactory::LeakyCheck::LeakyCheck(bool first_party) {
  // Tagged with the role whose values it holds: the peer's digest must be ours under its role.
  static const char kTag[] = "spgc.auth-triples.leaky-check.v2";
  const uint8_t mine = first_party ? 0 : 1, theirs = first_party ? 1 : 0;
  ours.update(kTag, sizeof kTag);
  ours.update(&mine, 1);
  expected.update(kTag, sizeof kTag);
  expected.update(&theirs, 1);
}

void TripleFactory::check_batch(LeakyCheck& check) {
  const std::array<uint8_t, 32> ours = check.ours.digest(), expected = check.expected.digest();
  std::array<uint8_t, 32> theirs{};
  party_.exchange(ours.data(), ours.size(), theirs.data(), theirs.size());
  const bool cheating = deviation_.messages || deviation_.z_corrections || deviation_.check;
  if (theirs != expected && !cheating)  // a test's cheater goes on whatever it sees
    throw PeerDeviated("the peer's leaky AND triples do not check (x y ^ z is not 0 under the joint Delta)");
}

template <typename Keep>
void TripleFactory::leaky_batch(size_t total, Keep keep) {
  if (total == 0) return;  // nothing made, nothing to check (both parties alike)
  LeakyCheck check(party_.first());
  LeakyChunk prev;  // n == 0: none yet
  std::vector<uint8_t> out, heard;
  for (size_t done = 0; done <= total;) {
    const size_t m = std::min(kLeakyChunk, total - done);
    LeakyChunk cur;
    if (m) cur = leaky_start(m);
    // Both parties send the same sizes: the previous chunk's corrections, this one's message.
    out = prev.e_out;
    out.insert(out.end(), cur.message.begin(), cur.message.end());
    heard.resize(out.size());
    party_.exchange(out.data(), out.size(), heard.data(), heard.size());
    if (prev.n) {
      leaky_finish(prev, heard.data(), check);
      keep(done - prev.n, prev);
    }
    if (!m) break;
    cur.message = std::vector<uint8_t>();
    leaky_respond(cur, heard.data() + prev.e_out.size());
    prev = std::move(cur);
    done += m;
  }
  check_batch(check);
}

AuthTriples TripleFactory::leaky(size_t n) {
  AuthTriples out;
  leaky_batch(n, [&](size_t, LeakyChunk& c) {  // the chunks in order
    AuthParty::append(out.a, AuthParty::slice(c.all, 0, c.n));
    AuthParty::append(out.b, AuthParty::slice(c.all, c.n, c.n));
    AuthParty::append(out.c, AuthParty::slice(c.all, 2 * c.n, c.n));
  });
  return out;
}

// ------------------------------------------------------------------ bucketing

AuthTriples TripleFactory::make(size_t n, int rho) {
  AuthTriples out;
  if (n == 0) return out;
  const size_t B = bucket_size(n, rho), total = n * B;
  last_bucket_ = B;
  // The leaky triples, chunk by chunk, into records allocated once and left uninitialised
  // (every record is written below before any is read).
  std::unique_ptr<LeakyRecord[]> leak(new LeakyRecord[total]);
  leaky_batch(total, [&](size_t at, LeakyChunk& c) {
    const size_t m = c.n;
    const AuthShares& part = c.all;
    for (size_t t = 0; t < m; ++t) {
      LeakyRecord& r = leak[at + t];
      r.a = part.bits[t];
      r.b = part.bits[m + t];
      r.c = part.bits[2 * m + t];
      r.a_mac = part.macs[t];
      r.a_key = part.keys[t];
      r.b_mac = part.macs[m + t];
      r.b_key = part.keys[m + t];
      r.c_mac = part.macs[2 * m + t];
      r.c_key = part.keys[2 * m + t];
    }
  });
  // The permutation is drawn after every leaky triple is fixed and checked.
  Prg prg(coin_toss(party_, "buckets"));
  std::vector<uint32_t> perm(total);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = (uint32_t)i;
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[uniform_below(prg, i + 1)]);

  // d_j = y_first ^ y_j for the other B - 1 members of every bucket, opened together.
  // Both passes below read whole buckets at random places: the records of the bucket
  // kPrefetchAhead places on are requested while this one is combined.
  constexpr size_t kPrefetchAhead = 8;
  auto prefetch_bucket = [&](size_t k) {
    if (k >= n) return;
    for (size_t j = 0; j < B; ++j) {
      const LeakyRecord* r = &leak[perm[k * B + j]];
      __builtin_prefetch(r, 0, 0);
      __builtin_prefetch(reinterpret_cast<const char*>(r) + 64, 0, 0);
    }
  };
  AuthShares d;
  d.bits.resize(n * (B - 1));
  d.macs.resize_for_overwrite(n * (B - 1));
  d.keys.resize_for_overwrite(n * (B - 1));
  for (size_t k = 0; k < kPrefetchAhead; ++k) prefetch_bucket(k);
  for (size_t k = 0; k < n; ++k) {
    prefetch_bucket(k + kPrefetchAhead);
    const LeakyRecord& f = leak[perm[k * B]];
    for (size_t j = 1; j < B; ++j) {
      const LeakyRecord& m = leak[perm[k * B + j]];
      const size_t i = k * (B - 1) + (j - 1);
      d.bits[i] = f.b ^ m.b;
      d.macs[i] = xor_block(f.b_mac, m.b_mac);
      d.keys[i] = xor_block(f.b_key, m.b_key);
    }
  }
  const std::vector<uint8_t> dv = party_.open(d);

  for (AuthShares* to : {&out.a, &out.b, &out.c}) {
    to->bits.resize(n);
    to->macs.resize_for_overwrite(n);
    to->keys.resize_for_overwrite(n);
  }
  for (size_t k = 0; k < kPrefetchAhead; ++k) prefetch_bucket(k);
  for (size_t k = 0; k < n; ++k) {
    prefetch_bucket(k + kPrefetchAhead);
    const LeakyRecord& f = leak[perm[k * B]];
    uint8_t ab = 0, cb = 0;
    block am = zero_block(), ak = zero_block(), cm = zero_block(), ck = zero_block();
    for (size_t j = 0; j < B; ++j) {
      const LeakyRecord& m = leak[perm[k * B + j]];
      ab ^= m.a;
      am = xor_block(am, m.a_mac);
      ak = xor_block(ak, m.a_key);
      cb ^= m.c;
      cm = xor_block(cm, m.c_mac);
      ck = xor_block(ck, m.c_key);
      if (j > 0 && dv[k * (B - 1) + (j - 1)]) {  // z_j ^ d_j x_j = x_j y_first
        cb ^= m.a;
        cm = xor_block(cm, m.a_mac);
        ck = xor_block(ck, m.a_key);
      }
    }
    out.a.bits[k] = ab;
    out.a.macs[k] = am;
    out.a.keys[k] = ak;
    out.b.bits[k] = f.b;
    out.b.macs[k] = f.b_mac;
    out.b.keys[k] = f.b_key;
    out.c.bits[k] = cb;
    out.c.macs[k] = cm;
    out.c.keys[k] = ck;
  }
  return out;
}

}  // namespace gc
