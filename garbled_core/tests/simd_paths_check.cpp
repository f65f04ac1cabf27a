// Standalone check that the GMW and silent-OT kernels' VAES / AVX-512 paths give the bits of
// their AES-NI / scalar twins (the two parties may run on different CPUs, so the paths must
// agree bit for bit, not only with themselves): the ROT hashes (sender and receiver sides,
// both directions, several counters), the GGM tree level and the triples' bit transpose.
// It includes the two sources to reach their internal kernels, so link the rest without them:
//   g++ -std=c++17 -O2 -Wall -Wextra -maes -mssse3 -msse4.1 -mpclmul -Igarbled_core/include
//     garbled_core/tests/simd_paths_check.cpp
//     $(ls garbled_core/src/*.cpp | grep -v -e bind -e src/gmw.cpp -e src/silent_ot.cpp)
//     -lssl -lcrypto -lpthread -o simd_paths_check
//   (one command line)
//   ./simd_paths_check     exit status 0 when every check passes (prints SKIP on a CPU
//                          without VAES + AVX-512, where only the twins run)
#include <cstdio>
#include <vector>

#include "../src/gmw.cpp"
#include "../src/silent_ot.cpp"

namespace {

// Deterministic filler: the kernels are bit transforms, any pattern that varies will do.
void fill(std::vector<uint8_t>& v, unsigned salt) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = (uint8_t)(((i + 131 * salt) * 2654435761u) >> 11);
}

}  // namespace

int main() {
#if GC_X86
  using namespace gc;
  if (!cpu_has_vaes()) {
    std::printf("SKIP: this CPU has no VAES + AVX-512\n");
    return 0;
  }
  int bad = 0;
  // ROT hashes: 4,096 ROTs, both senders, counters at 0, 128 and far out.
  const size_t m = 4096;
  std::vector<uint8_t> raw(m * sizeof(block) * 5);
  fill(raw, 1);
  block* q = reinterpret_cast<block*>(raw.data());
  block *a0 = q + m, *a1 = a0 + m, *b0 = a1 + m, *b1 = b0 + m;
  const block salt = make_block(0x1234, 0x5678), delta = make_block(0xabc, 0xdef1);
  for (int sender = 0; sender < 2; ++sender)
    for (uint64_t index : {uint64_t(0), uint64_t(128), uint64_t(1) << 40}) {
      hash_sent_aesni(salt, sender, index, delta, q, m, a0, a1);
      hash_sent_vaes(salt, sender, index, delta, q, m, b0, b1);
      bad += std::memcmp(a0, b0, m * sizeof(block)) != 0;
      bad += std::memcmp(a1, b1, m * sizeof(block)) != 0;
      hash_received_aesni(salt, sender, index, q, m, a0);
      hash_received_vaes(salt, sender, index, q, m, b0);
      bad += std::memcmp(a0, b0, m * sizeof(block)) != 0;
    }
  // One GGM level in place, from 8 to 4,096 parents.
  for (size_t cnt : {size_t(8), size_t(16), size_t(64), size_t(4096)}) {
    std::vector<uint8_t> x(2 * cnt * sizeof(block)), y;
    fill(x, (unsigned)cnt);
    y = x;
    block xs0, xs1, ys0, ys1;
    expand_level_aesni(reinterpret_cast<block*>(x.data()), cnt, &xs0, &xs1);
    expand_level_vaes(reinterpret_cast<block*>(y.data()), cnt, &ys0, &ys1);
    bad += x != y;
    bad += !equal_block(xs0, ys0) || !equal_block(xs1, ys1);
  }
  // The triples' transpose: random counts, offsets and widths.
  std::vector<uint8_t> strings(64 * sizeof(block));
  for (unsigned trial = 0; trial < 300; ++trial) {
    fill(strings, trial);
    const size_t cnt = 1 + (trial * 37) % 64;
    const unsigned off = (unsigned)((trial * 11) % (65 - cnt));
    const uint32_t width = 1 + (trial * 53) % kMaxGroupWidth;
    std::vector<uint64_t> x(kMaxGroupWidth * 3, 0x5a5a), y = x;
    const block* s = reinterpret_cast<const block*>(strings.data());
    scatter_bits_scalar(s, cnt, width, off, x.data(), 3);
    scatter_bits_avx512(s, cnt, width, off, y.data(), 3);
    bad += x != y;
  }
  std::printf("%s: %d mismatches\n", bad ? "FAIL" : "OK", bad);
  return bad ? 1 : 0;
#else
  std::printf("SKIP: not x86\n");
  return 0;
#endif
}
