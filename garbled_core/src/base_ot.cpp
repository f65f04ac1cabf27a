// Chou-Orlandi OT ("The Simplest Protocol for Oblivious Transfer", 2015) on P-256.
//
//   sender:   a <- Z_q*,  A = a*G                         --- A --->
//   receiver: b_i <- Z_q*, B_i = b_i*G + c_i*A             <-- B_1..B_n ---
//   receiver: k_{c_i} = H(i, A, B_i, b_i*A)
//   sender:   k0_i = H(i, A, B_i, a*B_i),  k1_i = H(i, A, B_i, a*B_i - a*A)
//
// H = SHA-256 over a domain string, the index and compressed points, truncated to 128 bits.
#include "garbled_core/base_ot.h"

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/obj_mac.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "garbled_core/channel.h"

namespace gc {

namespace {

constexpr size_t kPointBytes = 33;  // compressed P-256 point
constexpr char kDomain[] = "SPGC base OT v1: Chou-Orlandi P-256 SHA-256";

[[noreturn]] void ossl_fail(const char* what) {
  char buf[256];
  unsigned long e = ERR_peek_last_error();
  if (e)
    ERR_error_string_n(e, buf, sizeof buf);
  else
    std::strcpy(buf, "unknown error");
  ERR_clear_error();
  throw std::runtime_error(std::string("base OT: ") + what + " failed: " + buf);
}

struct GroupFree { void operator()(EC_GROUP* g) const { EC_GROUP_free(g); } };
struct PointFree { void operator()(EC_POINT* p) const { EC_POINT_free(p); } };
struct BnFree { void operator()(BIGNUM* b) const { BN_clear_free(b); } };
struct CtxFree { void operator()(BN_CTX* c) const { BN_CTX_free(c); } };
struct MdCtxFree { void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); } };
struct MdFree { void operator()(EVP_MD* m) const { EVP_MD_free(m); } };
using GroupPtr = std::unique_ptr<EC_GROUP, GroupFree>;
using PointPtr = std::unique_ptr<EC_POINT, PointFree>;
using BnPtr = std::unique_ptr<BIGNUM, BnFree>;

struct Curve {
  GroupPtr group;
  std::unique_ptr<BN_CTX, CtxFree> ctx;
  const BIGNUM* order = nullptr;

  Curve() {
    group.reset(EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1));
    if (!group) ossl_fail("EC_GROUP_new_by_curve_name(P-256)");
    ctx.reset(BN_CTX_secure_new());
    if (!ctx) ossl_fail("BN_CTX_new");
    order = EC_GROUP_get0_order(group.get());
  }

  PointPtr new_point() const {
    PointPtr p(EC_POINT_new(group.get()));
    if (!p) ossl_fail("EC_POINT_new");
    return p;
  }

  // Uniform scalar in [1, order).
  BnPtr random_scalar() const {
    BnPtr s(BN_secure_new());
    if (!s) ossl_fail("BN_new");
    do {
      if (BN_priv_rand_range(s.get(), order) != 1) ossl_fail("BN_priv_rand_range");
    } while (BN_is_zero(s.get()));
    return s;
  }

  // res = g_scalar*G + p_scalar*P (either term may be absent).
  void mul(EC_POINT* res, const BIGNUM* g_scalar, const EC_POINT* p, const BIGNUM* p_scalar) const {
    if (EC_POINT_mul(group.get(), res, g_scalar, p, p_scalar, ctx.get()) != 1) ossl_fail("EC_POINT_mul");
  }

  void encode(const EC_POINT* p, uint8_t out[kPointBytes]) const {
    if (EC_POINT_is_at_infinity(group.get(), p)) {  // only possible for a degenerate peer
      std::memset(out, 0, kPointBytes);
      return;
    }
    size_t len = EC_POINT_point2oct(group.get(), p, POINT_CONVERSION_COMPRESSED, out, kPointBytes, ctx.get());
    if (len != kPointBytes) ossl_fail("EC_POINT_point2oct");
  }

  // Decodes a peer's point; rejects malformed encodings, off-curve points and infinity.
  void decode(EC_POINT* p, const uint8_t in[kPointBytes], const char* what) const {
    if (EC_POINT_oct2point(group.get(), p, in, kPointBytes, ctx.get()) != 1 ||
        EC_POINT_is_at_infinity(group.get(), p) || EC_POINT_is_on_curve(group.get(), p, ctx.get()) != 1) {
      ERR_clear_error();
      throw ChannelError(std::string("base OT: peer sent an invalid curve point (") + what + ")");
    }
  }
};

class KeyHash {
 public:
  KeyHash() {
    md_.reset(EVP_MD_fetch(nullptr, "SHA256", nullptr));
    if (!md_) ossl_fail("EVP_MD_fetch(SHA256)");
    mctx_.reset(EVP_MD_CTX_new());
    if (!mctx_) ossl_fail("EVP_MD_CTX_new");
  }

  block operator()(uint64_t index, const uint8_t* A, const uint8_t* B, const uint8_t* P) {
    uint8_t idx[8];
    for (int i = 0; i < 8; ++i) idx[i] = (uint8_t)(index >> (8 * i));
    uint8_t digest[EVP_MAX_MD_SIZE];
    unsigned int dlen = 0;
    if (EVP_DigestInit_ex(mctx_.get(), md_.get(), nullptr) != 1 ||
        EVP_DigestUpdate(mctx_.get(), kDomain, sizeof kDomain) != 1 ||  // includes the NUL
        EVP_DigestUpdate(mctx_.get(), idx, sizeof idx) != 1 ||
        EVP_DigestUpdate(mctx_.get(), A, kPointBytes) != 1 ||
        EVP_DigestUpdate(mctx_.get(), B, kPointBytes) != 1 ||
        EVP_DigestUpdate(mctx_.get(), P, kPointBytes) != 1 ||
        EVP_DigestFinal_ex(mctx_.get(), digest, &dlen) != 1 || dlen < 16)
      ossl_fail("SHA-256");
    block k = load_block(digest);
    OPENSSL_cleanse(digest, sizeof digest);
    return k;
  }

 private:
  std::unique_ptr<EVP_MD, MdFree> md_;
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> mctx_;
};

class PhaseScope {
 public:
  PhaseScope(Channel& ch, Phase p) : ch_(ch), saved_(ch.phase()) { ch.set_phase(p); }
  ~PhaseScope() { ch_.set_phase(saved_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Channel& ch_;
  Phase saved_;
};

}  // namespace

void base_ot_send(Channel& ch, block* k0, block* k1, size_t n) {
  PhaseScope scope(ch, Phase::BaseOT);
  Curve c;
  KeyHash H;

  BnPtr a = c.random_scalar();
  PointPtr A = c.new_point();
  c.mul(A.get(), a.get(), nullptr, nullptr);
  uint8_t A_enc[kPointBytes];
  c.encode(A.get(), A_enc);
  ch.send(A_enc, kPointBytes);
  if (n == 0) {
    ch.flush();
    return;
  }

  std::vector<uint8_t> B_enc(n * kPointBytes);
  ch.recv(B_enc.data(), B_enc.size());

  // minus_aA = -(a*A), so that a*(B - A) = a*B + minus_aA.
  PointPtr minus_aA = c.new_point();
  c.mul(minus_aA.get(), nullptr, A.get(), a.get());
  if (EC_POINT_invert(c.group.get(), minus_aA.get(), c.ctx.get()) != 1) ossl_fail("EC_POINT_invert");

  PointPtr B = c.new_point(), P0 = c.new_point(), P1 = c.new_point();
  uint8_t P0_enc[kPointBytes], P1_enc[kPointBytes];
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* Bi = B_enc.data() + i * kPointBytes;
    c.decode(B.get(), Bi, "B");
    c.mul(P0.get(), nullptr, B.get(), a.get());
    if (EC_POINT_add(c.group.get(), P1.get(), P0.get(), minus_aA.get(), c.ctx.get()) != 1) ossl_fail("EC_POINT_add");
    c.encode(P0.get(), P0_enc);
    c.encode(P1.get(), P1_enc);
    k0[i] = H(i, A_enc, Bi, P0_enc);
    k1[i] = H(i, A_enc, Bi, P1_enc);
  }
  OPENSSL_cleanse(P0_enc, sizeof P0_enc);
  OPENSSL_cleanse(P1_enc, sizeof P1_enc);
}

void base_ot_recv(Channel& ch, const uint8_t* choices, block* out, size_t n) {
  PhaseScope scope(ch, Phase::BaseOT);
  Curve c;
  KeyHash H;

  uint8_t A_enc[kPointBytes];
  ch.recv(A_enc, kPointBytes);
  if (n == 0) return;
  PointPtr A = c.new_point();
  c.decode(A.get(), A_enc, "A");

  // First all B_i (cheap fixed-base products) so they go out at once; the receiver's
  // keys b_i*A are then computed while the sender computes a*B_i.
  std::vector<uint8_t> B_enc(n * kPointBytes);
  std::vector<BnPtr> b(n);
  PointPtr bG = c.new_point(), bGA = c.new_point(), K = c.new_point();
  uint8_t enc0[kPointBytes], enc1[kPointBytes], K_enc[kPointBytes];
  for (size_t i = 0; i < n; ++i) {
    b[i] = c.random_scalar();
    c.mul(bG.get(), b[i].get(), nullptr, nullptr);  // fixed base: uses the generator table
    if (EC_POINT_add(c.group.get(), bGA.get(), bG.get(), A.get(), c.ctx.get()) != 1) ossl_fail("EC_POINT_add");
    c.encode(bG.get(), enc0);
    c.encode(bGA.get(), enc1);
    // Pick the encoding of B_i without branching on the choice bit.
    uint8_t mask = (uint8_t)(0 - (uint8_t)(choices[i] != 0));
    uint8_t* Bi = B_enc.data() + i * kPointBytes;
    for (size_t j = 0; j < kPointBytes; ++j) Bi[j] = (uint8_t)(enc0[j] ^ (mask & (enc0[j] ^ enc1[j])));
  }
  ch.send(B_enc.data(), B_enc.size());
  ch.flush();
  for (size_t i = 0; i < n; ++i) {
    c.mul(K.get(), nullptr, A.get(), b[i].get());
    c.encode(K.get(), K_enc);
    out[i] = H(i, A_enc, B_enc.data() + i * kPointBytes, K_enc);
  }
  OPENSSL_cleanse(K_enc, sizeof K_enc);
}

}  // namespace gc
