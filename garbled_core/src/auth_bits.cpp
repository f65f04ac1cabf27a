#include "garbled_core/auth_bits.h"

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

#include "garbled_core/iknp.h"
#include "garbled_core/random.h"
#include "garbled_core/sha256.h"

namespace gc {

namespace {

std::array<uint8_t, 32> mac_digest(const BlockVector& macs) {
  static const char kTag[] = "spgc.auth-bits.open.v1";
  Sha256 h;
  h.update(kTag, sizeof kTag);
  h.update(macs.data(), macs.size() * sizeof(block));
  return h.digest();
}

}  // namespace

std::vector<uint8_t> pack_bits(const std::vector<uint8_t>& bits) {
  std::vector<uint8_t> out((bits.size() + 7) / 8, 0);
  for (size_t i = 0; i < bits.size(); ++i) out[i >> 3] |= (uint8_t)((bits[i] & 1) << (i & 7));
  return out;
}

std::vector<uint8_t> unpack_bits(const std::vector<uint8_t>& packed, size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = (packed[i >> 3] >> (i & 7)) & 1;
  return out;
}

const char* auth_cots_name(AuthCots c) {
  switch (c) {
    case AuthCots::Silent:
      return "silent";
    case AuthCots::Iknp:
      return "iknp";
    case AuthCots::SilentTestOnly:
      return "silent-test-only";
  }
  return "?";
}

AuthParty::AuthParty(Channel& ch, bool first, const block* delta_for_test, AuthCots cots)
    : ch_(ch), first_(first), cots_(cots) {
  delta_ = delta_for_test ? *delta_for_test : random_delta();
  if (!lsb(delta_)) throw std::invalid_argument("Delta must have its lowest bit set");
}

AuthParty::~AuthParty() = default;

AuthShares AuthParty::random(size_t n) {
  cots_used_ += n;
  std::vector<uint8_t> choices;
  BlockVector keys, macs;
  if (cots_ == AuthCots::Iknp) {
    const size_t m = (n + 127) / 128 * 128;
    choices.resize(m / 8);
    secure_random(choices.data(), choices.size());
    keys.resize_for_overwrite(m);
    macs.resize_for_overwrite(m);
    CotSender sender;      // keys of the peer's bits, under our Delta
    CotReceiver receiver;  // our bits, MACed under the peer's Delta
    // The two directions in opposite orders on the two sides, so that each step meets its peer.
    if (first_) {
      sender.setup(ch_, delta_);
      receiver.setup(ch_);
      sender.extend_checked(ch_, keys.data(), m);
      receiver.extend_checked(ch_, choices.data(), macs.data(), m);
    } else {
      receiver.setup(ch_);
      sender.setup(ch_, delta_);
      receiver.extend_checked(ch_, choices.data(), macs.data(), m);
      sender.extend_checked(ch_, keys.data(), m);
    }
  } else {
    if (!silent_sender_) {
      SilentOtParams params =
          (cots_ == AuthCots::Silent ? SilentOtParams::ferret() : SilentOtParams::test_only()).with_malicious_check();
      silent_sender_ = std::make_unique<SilentCotSender>(ch_, delta_, params);
      silent_receiver_ = std::make_unique<SilentCotReceiver>(ch_, params);
      if (first_) {
        silent_sender_->setup();
        silent_receiver_->setup();
      } else {
        silent_receiver_->setup();
        silent_sender_->setup();
      }
    }
    choices.resize((n + 7) / 8);
    keys.resize_for_overwrite(n);
    macs.resize_for_overwrite(n);
    if (first_) {
      silent_sender_->extend(n, keys.data());
      silent_receiver_->extend(n, choices.data(), macs.data());
    } else {
      silent_receiver_->extend(n, choices.data(), macs.data());
      silent_sender_->extend(n, keys.data());
    }
  }
  ch_.flush();
  AuthShares s;
  s.bits.resize(n);
  for (size_t i = 0; i < n; ++i) s.bits[i] = (choices[i >> 3] >> (i & 7)) & 1;
  macs.resize(n);  // IKNP made a whole number of 128: the tail is dropped
  keys.resize(n);
  s.macs = std::move(macs);
  s.keys = std::move(keys);
  return s;
}

AuthShares AuthParty::constant(const std::vector<uint8_t>& values) const {
  AuthShares zero;
  zero.bits.assign(values.size(), 0);
  zero.macs.resize(values.size());
  zero.keys.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) zero.macs[i] = zero.keys[i] = zero_block();
  return xor_public(zero, values);
}

AuthShares AuthParty::xor_shares(const AuthShares& a, const AuthShares& b) {
  if (a.size() != b.size()) throw std::invalid_argument("xor of shares of different lengths");
  AuthShares out;
  out.bits.resize(a.size());
  out.macs.resize(a.size());
  out.keys.resize(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    out.bits[i] = a.bits[i] ^ b.bits[i];
    out.macs[i] = xor_block(a.macs[i], b.macs[i]);
    out.keys[i] = xor_block(a.keys[i], b.keys[i]);
  }
  return out;
}

AuthShares AuthParty::xor_public(const AuthShares& a, const std::vector<uint8_t>& c) const {
  if (a.size() != c.size()) throw std::invalid_argument("xor with public bits of another length");
  AuthShares out = a;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(c[i] & 1)) continue;
    if (first_)
      out.bits[i] ^= 1;  // our bit flips; the peer's key of it moves by its Delta
    else
      out.keys[i] = xor_block(out.keys[i], delta_);
  }
  return out;
}

std::vector<uint8_t> AuthParty::open(const AuthShares& s) {
  std::vector<uint8_t> bits = s.bits;
  BlockVector macs = s.macs;
  if (deviation_.opening) deviation_.opening(bits, macs, deviation_.context);
  // Our bits, then SHA-256 of our MACs; the peer's message the same shape.
  std::vector<uint8_t> message = pack_bits(bits);
  const size_t packed = message.size();
  const std::array<uint8_t, 32> digest = mac_digest(macs);
  message.insert(message.end(), digest.begin(), digest.end());
  std::vector<uint8_t> heard(message.size());
  exchange(message.data(), message.size(), heard.data(), heard.size());
  const uint8_t* theirs = heard.data();
  std::array<uint8_t, 32> their_digest;
  std::memcpy(their_digest.data(), heard.data() + packed, 32);
  BlockVector expected(s.size());
  std::vector<uint8_t> values(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    uint8_t b = (theirs[i >> 3] >> (i & 7)) & 1;
    expected[i] = xor_block(s.keys[i], and_block(delta_, select_mask(b)));
    values[i] = b ^ (s.bits[i] & 1);
  }
  if (mac_digest(expected) != their_digest)
    throw PeerDeviated("the peer opened bits whose MACs do not hold (authenticated opening)");
  return values;
}

AuthShares AuthParty::slice(const AuthShares& s, size_t begin, size_t count) {
  if (begin + count > s.size()) throw std::invalid_argument("slice past the end of the shares");
  AuthShares out;
  out.bits.assign(s.bits.begin() + (ptrdiff_t)begin, s.bits.begin() + (ptrdiff_t)(begin + count));
  out.macs.resize(count);
  out.keys.resize(count);
  if (count) {
    std::memcpy(static_cast<void*>(out.macs.data()), s.macs.data() + begin, count * sizeof(block));
    std::memcpy(static_cast<void*>(out.keys.data()), s.keys.data() + begin, count * sizeof(block));
  }
  return out;
}

void AuthParty::append(AuthShares& to, const AuthShares& from) {
  const size_t n = to.size(), m = from.size();
  to.bits.insert(to.bits.end(), from.bits.begin(), from.bits.end());
  to.macs.resize(n + m);
  to.keys.resize(n + m);
  if (m) {
    std::memcpy(static_cast<void*>(to.macs.data() + n), from.macs.data(), m * sizeof(block));
    std::memcpy(static_cast<void*>(to.keys.data() + n), from.keys.data(), m * sizeof(block));
  }
}

void AuthParty::exchange(const void* ours, size_t n, void* theirs, size_t m) {
  ch_.send(ours, n);
  ch_.flush();
  ch_.recv(theirs, m);
  log_received(theirs, m);
}

std::array<uint8_t, 32> AuthParty::evidence() {
  std::array<uint8_t, 32> d = received_->digest();
  received_ = std::make_unique<Sha256>();
  return d;
}

// ------------------------------------------------------------------ deferred checks

namespace {

// The digest of party `role`'s MACs starts with this tag and the role, so that a party cannot
// pass by echoing the digest it read (the two digests cover different MACs).
void start_digest(Sha256& h, bool first_party) {
  static const char kTag[] = "spgc.auth-bits.deferred.v1";
  const uint8_t role = first_party ? 0 : 1;
  h.update(kTag, sizeof kTag);
  h.update(&role, 1);
}

}  // namespace

DeferredMacCheck::DeferredMacCheck(AuthParty& party) : party_(party) {
  start_digest(sent_, party.first());
  start_digest(expected_, !party.first());
}

std::array<uint8_t, 32> DeferredMacCheck::our_digest() {
  flush(sent_buf_, sent_used_, sent_);
  return sent_.digest();
}

void DeferredMacCheck::check_peer(const std::array<uint8_t, 32>& theirs, const char* what) {
  flush(expected_buf_, expected_used_, expected_);
  if (expected_.digest() != theirs)
    throw PeerDeviated(std::string("the peer's MACs do not hold (") + what + ")");
}

void DeferredMacCheck::verify(const char* what) {
  const std::array<uint8_t, 32> ours = our_digest();
  std::array<uint8_t, 32> theirs{};
  party_.exchange(ours.data(), ours.size(), theirs.data(), theirs.size());
  check_peer(theirs, what);
}

}  // namespace gc
