// Base oblivious transfer: Chou-Orlandi "simplest OT" over NIST P-256 (semi-honest).
// Used to seed OT extension with ~128 random OTs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "garbled_core/block.h"

namespace gc {

class Channel;

// Sender side: after the call, (k0[i], k1[i]) are n independent random key pairs.
// Messages: sends A (33 B), receives n points B_i (33 B each). Traffic is counted under
// Phase::BaseOT; the channel's previous phase is restored on return.
void base_ot_send(Channel& ch, block* k0, block* k1, size_t n);

// Receiver side: choices[i] is 0 or 1; out[i] = k_{choices[i]}[i] of the sender.
void base_ot_recv(Channel& ch, const uint8_t* choices, block* out, size_t n);

}  // namespace gc
