#include "garbled_core/random.h"

#include <openssl/err.h>
#include <openssl/rand.h>

#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gc {

void secure_random(void* out, size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  while (n > 0) {
    int chunk = n > (size_t)INT_MAX ? INT_MAX : (int)n;
    if (RAND_bytes(p, chunk) != 1) {
      char msg[256];
      ERR_error_string_n(ERR_get_error(), msg, sizeof msg);
      throw std::runtime_error(std::string("secure_random: RAND_bytes failed: ") + msg);
    }
    p += chunk;
    n -= (size_t)chunk;
  }
}

block random_block() {
  uint8_t b[16];
  secure_random(b, sizeof b);
  return load_block(b);
}

block random_delta() {
  return xor_block(and_block(random_block(), make_block(~0ull, ~1ull)), make_block(0, 1));
}

}  // namespace gc
