#include "garbled_core/halfgates.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "garbled_core/aes.h"
#include "garbled_core/vaes.h"

namespace gc {

namespace {

inline block group_key_material(block salt, uint64_t tweak, uint64_t group, int half) {
  return xor_block(salt, make_block(tweak, (group << 1) | (uint64_t)half));
}

// ---- Portable path: 128-bit AES instructions, 8 blocks per AES call. ----

void garble_group_aes128(const block* a0, const block* b0, block* c0, block* tg, block* te,
                         block delta, block salt, uint64_t tweak, uint64_t group) {
  AesKey kg = aes_key(group_key_material(salt, tweak, group, 0));
  AesKey ke = aes_key(group_key_material(salt, tweak, group, 1));
  block a[8], b[8], x0[8], x1[8], y0[8], y1[8];
  for (int j = 0; j < 8; ++j) {
    a[j] = a0[j];
    b[j] = b0[j];
    x0[j] = a[j];
    x1[j] = xor_block(a[j], delta);
    y0[j] = b[j];
    y1[j] = xor_block(b[j], delta);
  }
  aes_encrypt_blocks<8>(kg, x0);
  aes_encrypt_blocks<8>(kg, x1);
  aes_encrypt_blocks<8>(ke, y0);
  aes_encrypt_blocks<8>(ke, y1);
  for (int j = 0; j < 8; ++j) {
    block ha0 = xor_block(x0[j], a[j]);
    block ha1 = xor_block(x1[j], xor_block(a[j], delta));
    block hb0 = xor_block(y0[j], b[j]);
    block hb1 = xor_block(y1[j], xor_block(b[j], delta));
    block pa = select_mask(lsb(a[j]));
    block pb = select_mask(lsb(b[j]));
    block t_g = xor_block(xor_block(ha0, ha1), and_block(pb, delta));
    block w_g = xor_block(ha0, and_block(pa, t_g));
    block t_e = xor_block(xor_block(hb0, hb1), a[j]);
    block w_e = xor_block(hb0, and_block(pb, xor_block(t_e, a[j])));
    tg[j] = t_g;
    te[j] = t_e;
    c0[j] = xor_block(w_g, w_e);
  }
}

void eval_group_aes128(const block* a_in, const block* b_in, block* c, const block* tg,
                       const block* te, block salt, uint64_t tweak, uint64_t group) {
  AesKey kg = aes_key(group_key_material(salt, tweak, group, 0));
  AesKey ke = aes_key(group_key_material(salt, tweak, group, 1));
  block a[8], b[8], x[8], y[8];
  for (int j = 0; j < 8; ++j) {
    a[j] = a_in[j];
    b[j] = b_in[j];
    x[j] = a[j];
    y[j] = b[j];
  }
  aes_encrypt_blocks<8>(kg, x);
  aes_encrypt_blocks<8>(ke, y);
  for (int j = 0; j < 8; ++j) {
    block w_g = xor_block(xor_block(x[j], a[j]), and_block(select_mask(lsb(a[j])), tg[j]));
    block w_e = xor_block(xor_block(y[j], b[j]),
                          and_block(select_mask(lsb(b[j])), xor_block(te[j], a[j])));
    c[j] = xor_block(w_g, w_e);
  }
}

// Runs a group kernel over a span; a short last group goes through padded
// copies so the kernels always see 8 instances.
template <typename GroupFn>
inline void garble_span(GroupFn group_fn, const block* a0, const block* b0, block* c0,
                        block* tables, size_t n, uint64_t first_instance, block delta, block salt,
                        uint64_t tweak) {
  uint64_t group = first_instance / kHashGroup;
  size_t i = 0;
  for (; i + 8 <= n; i += 8, ++group, tables += 16)
    group_fn(a0 + i, b0 + i, c0 + i, tables, tables + 8, delta, salt, tweak, group);
  if (i < n) {
    size_t m = n - i;
    block pa[8] = {}, pb[8] = {}, pc[8], ptg[8], pte[8];
    std::memcpy(pa, a0 + i, m * sizeof(block));
    std::memcpy(pb, b0 + i, m * sizeof(block));
    group_fn(pa, pb, pc, ptg, pte, delta, salt, tweak, group);
    std::memcpy(c0 + i, pc, m * sizeof(block));
    std::memcpy(tables, ptg, m * sizeof(block));
    std::memcpy(tables + m, pte, m * sizeof(block));
  }
}

template <typename GroupFn>
inline void eval_span(GroupFn group_fn, const block* a, const block* b, block* c,
                      const block* tables, size_t n, uint64_t first_instance, block salt,
                      uint64_t tweak) {
  uint64_t group = first_instance / kHashGroup;
  size_t i = 0;
  for (; i + 8 <= n; i += 8, ++group, tables += 16)
    group_fn(a + i, b + i, c + i, tables, tables + 8, salt, tweak, group);
  if (i < n) {
    size_t m = n - i;
    block pa[8] = {}, pb[8] = {}, pc[8], ptg[8] = {}, pte[8] = {};
    std::memcpy(pa, a + i, m * sizeof(block));
    std::memcpy(pb, b + i, m * sizeof(block));
    std::memcpy(ptg, tables, m * sizeof(block));
    std::memcpy(pte, tables + m, m * sizeof(block));
    group_fn(pa, pb, pc, ptg, pte, salt, tweak, group);
    std::memcpy(c + i, pc, m * sizeof(block));
  }
}

void garble_and_aes128(const block* a0, const block* b0, block* c0, block* tables, size_t n,
                       uint64_t first_instance, block delta, block salt, uint64_t tweak) {
  garble_span(garble_group_aes128, a0, b0, c0, tables, n, first_instance, delta, salt, tweak);
}

void eval_and_aes128(const block* a, const block* b, block* c, const block* tables, size_t n,
                     uint64_t first_instance, block salt, uint64_t tweak) {
  eval_span(eval_group_aes128, a, b, c, tables, n, first_instance, salt, tweak);
}

#if GC_X86
// ---- VAES + AVX-512 path: 4 blocks per AES instruction. ----
// Works on 16 instances (two hash groups) at a time, so the four AES keys
// they need (2 groups x 2 halves) are expanded together in one register.
constexpr size_t kVaesSpan = 2 * kHashGroup;  // instances per VAES kernel call

// Key material of groups g and g + 1, lanes: (g, garbler half), (g, evaluator
// half), (g + 1, garbler half), (g + 1, evaluator half).
GC_VAES_TARGET inline __m512i zkey_material(block salt, uint64_t tweak, uint64_t group) {
  __m512i m = _mm512_set_epi64((long long)tweak, (long long)(((group + 1) << 1) | 1),
                               (long long)tweak, (long long)((group + 1) << 1),
                               (long long)tweak, (long long)((group << 1) | 1),
                               (long long)tweak, (long long)(group << 1));
  return _mm512_xor_si512(m, _mm512_maskz_broadcast_i32x4(0xffff, salt));
}

// Encrypts x[0..3] under the key in lane LG and x[4..7] under lane LE,
// for the two hash groups (x[8..15] under lanes 2 and 3).
template <int PerKey>
GC_VAES_TARGET inline void zencrypt4(const __m512i* rk, __m512i* x) {
  for (int i = 0; i < 4 * PerKey; ++i) {
    int lane = i / PerKey;
    __m512i k = lane == 0 ? zlane<0>(rk[0]) : lane == 1 ? zlane<1>(rk[0]) : lane == 2 ? zlane<2>(rk[0]) : zlane<3>(rk[0]);
    x[i] = _mm512_xor_si512(x[i], k);
  }
  for (int r = 1; r < 10; ++r) {
    __m512i k0 = zlane<0>(rk[r]), k1 = zlane<1>(rk[r]), k2 = zlane<2>(rk[r]), k3 = zlane<3>(rk[r]);
    for (int i = 0; i < PerKey; ++i) x[i] = _mm512_aesenc_epi128(x[i], k0);
    for (int i = 0; i < PerKey; ++i) x[PerKey + i] = _mm512_aesenc_epi128(x[PerKey + i], k1);
    for (int i = 0; i < PerKey; ++i) x[2 * PerKey + i] = _mm512_aesenc_epi128(x[2 * PerKey + i], k2);
    for (int i = 0; i < PerKey; ++i) x[3 * PerKey + i] = _mm512_aesenc_epi128(x[3 * PerKey + i], k3);
  }
  __m512i k0 = zlane<0>(rk[10]), k1 = zlane<1>(rk[10]), k2 = zlane<2>(rk[10]), k3 = zlane<3>(rk[10]);
  for (int i = 0; i < PerKey; ++i) x[i] = _mm512_aesenclast_epi128(x[i], k0);
  for (int i = 0; i < PerKey; ++i) x[PerKey + i] = _mm512_aesenclast_epi128(x[PerKey + i], k1);
  for (int i = 0; i < PerKey; ++i) x[2 * PerKey + i] = _mm512_aesenclast_epi128(x[2 * PerKey + i], k2);
  for (int i = 0; i < PerKey; ++i) x[3 * PerKey + i] = _mm512_aesenclast_epi128(x[3 * PerKey + i], k3);
}

// 16 instances; tables: per group, 8 garbler-half rows then 8 evaluator-half rows.
GC_VAES_TARGET void garble_16_vaes(const block* a0, const block* b0, block* c0, block* tables,
                                   block delta, block salt, uint64_t tweak, uint64_t group) {
  __m512i rk[11];
  zexpand4(zkey_material(salt, tweak, group), rk);
  const __m512i d = _mm512_maskz_broadcast_i32x4(0xffff, delta);
  __m512i a[4], b[4], x[16];
  for (int k = 0; k < 4; ++k) {
    a[k] = _mm512_loadu_si512((const void*)(a0 + 4 * k));
    b[k] = _mm512_loadu_si512((const void*)(b0 + 4 * k));
  }
  // Key lanes: 0 = (g, garbler half) gets A and A^D of group g, and so on.
  for (int h = 0; h < 2; ++h) {  // group within the 16
    x[8 * h + 0] = a[2 * h];
    x[8 * h + 1] = a[2 * h + 1];
    x[8 * h + 2] = _mm512_xor_si512(a[2 * h], d);
    x[8 * h + 3] = _mm512_xor_si512(a[2 * h + 1], d);
    x[8 * h + 4] = b[2 * h];
    x[8 * h + 5] = b[2 * h + 1];
    x[8 * h + 6] = _mm512_xor_si512(b[2 * h], d);
    x[8 * h + 7] = _mm512_xor_si512(b[2 * h + 1], d);
  }
  zencrypt4<4>(rk, x);
  for (int h = 0; h < 2; ++h) {
    block* tg = tables + 16 * h;
    block* te = tg + 8;
    for (int k = 0; k < 2; ++k) {
      __m512i av = a[2 * h + k], bv = b[2 * h + k];
      __m512i ha0 = _mm512_xor_si512(x[8 * h + k], av);
      __m512i ha1 = _mm512_xor_si512(x[8 * h + 2 + k], _mm512_xor_si512(av, d));
      __m512i hb0 = _mm512_xor_si512(x[8 * h + 4 + k], bv);
      __m512i hb1 = _mm512_xor_si512(x[8 * h + 6 + k], _mm512_xor_si512(bv, d));
      __m512i pa = zlsb_mask(av), pb = zlsb_mask(bv);
      __m512i t_g = _mm512_xor_si512(_mm512_xor_si512(ha0, ha1), _mm512_and_si512(pb, d));
      __m512i w_g = _mm512_xor_si512(ha0, _mm512_and_si512(pa, t_g));
      __m512i t_e = _mm512_xor_si512(_mm512_xor_si512(hb0, hb1), av);
      __m512i w_e = _mm512_xor_si512(hb0, _mm512_and_si512(pb, _mm512_xor_si512(t_e, av)));
      _mm512_storeu_si512((void*)(tg + 4 * k), t_g);
      _mm512_storeu_si512((void*)(te + 4 * k), t_e);
      _mm512_storeu_si512((void*)(c0 + 8 * h + 4 * k), _mm512_xor_si512(w_g, w_e));
    }
  }
}

GC_VAES_TARGET void eval_16_vaes(const block* a_in, const block* b_in, block* c, const block* tables,
                                 block salt, uint64_t tweak, uint64_t group) {
  __m512i rk[11];
  zexpand4(zkey_material(salt, tweak, group), rk);
  __m512i a[4], b[4], x[8];
  for (int k = 0; k < 4; ++k) {
    a[k] = _mm512_loadu_si512((const void*)(a_in + 4 * k));
    b[k] = _mm512_loadu_si512((const void*)(b_in + 4 * k));
  }
  for (int h = 0; h < 2; ++h) {
    x[4 * h + 0] = a[2 * h];
    x[4 * h + 1] = a[2 * h + 1];
    x[4 * h + 2] = b[2 * h];
    x[4 * h + 3] = b[2 * h + 1];
  }
  zencrypt4<2>(rk, x);
  for (int h = 0; h < 2; ++h) {
    const block* tg = tables + 16 * h;
    const block* te = tg + 8;
    for (int k = 0; k < 2; ++k) {
      __m512i av = a[2 * h + k], bv = b[2 * h + k];
      __m512i t_g = _mm512_loadu_si512((const void*)(tg + 4 * k));
      __m512i t_e = _mm512_loadu_si512((const void*)(te + 4 * k));
      __m512i w_g = _mm512_xor_si512(_mm512_xor_si512(x[4 * h + k], av),
                                     _mm512_and_si512(zlsb_mask(av), t_g));
      __m512i w_e = _mm512_xor_si512(_mm512_xor_si512(x[4 * h + 2 + k], bv),
                                     _mm512_and_si512(zlsb_mask(bv), _mm512_xor_si512(t_e, av)));
      _mm512_storeu_si512((void*)(c + 8 * h + 4 * k), _mm512_xor_si512(w_g, w_e));
    }
  }
}

GC_VAES_TARGET void garble_and_vaes(const block* a0, const block* b0, block* c0, block* tables,
                                    size_t n, uint64_t first_instance, block delta, block salt,
                                    uint64_t tweak) {
  uint64_t group = first_instance / kHashGroup;
  size_t i = 0;
  for (; i + kVaesSpan <= n; i += kVaesSpan, group += 2, tables += 2 * kVaesSpan)
    garble_16_vaes(a0 + i, b0 + i, c0 + i, tables, delta, salt, tweak, group);
  if (i < n) {
    // Short tail: padded copies; a group's rows are as many as its instances.
    size_t m = n - i;
    block pa[16] = {}, pb[16] = {}, pc[16], pt[32];
    std::memcpy(pa, a0 + i, m * sizeof(block));
    std::memcpy(pb, b0 + i, m * sizeof(block));
    garble_16_vaes(pa, pb, pc, pt, delta, salt, tweak, group);
    std::memcpy(c0 + i, pc, m * sizeof(block));
    for (size_t h = 0; h * kHashGroup < m; ++h) {
      size_t rows = std::min(kHashGroup, m - h * kHashGroup);
      std::memcpy(tables, pt + 16 * h, rows * sizeof(block));
      std::memcpy(tables + rows, pt + 16 * h + 8, rows * sizeof(block));
      tables += 2 * rows;
    }
  }
}

GC_VAES_TARGET void eval_and_vaes(const block* a, const block* b, block* c, const block* tables,
                                  size_t n, uint64_t first_instance, block salt, uint64_t tweak) {
  uint64_t group = first_instance / kHashGroup;
  size_t i = 0;
  for (; i + kVaesSpan <= n; i += kVaesSpan, group += 2, tables += 2 * kVaesSpan)
    eval_16_vaes(a + i, b + i, c + i, tables, salt, tweak, group);
  if (i < n) {
    size_t m = n - i;
    block pa[16] = {}, pb[16] = {}, pc[16], pt[32] = {};
    std::memcpy(pa, a + i, m * sizeof(block));
    std::memcpy(pb, b + i, m * sizeof(block));
    for (size_t h = 0; h * kHashGroup < m; ++h) {
      size_t rows = std::min(kHashGroup, m - h * kHashGroup);
      std::memcpy(pt + 16 * h, tables, rows * sizeof(block));
      std::memcpy(pt + 16 * h + 8, tables + rows, rows * sizeof(block));
      tables += 2 * rows;
    }
    eval_16_vaes(pa, pb, pc, pt, salt, tweak, group);
    std::memcpy(c + i, pc, m * sizeof(block));
  }
}

#endif

const AndKernels kAes128Kernels = {"aesni", false, garble_and_aes128, eval_and_aes128};
#if GC_X86
const AndKernels kVaesKernels = {"vaes", true, garble_and_vaes, eval_and_vaes};
#endif

const AndKernels* initial_kernels() {
#if GC_X86
  const char* force = std::getenv("SPGC_GC_KERNEL");
  if (force && std::strcmp(force, "aesni") == 0) return &kAes128Kernels;
  if (cpu_has_vaes()) return &kVaesKernels;
#endif
  return &kAes128Kernels;
}

const AndKernels* g_kernels = initial_kernels();

}  // namespace

const AndKernels& and_kernels() { return *g_kernels; }

const char* const* available_and_kernels() {
#if GC_X86
  static const char* with_vaes[] = {"aesni", "vaes", nullptr};
  static const char* without[] = {"aesni", nullptr};
  return cpu_has_vaes() ? with_vaes : without;
#else
  static const char* arm[] = {"aesni", nullptr};  // the 128-bit AES path (ARMv8 AESE/AESMC)
  return arm;
#endif
}

bool select_and_kernels(const char* name) {
  if (std::strcmp(name, "aesni") == 0) {
    g_kernels = &kAes128Kernels;
    return true;
  }
#if GC_X86
  if (std::strcmp(name, "vaes") == 0 && cpu_has_vaes()) {
    g_kernels = &kVaesKernels;
    return true;
  }
#endif
  return false;
}

}  // namespace gc
