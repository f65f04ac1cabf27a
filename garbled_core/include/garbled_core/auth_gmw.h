// Authenticated GMW: layer 3a of docs/MALICIOUS.md. The two servers evaluate the same compiled
// gc::Circuit as GmwParty (gmw.h), with the same run interface (RunInputs, RunOutputs, Kept
// outputs carried into later runs), on authenticated XOR shares of every wire (auth_bits.h):
// each party's bit of a wire carries a MAC under the other party's Delta. A party that deviates
// in any message is caught (PeerDeviated) before anything computed from its messages is
// revealed, except with probability at most 2^-rho (the triples' bucketing) plus 2^-127 per
// check (a guess of the other's Delta).
//
// The run (auth_session.h has the header, the inputs, the check and the outputs): the gates,
// by AND-depth stage: XOR / NOT locally (MACs and keys follow); per AND layer one message each
// way with the bits of d = u ^ a, e = v ^ b per gate and instance ([a], [b], [c] a triple,
// taken in batches of whole AND layers); every MAC of an opened bit goes into the deferred
// check; the gate's shares are [c] ^ d [b] ^ e [a] ^ d e.
#pragma once

#include <cstddef>

#include "garbled_core/auth_session.h"

namespace gc {

class AuthGmwParty : public AuthSession {
 public:
  AuthGmwParty(Channel& ch, int party, int rho = kDefaultRho, AuthCots cots = AuthCots::Silent,
               size_t triple_batch = kDefaultTripleBatch);

 protected:
  void evaluate(const Circuit& c, const GmwPlan& plan, AuthWires& w, DeferredMacCheck& check) override;
};

}  // namespace gc
