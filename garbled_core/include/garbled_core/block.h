// 128-bit blocks: the unit of every wire label, hash input and PRG output.
// Header-only so that the garbling loops inline every operation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#include <wmmintrin.h>
#define GC_X86 1
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRYPTO)
#include <arm_neon.h>
#define GC_ARM 1
#else
#error "garbled_core needs x86-64 with AES-NI or aarch64 with the ARMv8 crypto extensions"
#endif

namespace gc {

#if GC_X86
using block = __m128i;

inline block make_block(uint64_t hi, uint64_t lo) { return _mm_set_epi64x((long long)hi, (long long)lo); }
inline block zero_block() { return _mm_setzero_si128(); }
inline block xor_block(block a, block b) { return _mm_xor_si128(a, b); }
inline block and_block(block a, block b) { return _mm_and_si128(a, b); }
inline uint64_t low64(block a) { return (uint64_t)_mm_cvtsi128_si64(a); }
inline uint64_t high64(block a) { return (uint64_t)_mm_extract_epi64(a, 1); }
inline bool equal_block(block a, block b) {
  block x = _mm_xor_si128(a, b);
  return _mm_testz_si128(x, x) != 0;
}
inline block load_block(const void* p) { return _mm_loadu_si128((const __m128i*)p); }
inline void store_block(void* p, block a) { _mm_storeu_si128((__m128i*)p, a); }
#else
using block = uint64x2_t;

inline block make_block(uint64_t hi, uint64_t lo) { return vcombine_u64(vcreate_u64(lo), vcreate_u64(hi)); }
inline block zero_block() { return vdupq_n_u64(0); }
inline block xor_block(block a, block b) { return veorq_u64(a, b); }
inline block and_block(block a, block b) { return vandq_u64(a, b); }
inline uint64_t low64(block a) { return vgetq_lane_u64(a, 0); }
inline uint64_t high64(block a) { return vgetq_lane_u64(a, 1); }
inline bool equal_block(block a, block b) { return low64(a) == low64(b) && high64(a) == high64(b); }
inline block load_block(const void* p) { return vld1q_u64((const uint64_t*)p); }
inline void store_block(void* p, block a) { vst1q_u64((uint64_t*)p, a); }
#endif

// Point-and-permute reads the colour bit from the lowest bit of a label.
inline bool lsb(block a) { return (low64(a) & 1) != 0; }

// All-ones when bit is set, zero otherwise: selects a block without a branch.
inline block select_mask(bool bit) {
  uint64_t m = 0 - (uint64_t)bit;
  return make_block(m, m);
}

// A growable array of blocks, 64-byte aligned. (std::vector<__m128i> would
// drop the vector type's alignment attribute, which GCC warns about.)
class BlockVector {
 public:
  BlockVector() = default;
  explicit BlockVector(size_t n) { resize(n); }
  BlockVector(const BlockVector& o) { *this = o; }
  BlockVector(BlockVector&& o) noexcept { swap(o); }
  BlockVector& operator=(const BlockVector& o) {
    if (this != &o) {
      resize(o.size_);
      if (o.size_) std::memcpy(data_, o.data_, o.size_ * sizeof(block));
    }
    return *this;
  }
  BlockVector& operator=(BlockVector&& o) noexcept {
    swap(o);
    return *this;
  }
  ~BlockVector() { std::free(data_); }

  // New elements are zero; existing ones are kept.
  void resize(size_t n) {
    const size_t old = size_;
    resize_for_overwrite(n);
    if (n > old) std::memset((void*)(data_ + old), 0, (n - old) * sizeof(block));
  }
  // As resize, but new elements are left unset: for a caller that writes every one of them
  // before it reads any (saves a pass over memory on large temporaries).
  void resize_for_overwrite(size_t n) {
    if (n > capacity_) {
      size_t bytes = (n * sizeof(block) + 63) / 64 * 64;
      block* p = static_cast<block*>(std::aligned_alloc(64, bytes));
      if (!p) throw std::bad_alloc();
      if (size_) std::memcpy(p, data_, size_ * sizeof(block));
      std::free(data_);
      data_ = p;
      capacity_ = n;
    }
    size_ = n;
  }
  void fill(size_t from, size_t to, block v) {
    for (size_t i = from; i < to; ++i) data_[i] = v;
  }
  block* data() { return data_; }
  const block* data() const { return data_; }
  size_t size() const { return size_; }
  block& operator[](size_t i) { return data_[i]; }
  const block& operator[](size_t i) const { return data_[i]; }
  void swap(BlockVector& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
  }

 private:
  block* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace gc
