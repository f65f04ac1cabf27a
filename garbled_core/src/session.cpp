#include "garbled_core/session.h"

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "garbled_core/halfgates.h"
#include "garbled_core/threehalves.h"
#include "garbled_core/random.h"
#include "garbled_core/sha256.h"
#include "garbled_core/vaes.h"

namespace gc {

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

namespace {

// 3: the hello names the garbling scheme and ot_k; 4: the run header names the chunk size and
// a chunk's decoding bits precede its tables.
constexpr uint32_t kProtocolVersion = 4;
constexpr char kGarblerHello[8] = {'S', 'P', 'G', 'C', 'G', 'C', '-', 'G'};
constexpr char kEvaluatorHello[8] = {'S', 'P', 'G', 'C', 'G', 'C', '-', 'E'};

size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

inline bool packed_bit(const uint8_t* bits, size_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

// The per-chunk loops over rows of labels: a portable form and an AVX-512 form (x86, compiled
// through target attributes, used when the engine runs its VAES kernels). Both give the same
// results; out may alias an input row.
struct RowOps {
  // out[i] = a[i] ^ b[i]
  void (*xor_rows)(block* out, const block* a, const block* b, size_t n);
  // out[i] = a[i] ^ d
  void (*xor_const)(block* out, const block* a, block d, size_t n);
  // out[i] = a[i] ^ (bit `bit` of v[i] ? d : 0)
  void (*select_xor)(block* out, const block* a, const uint64_t* v, int bit, block d, size_t n);
  // dst[i] ^= (lsb(labels[i]) ^ bit i of flip) << bit; flip may be null
  void (*lsbs_to_values)(uint64_t* dst, const block* labels, const uint8_t* flip, int bit,
                         size_t n);
  // dst[i] ^= (bit i of bits) << bit
  void (*bits_to_values)(uint64_t* dst, const uint8_t* bits, int bit, size_t n);
  // The colour bits of n labels, LSB first, ceil(n / 8) bytes.
  void (*pack_lsbs)(const block* labels, size_t n, uint8_t* out);
};

void xor_rows_portable(block* out, const block* a, const block* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = xor_block(a[i], b[i]);
}
void xor_const_portable(block* out, const block* a, block d, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = xor_block(a[i], d);
}
void select_xor_portable(block* out, const block* a, const uint64_t* v, int bit, block d,
                         size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = xor_block(a[i], and_block(select_mask((v[i] >> bit) & 1), d));
}
void lsbs_to_values_portable(uint64_t* dst, const block* labels, const uint8_t* flip, int bit,
                             size_t n) {
  for (size_t i = 0; i < n; ++i)
    dst[i] ^= (uint64_t)(lsb(labels[i]) ^ (flip ? packed_bit(flip, i) : false)) << bit;
}
void bits_to_values_portable(uint64_t* dst, const uint8_t* bits, int bit, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] ^= (uint64_t)packed_bit(bits, i) << bit;
}
void pack_lsbs_portable(const block* labels, size_t n, uint8_t* out) {
  std::memset(out, 0, (n + 7) / 8);
  for (size_t i = 0; i < n; ++i) out[i >> 3] |= (uint8_t)(lsb(labels[i]) << (i & 7));
}

#if GC_X86
GC_VAES_TARGET void xor_rows_avx512(block* out, const block* a, const block* b, size_t n) {
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm512_storeu_si512((void*)(out + i), _mm512_xor_si512(_mm512_loadu_si512((const void*)(a + i)),
                                                           _mm512_loadu_si512((const void*)(b + i))));
  xor_rows_portable(out + i, a + i, b + i, n - i);
}

GC_VAES_TARGET void xor_const_avx512(block* out, const block* a, block d, size_t n) {
  const __m512i dd = _mm512_maskz_broadcast_i32x4(0xffff, d);
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    _mm512_storeu_si512((void*)(out + i), _mm512_xor_si512(_mm512_loadu_si512((const void*)(a + i)), dd));
  xor_const_portable(out + i, a + i, d, n - i);
}

GC_VAES_TARGET void select_xor_avx512(block* out, const block* a, const uint64_t* v, int bit,
                                      block d, size_t n) {
  const __m512i dd = _mm512_maskz_broadcast_i32x4(0xffff, d);
  const __m512i pick = _mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0);  // value i in both qwords
  const __m512i sel = _mm512_set1_epi64((long long)((uint64_t)1 << bit));
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m512i vals =
        _mm512_maskz_permutexvar_epi64(0xff, pick, _mm512_maskz_loadu_epi64(0x0f, v + i));
    const __m512i x = _mm512_loadu_si512((const void*)(a + i));
    _mm512_storeu_si512((void*)(out + i),
                        _mm512_mask_xor_epi64(x, _mm512_test_epi64_mask(vals, sel), x, dd));
  }
  select_xor_portable(out + i, a + i, v + i, bit, d, n - i);
}

// The low qwords of labels[0..7] in one register.
GC_VAES_TARGET inline __m512i low_qwords8(const block* labels) {
  return _mm512_maskz_permutex2var_epi64(0xff, _mm512_loadu_si512((const void*)labels),
                                         _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0),
                                         _mm512_loadu_si512((const void*)(labels + 4)));
}

GC_VAES_TARGET void lsbs_to_values_avx512(uint64_t* dst, const block* labels, const uint8_t* flip,
                                          int bit, size_t n) {
  const __m512i one = _mm512_set1_epi64(1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m512i b = _mm512_and_si512(low_qwords8(labels + i), one);
    if (flip) b = _mm512_mask_xor_epi64(b, (__mmask8)flip[i / 8], b, one);
    const __m512i x = _mm512_loadu_si512((const void*)(dst + i));
    _mm512_storeu_si512((void*)(dst + i), _mm512_xor_si512(x, _mm512_maskz_slli_epi64(0xff, b, (unsigned)bit)));
  }
  for (; i < n; ++i)
    dst[i] ^= (uint64_t)(lsb(labels[i]) ^ (flip ? packed_bit(flip, i) : false)) << bit;
}

GC_VAES_TARGET void bits_to_values_avx512(uint64_t* dst, const uint8_t* bits, int bit, size_t n) {
  const __m512i sel = _mm512_set1_epi64((long long)((uint64_t)1 << bit));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512i x = _mm512_loadu_si512((const void*)(dst + i));
    _mm512_storeu_si512((void*)(dst + i), _mm512_mask_xor_epi64(x, (__mmask8)bits[i / 8], x, sel));
  }
  for (; i < n; ++i) dst[i] ^= (uint64_t)packed_bit(bits, i) << bit;
}

GC_VAES_TARGET void pack_lsbs_avx512(const block* labels, size_t n, uint8_t* out) {
  const __m512i one = _mm512_set1_epi64(1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) out[i / 8] = (uint8_t)_mm512_test_epi64_mask(low_qwords8(labels + i), one);
  if (i < n) pack_lsbs_portable(labels + i, n - i, out + i / 8);
}
#endif

#if GC_X86
// Blocks counter .. counter + n - 1 of an AES-CTR stream (Prg's layout), n a multiple of 16.
GC_VAES_TARGET void prg_blocks_avx512(const AesKey& key, uint64_t counter, block* out, size_t n) {
  __m512i rk[11];
  for (int r = 0; r < 11; ++r) rk[r] = _mm512_maskz_broadcast_i32x4(0xffff, key.rk[r]);
  const __m512i step = _mm512_set_epi64(0, 16, 0, 16, 0, 16, 0, 16);
  const long long c = (long long)counter;
  __m512i ctr[4];
  for (int v = 0; v < 4; ++v)
    ctr[v] = _mm512_set_epi64(0, c + 4 * v + 3, 0, c + 4 * v + 2, 0, c + 4 * v + 1, 0, c + 4 * v);
  for (size_t i = 0; i < n; i += 16) {
    __m512i x[4];
    for (int v = 0; v < 4; ++v) x[v] = _mm512_xor_si512(ctr[v], rk[0]);
    for (int r = 1; r < 10; ++r)
      for (int v = 0; v < 4; ++v) x[v] = _mm512_aesenc_epi128(x[v], rk[r]);
    for (int v = 0; v < 4; ++v) {
      _mm512_storeu_si512((void*)(out + i + 4 * v), _mm512_aesenclast_epi128(x[v], rk[10]));
      ctr[v] = _mm512_add_epi64(ctr[v], step);
    }
  }
}
#endif

// prg.fill(out, n), 16 blocks at a time in AVX-512 on the VAES path.
void prg_fill(Prg& prg, block* out, size_t n) {
#if GC_X86
  const size_t wide = n / 16 * 16;
  if (wide && and_kernels().wide) {
    prg_blocks_avx512(prg.key(), prg.counter(), out, wide);
    prg.advance(wide);
    out += wide;
    n -= wide;
  }
#endif
  prg.fill(out, n);
}

const RowOps& row_ops() {
  static const RowOps portable{xor_rows_portable,       xor_const_portable,
                               select_xor_portable,     lsbs_to_values_portable,
                               bits_to_values_portable, pack_lsbs_portable};
#if GC_X86
  static const RowOps wide{xor_rows_avx512,       xor_const_avx512,      select_xor_avx512,
                           lsbs_to_values_avx512, bits_to_values_avx512, pack_lsbs_avx512};
  if (and_kernels().wide) return wide;
#endif
  return portable;
}

// Runs the gates of one chunk. The garbler passes delta, the tables to fill
// and (three-halves) a PRG for the per-gate coins; the evaluator passes the
// tables it received.
void garble_gates(const Circuit& c, Scheme scheme, block* wires, size_t cap, size_t cn,
                  uint64_t first_instance, block delta, block salt, uint32_t run_id,
                  uint8_t* tables, Prg* coin_prg) {
  const AndKernels& kernels = and_kernels();
  const RowOps& ops = row_ops();
  const size_t table_bytes = and_table_bytes(scheme, cn);
  BlockVector coins(scheme == Scheme::ThreeHalves ? (cn + 63) / 64 : 0);
  std::optional<ThreeHalvesDelta> th_delta;
  if (scheme == Scheme::ThreeHalves) th_delta.emplace(delta);
  for (const SlotGate& g : c.gates()) {
    const block* a = wires + (size_t)g.a * cap;
    const block* b = wires + (size_t)g.b * cap;
    block* out = wires + (size_t)g.out * cap;
    switch (g.op) {
      case GateOp::Xor:
        ops.xor_rows(out, a, b, cn);
        break;
      case GateOp::Not:  // free: the zero-label becomes the old one-label
        ops.xor_const(out, a, delta, cn);
        break;
      case GateOp::And:
        if (scheme == Scheme::ThreeHalves) {
          coin_prg->fill(coins.data(), coins.size());
          garble_and_threehalves(a, b, out, tables, cn, first_instance, *th_delta, salt,
                                 gate_tweak(run_id, g.and_index),
                                 reinterpret_cast<const uint8_t*>(coins.data()));
        } else {
          kernels.garble(a, b, out, reinterpret_cast<block*>(tables), cn, first_instance, delta,
                         salt, gate_tweak(run_id, g.and_index));
        }
        tables += table_bytes;
        break;
    }
  }
}

void evaluate_gates(const Circuit& c, Scheme scheme, block* wires, size_t cap, size_t cn,
                    uint64_t first_instance, block salt, uint32_t run_id, const uint8_t* tables) {
  const AndKernels& kernels = and_kernels();
  const RowOps& ops = row_ops();
  const size_t table_bytes = and_table_bytes(scheme, cn);
  for (const SlotGate& g : c.gates()) {
    const block* a = wires + (size_t)g.a * cap;
    const block* b = wires + (size_t)g.b * cap;
    block* out = wires + (size_t)g.out * cap;
    switch (g.op) {
      case GateOp::Xor:
        ops.xor_rows(out, a, b, cn);
        break;
      case GateOp::Not:  // the evaluator's label already means the negated value
        if (out != a) std::memcpy(out, a, cn * sizeof(block));
        break;
      case GateOp::And:
        if (scheme == Scheme::ThreeHalves)
          eval_and_threehalves(a, b, out, tables, cn, first_instance, salt,
                               gate_tweak(run_id, g.and_index));
        else
          kernels.eval(a, b, out, reinterpret_cast<const block*>(tables), cn, first_instance, salt,
                       gate_tweak(run_id, g.and_index));
        tables += table_bytes;
        break;
    }
  }
}

// The chunk a run uses: the option rounded up to a whole hash group.
size_t plan_chunk(const SessionOptions& opt) {
  return std::max<size_t>(kHashGroup, round_up(opt.chunk, kHashGroup));
}

// Per-party layout of one run: which input bits come from where.
struct RunPlan {
  size_t n = 0, chunk = 0, chunks = 0;
  uint64_t garbler_bits = 0, evaluator_bits = 0;
  std::vector<uint64_t> bit_offset;  // per input port: first row in its owner's label table
  std::vector<size_t> reveal_to_evaluator, reveal_to_garbler;  // output ports needing decoding
  size_t evaluator_rows = 0, garbler_rows = 0;                 // output bits needing decoding

  size_t start(size_t c) const { return c * chunk; }
  size_t count(size_t c) const { return std::min(chunk, n - c * chunk); }
  // OTs for the evaluator's inputs of chunk c: one per input bit, padded to 128.
  size_t ots(size_t c) const { return round_up(evaluator_bits * count(c), 128); }
};

RunPlan plan_run(const Circuit& c, size_t n, const SessionOptions& opt) {
  RunPlan p;
  p.n = n;
  p.chunk = plan_chunk(opt);
  p.chunks = (n + p.chunk - 1) / p.chunk;
  for (auto& port : c.inputs()) {
    if (port.owner == InputOwner::Garbler) {
      p.bit_offset.push_back(p.garbler_bits);
      p.garbler_bits += (uint64_t)port.width;
    } else if (port.owner == InputOwner::Evaluator) {
      p.bit_offset.push_back(p.evaluator_bits);
      p.evaluator_bits += (uint64_t)port.width;
    } else {
      p.bit_offset.push_back(0);
    }
  }
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    Reveal r = c.outputs()[o].reveal;
    size_t w = c.outputs()[o].wires.size();
    if (r == Reveal::Both || r == Reveal::Evaluator) {
      p.reveal_to_evaluator.push_back(o);
      p.evaluator_rows += w;
    }
    if (r == Reveal::Both || r == Reveal::Garbler) {
      p.reveal_to_garbler.push_back(o);
      p.garbler_rows += w;
    }
  }
  return p;
}

// Loads the labels of carried inputs (and of the constant wire) for a chunk.
void load_carried(const Circuit& c, const RunInputs& in, block* wires, size_t cap, size_t start,
                  size_t cn) {
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    if (c.inputs()[p].owner != InputOwner::Carried) continue;
    const CarriedInput& src = in.carried[p];
    const KeptLabels& kept = *src.source;
    for (int k = 0; k < c.inputs()[p].width; ++k) {
      block* dst = wires + (size_t)c.input_slots()[p][k] * cap;
      const block* row = kept.labels.data() + (size_t)k * kept.n;
      if (src.indices.empty()) {
        std::memcpy(dst, row + start, cn * sizeof(block));
      } else {
        for (size_t i = 0; i < cn; ++i) dst[i] = row[src.indices[start + i]];
      }
    }
  }
}

void store_kept(const Circuit& c, RunOutputs& out, const block* wires, size_t cap, size_t start,
                size_t cn) {
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    if (!out.kept[o]) continue;
    KeptLabels& kept = *out.kept[o];
    const auto& slots = c.outputs()[o].slots;
    for (size_t k = 0; k < slots.size(); ++k)
      std::memcpy(kept.labels.data() + k * kept.n + start, wires + (size_t)slots[k] * cap,
                  cn * sizeof(block));
  }
}

}  // namespace

Session::Session(Channel& ch, SessionOptions options) : ch_(ch), options_(options) {}

void Session::check_inputs(const Circuit& c, const RunInputs& in, InputOwner self) const {
  if (in.values.size() != c.inputs().size() || in.carried.size() != c.inputs().size())
    throw std::invalid_argument("run: inputs do not match the circuit's ports");
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    const InputPort& port = c.inputs()[p];
    if (port.owner == self && !in.values[p] && in.n > 0)
      throw std::invalid_argument("run: missing input '" + port.name + "'");
    if (port.owner == InputOwner::Carried) {
      const CarriedInput& src = in.carried[p];
      if (!src.source) throw std::invalid_argument("run: missing carried input '" + port.name + "'");
      if (src.source->session_id != session_id_)
        throw std::invalid_argument("run: carried input '" + port.name + "' comes from another session");
      if (src.source->width != port.width)
        throw std::invalid_argument("run: carried input '" + port.name + "' has width " +
                                    std::to_string(src.source->width) + ", the circuit expects " +
                                    std::to_string(port.width));
      if (src.indices.empty()) {
        if (src.source->n != in.n)
          throw std::invalid_argument("run: carried input '" + port.name + "' holds " +
                                      std::to_string(src.source->n) + " instances, the run has " +
                                      std::to_string(in.n));
      } else {
        if (src.indices.size() != in.n)
          throw std::invalid_argument("run: carried input '" + port.name + "' selects " +
                                      std::to_string(src.indices.size()) +
                                      " instances, the run has " + std::to_string(in.n));
        for (uint64_t idx : src.indices)
          if (idx >= src.source->n)
            throw std::invalid_argument("run: carried input '" + port.name + "' selects instance " +
                                        std::to_string(idx) + " of " +
                                        std::to_string(src.source->n));
      }
    }
  }
}

std::array<uint8_t, 32> Session::carried_digest(const Circuit& c, const RunInputs& in) const {
  Sha256 h;
  for (size_t p = 0; p < c.inputs().size(); ++p) {
    if (c.inputs()[p].owner != InputOwner::Carried) continue;
    const CarriedInput& src = in.carried[p];
    uint64_t fields[3] = {src.source->run_id, src.source->n, src.indices.size()};
    h.update(fields, sizeof(fields));
    h.update(src.source->port.data(), src.source->port.size());
    h.update(src.indices.data(), src.indices.size() * sizeof(uint64_t));
  }
  return h.digest();
}

// Both parties name their role and protocol version before anything else, so
// two garblers, two evaluators or a stranger fail with a clear error.
void Session::exchange_hello(bool garbler) {
  ch_.set_phase(Phase::Setup);
  const char* mine = garbler ? kGarblerHello : kEvaluatorHello;
  const char* expected = garbler ? kEvaluatorHello : kGarblerHello;
  uint32_t version = kProtocolVersion, peer_version = 0;
  uint32_t scheme = (uint32_t)options_.scheme, peer_scheme = 0;
  uint32_t ot_k = (uint32_t)options_.ot_k, peer_ot_k = 0;
  ch_.send(mine, 8);
  ch_.send(&version, 4);
  ch_.send(&scheme, 4);
  ch_.send(&ot_k, 4);
  char hello[8];
  ch_.recv(hello, 8);
  ch_.recv(&peer_version, 4);
  ch_.recv(&peer_scheme, 4);
  ch_.recv(&peer_ot_k, 4);
  if (std::memcmp(hello, mine, 8) == 0)
    throw ProtocolError(garbler ? "both parties are garblers: one side must run as the evaluator"
                                : "both parties are evaluators: one side must run as the garbler");
  if (std::memcmp(hello, expected, 8) != 0)
    throw ProtocolError(std::string("the peer is not an SPGC garbled-circuit ") +
                        (garbler ? "evaluator" : "garbler"));
  if (peer_version != kProtocolVersion)
    throw ProtocolError("protocol version mismatch: " + std::to_string(kProtocolVersion) +
                        " here, " + std::to_string(peer_version) + " at the peer");
  if (peer_scheme != scheme)
    throw ProtocolError(std::string("garbling scheme mismatch: ") + scheme_name(options_.scheme) +
                        " here, " +
                        (peer_scheme <= 1 ? scheme_name((Scheme)peer_scheme) : "unknown") +
                        " at the peer (both servers must set the same garbling_scheme)");
  if (peer_ot_k != ot_k)
    throw ProtocolError("OT extension mismatch: ot_k " + std::to_string(ot_k) + " here, " +
                        std::to_string(peer_ot_k) + " at the peer (both servers must set the same ot_k)");
}

// Both parties state what they are about to run; any disagreement stops the
// run on both sides before a single table is sent.
void Session::exchange_header(const Circuit& c, const RunInputs& in) {
  ch_.set_phase(Phase::Setup);
  struct Header {
    uint32_t run_id;
    uint32_t chunk;  // the chunking decides the order of tables and OTs on the wire
    uint64_t n;
    uint8_t circuit[32];
    uint8_t carried[32];
  } mine{}, theirs{};
  mine.run_id = run_id_;
  mine.chunk = (uint32_t)plan_chunk(options_);
  mine.n = in.n;
  const std::array<uint8_t, 32> stated = stated_circuit(c);
  std::memcpy(mine.circuit, stated.data(), 32);
  auto cd = carried_digest(c, in);
  std::memcpy(mine.carried, cd.data(), 32);
  ch_.send(&mine, sizeof(mine));
  ch_.recv(&theirs, sizeof(theirs));
  std::string chunk_problem;
  if (mine.chunk != theirs.chunk)
    chunk_problem = "chunk size mismatch: " + std::to_string(mine.chunk) + " instances here, " +
                    std::to_string(theirs.chunk) +
                    " at the peer (both parties must use the same chunk)";
  check_run_facts(c, {mine.run_id, mine.n, mine.circuit, mine.carried},
                  {theirs.run_id, theirs.n, theirs.circuit, theirs.carried}, chunk_problem);
}

void Session::check_run_facts(const Circuit& c, const RunFacts& mine, const RunFacts& theirs,
                              const std::string& extra) {
  std::string problem;
  if (std::memcmp(mine.circuit, theirs.circuit, 32) != 0)
    problem = "circuit mismatch: this party runs '" + c.name() + "' (" + hex(mine.circuit, 8) +
              "...), the peer a circuit with hash " + hex(theirs.circuit, 8) + "...";
  else if (mine.n != theirs.n)
    problem = "instance count mismatch: " + std::to_string(mine.n) + " here, " +
              std::to_string(theirs.n) + " at the peer";
  else if (!extra.empty())
    problem = extra;
  else if (mine.run_id != theirs.run_id)
    problem = "run counter mismatch: run " + std::to_string(mine.run_id) + " here, " +
              std::to_string(theirs.run_id) + " at the peer";
  else if (std::memcmp(mine.carried, theirs.carried, 32) != 0)
    problem = "carried inputs differ between the parties (source runs or selected instances)";
  if (!problem.empty()) throw ProtocolError(problem);
}

RunOutputs Session::prepare_outputs(const Circuit& c, size_t n, bool garbler) const {
  RunOutputs out;
  out.values.resize(c.outputs().size());
  out.kept.resize(c.outputs().size());
  for (size_t o = 0; o < c.outputs().size(); ++o) {
    const OutputPort& port = c.outputs()[o];
    bool learns = port.reveal == Reveal::Both || port.reveal == Reveal::Shares ||
                  (port.reveal == Reveal::Garbler && garbler) ||
                  (port.reveal == Reveal::Evaluator && !garbler);
    if (learns) out.values[o].assign(n, 0);
    if (port.reveal == Reveal::Keep) out.kept[o] = new_kept(port, n, port.wires.size() * n);
  }
  return out;
}

std::shared_ptr<KeptLabels> Session::new_kept(const OutputPort& port, size_t n, size_t blocks) const {
  auto kept = std::make_shared<KeptLabels>();
  kept->session_id = session_id_;
  kept->run_id = run_id_;
  kept->port = port.name;
  kept->width = (int)port.wires.size();
  kept->n = n;
  kept->labels.resize(blocks);
  return kept;
}

// ---------------------------------------------------------------- garbler

void GarblerSession::setup() {
  if (ready_) return;
  exchange_hello(true);
  // Delta's low bit is 1 so that a label's colour bit flips with its value.
  delta_ = random_delta();
  secure_random(&session_id_, sizeof(session_id_));
  salt_ = random_block();
  const_label_ = random_block();
  block input_seed = random_block();
  ch_.send(&session_id_, 8);
  ch_.send(&salt_, 16);
  ch_.send(&const_label_, 16);
  ch_.send(&input_seed, 16);
  garbler_input_prg_ = std::make_unique<Prg>(input_seed);
  if (options_.ot_k > 0) {
    softspoken_ = std::make_unique<SoftSpokenCotSender>(options_.ot_k);
    softspoken_->setup(ch_, delta_);
  } else {
    iknp_.setup(ch_, delta_);
  }
  ch_.flush();
  ready_ = true;
}

namespace {

// Message order, which lets both parties work at once: the evaluator sends
// the OT matrices of the first L = ot_lookahead(chunk) chunks up front, then
// after evaluating chunk c its colour bits of chunk c and the matrix of chunk
// c + L. The garbler, before chunk c >= L, reads the colour bits of chunk
// c - L and the matrix of chunk c, and reads the last colour bits at the end.
// With worker threads a party handles a wave of up to kMaxSessionThreads chunks at a
// time: inputs and network in chunk order, the gates of the wave's chunks in
// parallel.
constexpr size_t kMinOtLookahead = 4;
static_assert(kMinOtLookahead >= kMaxSessionThreads, "a wave's OT matrices must all be in flight");

size_t ot_lookahead(size_t chunk) {
  return std::max(kMinOtLookahead, (kOtLookaheadInstances + chunk - 1) / chunk);
}

// One chunk's working memory: wire labels by slot, and its garbled tables.
struct ChunkWorkspace {
  BlockVector wires, table_store;  // table_store: the chunk's tables, as bytes
  std::vector<uint8_t> decode;
  std::unique_ptr<Prg> coins;  // garbler, three-halves: fresh coins per gate
  uint8_t* tables() { return reinterpret_cast<uint8_t*>(table_store.data()); }
};

size_t chunk_table_bytes(const Circuit& c, Scheme scheme, size_t cn) {
  return c.and_count() * and_table_bytes(scheme, cn);
}

std::vector<ChunkWorkspace> make_workspaces(const Circuit& c, const RunPlan& plan, size_t count,
                                            block const_label, Scheme scheme, bool garbler) {
  std::vector<ChunkWorkspace> ws(count);
  for (auto& w : ws) {
    w.wires.resize((size_t)c.num_slots() * plan.chunk);
    w.wires.fill(0, plan.chunk, const_label);  // slot 0: the constant-zero wire
    w.table_store.resize((chunk_table_bytes(c, scheme, plan.chunk) + 15) / 16);
    w.decode.resize(plan.evaluator_rows * ((plan.chunk + 7) / 8));
    if (garbler) w.coins = std::make_unique<Prg>(random_block());
  }
  return ws;
}

// Runs f(0..count) on count threads (the caller's included).
template <typename F>
void run_parallel(size_t count, F f) {
  std::vector<std::thread> workers;
  for (size_t j = 1; j < count; ++j) workers.emplace_back(f, j);
  f(0);
  for (auto& t : workers) t.join();
}

size_t wave_size(const SessionOptions& opt) {
  return std::max<size_t>(1, std::min(opt.threads, kMaxSessionThreads));
}

}  // namespace

void GarblerSession::extend_ot(block* q, size_t m) {
  if (softspoken_)
    softspoken_->extend(ch_, q, m);
  else
    iknp_.extend(ch_, q, m);
}

RunOutputs GarblerSession::run(const Circuit& c, const RunInputs& in) {
  setup();
  check_inputs(c, in, InputOwner::Garbler);
  exchange_header(c, in);
  const RunPlan plan = plan_run(c, in.n, options_);
  const size_t cap = plan.chunk, wave = wave_size(options_), lookahead = ot_lookahead(cap);
  RunOutputs out = prepare_outputs(c, in.n, true);
  std::vector<ChunkWorkspace> ws =
      make_workspaces(c, plan, wave, const_label_, options_.scheme, true);
  BlockVector eval_labels(plan.ots(0)), input_labels(plan.garbler_bits * cap);
  std::vector<uint8_t> peer_bits(plan.garbler_rows * ((cap + 7) / 8));

  // The evaluator's colour bits complete the garbler-revealed outputs.
  auto read_peer_bits = [&](size_t k) {
    if (!plan.garbler_rows) return;
    const size_t start = plan.start(k), cn = plan.count(k), row_bytes = (cn + 7) / 8;
    ch_.set_phase(Phase::Outputs);
    ch_.recv(peer_bits.data(), plan.garbler_rows * row_bytes);
    size_t row = 0;
    for (size_t o : plan.reveal_to_garbler)
      for (size_t bit = 0; bit < c.outputs()[o].slots.size(); ++bit, ++row) {
        uint64_t* dst = out.values[o].data() + start;
        const uint8_t* bits = peer_bits.data() + row * row_bytes;
        row_ops().bits_to_values(dst, bits, (int)bit, cn);
      }
  };

  for (size_t first = 0; first < plan.chunks; first += wave) {
    const size_t count = std::min(wave, plan.chunks - first);
    for (size_t j = 0; j < count; ++j) {
      const size_t k = first + j, start = plan.start(k), cn = plan.count(k);
      block* wires = ws[j].wires.data();
      if (k >= lookahead) read_peer_bits(k - lookahead);
      // Evaluator inputs: row r of the OT batch is input bit r, one OT per instance.
      if (plan.ots(k)) {
        eval_labels.resize(plan.ots(k));
        extend_ot(eval_labels.data(), plan.ots(k));
      }
      // Garbler inputs: both parties expand the shared seed; the garbler's
      // zero-label is that block, shifted by Delta where its bit is 1.
      prg_fill(*garbler_input_prg_, input_labels.data(), plan.garbler_bits * cn);
      for (size_t p = 0; p < c.inputs().size(); ++p) {
        const InputPort& port = c.inputs()[p];
        if (port.owner == InputOwner::Carried) continue;
        for (int bit = 0; bit < port.width; ++bit) {
          block* dst = wires + (size_t)c.input_slots()[p][bit] * cap;
          size_t row = (size_t)(plan.bit_offset[p] + bit) * cn;
          if (port.owner == InputOwner::Evaluator) {
            std::memcpy(dst, eval_labels.data() + row, cn * sizeof(block));
          } else {
            row_ops().select_xor(dst, input_labels.data() + row, in.values[p] + start, bit, delta_, cn);
          }
        }
      }
      load_carried(c, in, wires, cap, start, cn);
    }
    run_parallel(count, [&](size_t j) {
      const size_t k = first + j;
      garble_gates(c, options_.scheme, ws[j].wires.data(), cap, plan.count(k), plan.start(k),
                   delta_, salt_, run_id_, ws[j].tables(), ws[j].coins.get());
    });
    for (size_t j = 0; j < count; ++j) {
      const size_t k = first + j, start = plan.start(k), cn = plan.count(k);
      const block* wires = ws[j].wires.data();
      // Decoding bits: the colour of each zero-label tells the evaluator the value. They go
      // first, into the send buffer, so that they leave with the tables in one write.
      size_t row_bytes = (cn + 7) / 8, pos = 0;
      for (size_t o : plan.reveal_to_evaluator)
        for (uint32_t slot : c.outputs()[o].slots) {
          row_ops().pack_lsbs(wires + (size_t)slot * cap, cn, ws[j].decode.data() + pos);
          pos += row_bytes;
        }
      if (pos) {
        ch_.set_phase(Phase::Outputs);
        ch_.send(ws[j].decode.data(), pos);
      }
      ch_.set_phase(Phase::Tables);
      ch_.send(ws[j].tables(), chunk_table_bytes(c, options_.scheme, cn));
      // This party's own view: shares, and its half of garbler-revealed values.
      for (size_t o = 0; o < c.outputs().size(); ++o) {
        const OutputPort& port = c.outputs()[o];
        if (port.reveal != Reveal::Both && port.reveal != Reveal::Garbler && port.reveal != Reveal::Shares)
          continue;
        uint64_t* dst = out.values[o].data() + start;
        for (size_t bit = 0; bit < port.slots.size(); ++bit) {
          const block* labels = wires + (size_t)port.slots[bit] * cap;
          row_ops().lsbs_to_values(dst, labels, nullptr, (int)bit, cn);
        }
      }
      store_kept(c, out, wires, cap, start, cn);
    }
  }
  for (size_t k = plan.chunks > lookahead ? plan.chunks - lookahead : 0; k < plan.chunks; ++k)
    read_peer_bits(k);
  ch_.flush();
  ++run_id_;
  return out;
}

// -------------------------------------------------------------- evaluator

void EvaluatorSession::setup() {
  if (ready_) return;
  exchange_hello(false);
  block input_seed;
  ch_.recv(&session_id_, 8);
  ch_.recv(&salt_, 16);
  ch_.recv(&const_label_, 16);
  ch_.recv(&input_seed, 16);
  garbler_input_prg_ = std::make_unique<Prg>(input_seed);
  if (options_.ot_k > 0) {
    softspoken_ = std::make_unique<SoftSpokenCotReceiver>(options_.ot_k);
    softspoken_->setup(ch_);
  } else {
    iknp_.setup(ch_);
  }
  ch_.flush();
  ready_ = true;
}

void EvaluatorSession::extend_ot(const uint8_t* choices, block* t, size_t m) {
  if (softspoken_)
    softspoken_->extend(ch_, choices, t, m);
  else
    iknp_.extend(ch_, choices, t, m);
}

RunOutputs EvaluatorSession::run(const Circuit& c, const RunInputs& in) {
  setup();
  check_inputs(c, in, InputOwner::Evaluator);
  exchange_header(c, in);
  const RunPlan plan = plan_run(c, in.n, options_);
  const size_t cap = plan.chunk, wave = wave_size(options_), lookahead = ot_lookahead(cap);
  RunOutputs out = prepare_outputs(c, in.n, false);
  std::vector<ChunkWorkspace> ws =
      make_workspaces(c, plan, wave, const_label_, options_.scheme, false);
  BlockVector input_labels(plan.garbler_bits * cap);
  // Labels of the evaluator's inputs for the chunks whose OTs are in flight.
  std::vector<BlockVector> eval_labels(lookahead + 1);
  std::vector<uint8_t> choices, my_bits(plan.garbler_rows * ((cap + 7) / 8));

  auto send_ot = [&](size_t k) {
    const size_t ots = plan.ots(k), start = plan.start(k), cn = plan.count(k);
    if (!ots) return;
    choices.assign(ots / 8, 0);
    for (size_t p = 0; p < c.inputs().size(); ++p) {
      const InputPort& port = c.inputs()[p];
      if (port.owner != InputOwner::Evaluator) continue;
      const uint64_t* v = in.values[p] + start;
      for (int bit = 0; bit < port.width; ++bit) {
        size_t row = (size_t)(plan.bit_offset[p] + bit) * cn;
        for (size_t i = 0; i < cn; ++i)
          choices[(row + i) >> 3] |= (uint8_t)(((v[i] >> bit) & 1) << ((row + i) & 7));
      }
    }
    BlockVector& labels = eval_labels[k % eval_labels.size()];
    labels.resize(ots);
    extend_ot(choices.data(), labels.data(), ots);
  };
  for (size_t k = 0; k < std::min(lookahead, plan.chunks); ++k) send_ot(k);

  for (size_t first = 0; first < plan.chunks; first += wave) {
    const size_t count = std::min(wave, plan.chunks - first);
    for (size_t j = 0; j < count; ++j) {
      const size_t k = first + j, start = plan.start(k), cn = plan.count(k);
      block* wires = ws[j].wires.data();
      prg_fill(*garbler_input_prg_, input_labels.data(), plan.garbler_bits * cn);
      const BlockVector& my_labels = eval_labels[k % eval_labels.size()];
      for (size_t p = 0; p < c.inputs().size(); ++p) {
        const InputPort& port = c.inputs()[p];
        if (port.owner == InputOwner::Carried) continue;
        const BlockVector& src = port.owner == InputOwner::Evaluator ? my_labels : input_labels;
        for (int bit = 0; bit < port.width; ++bit) {
          size_t row = (size_t)(plan.bit_offset[p] + bit) * cn;
          std::memcpy(wires + (size_t)c.input_slots()[p][bit] * cap, src.data() + row,
                      cn * sizeof(block));
        }
      }
      load_carried(c, in, wires, cap, start, cn);
      if (plan.evaluator_rows) {
        ch_.set_phase(Phase::Outputs);
        ch_.recv(ws[j].decode.data(), plan.evaluator_rows * ((cn + 7) / 8));
      }
      ch_.set_phase(Phase::Tables);
      ch_.recv(ws[j].tables(), chunk_table_bytes(c, options_.scheme, cn));
    }
    run_parallel(count, [&](size_t j) {
      const size_t k = first + j;
      evaluate_gates(c, options_.scheme, ws[j].wires.data(), cap, plan.count(k), plan.start(k),
                     salt_, run_id_, ws[j].tables());
    });
    for (size_t j = 0; j < count; ++j) {
      const size_t k = first + j, start = plan.start(k), cn = plan.count(k);
      const block* wires = ws[j].wires.data();
      const size_t row_bytes = (cn + 7) / 8;
      size_t decode_row = 0, garbler_row = 0;
      for (size_t o = 0; o < c.outputs().size(); ++o) {
        const OutputPort& port = c.outputs()[o];
        bool to_me = port.reveal == Reveal::Both || port.reveal == Reveal::Evaluator;
        bool share = port.reveal == Reveal::Shares;
        bool to_garbler = port.reveal == Reveal::Both || port.reveal == Reveal::Garbler;
        for (size_t bit = 0; bit < port.slots.size(); ++bit) {
          const block* labels = wires + (size_t)port.slots[bit] * cap;
          if (to_me || share) {
            uint64_t* dst = out.values[o].data() + start;
            const uint8_t* d = to_me ? ws[j].decode.data() + (decode_row++) * row_bytes : nullptr;
            row_ops().lsbs_to_values(dst, labels, d, (int)bit, cn);
          }
          if (to_garbler)
            row_ops().pack_lsbs(labels, cn, my_bits.data() + (garbler_row++) * row_bytes);
        }
      }
      store_kept(c, out, wires, cap, start, cn);
      if (plan.garbler_rows) {
        ch_.set_phase(Phase::Outputs);
        ch_.send(my_bits.data(), plan.garbler_rows * row_bytes);
      }
      if (k + lookahead < plan.chunks) send_ot(k + lookahead);
    }
  }
  ch_.flush();
  ++run_id_;
  return out;
}

const char* scheme_name(Scheme s) {
  return s == Scheme::ThreeHalves ? "threehalves" : "halfgates";
}

size_t and_table_bytes(Scheme s, size_t n) {
  return s == Scheme::ThreeHalves ? threehalves_table_bytes(n) : 2 * sizeof(block) * n;
}

double garble_only_seconds(const Circuit& c, size_t n, size_t chunk, Scheme scheme) {
  size_t cap = std::max<size_t>(kHashGroup, round_up(chunk, kHashGroup));
  block delta = random_delta();
  block salt = random_block();
  BlockVector wires((size_t)c.num_slots() * cap);
  secure_random(wires.data(), wires.size() * sizeof(block));
  BlockVector tables((chunk_table_bytes(c, scheme, cap) + 15) / 16);
  Prg coins(random_block());
  auto t0 = std::chrono::steady_clock::now();
  for (size_t start = 0; start < n; start += cap) {
    size_t cn = std::min(cap, n - start);
    garble_gates(c, scheme, wires.data(), cap, cn, start, delta, salt, 0,
                 reinterpret_cast<uint8_t*>(tables.data()), &coins);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace gc
