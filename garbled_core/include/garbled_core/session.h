// Two-party sessions: the garbler (H1) and the evaluator (H2) run compiled
// circuits over batches of instances. A session does its setup (free-XOR
// offset, hash salt, base OTs) once; every run then streams, chunk by chunk,
// the OT extension for the evaluator's inputs, the garbled tables and the
// output decoding bits. Labels of "keep" outputs stay in the session and feed
// "carried" inputs of later runs.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "garbled_core/block.h"
#include "garbled_core/channel.h"
#include "garbled_core/circuit.h"
#include "garbled_core/iknp.h"
#include "garbled_core/softspoken.h"
#include "garbled_core/prg.h"

namespace gc {

// The two parties disagree about what to run (circuit, sizes, roles).
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How AND gates are garbled: three-halves (Rosulek-Roy 2021, 24.625 bytes per
// AND) or half-gates (Zahur-Rosulek-Evans 2015, 32 bytes per AND). Both
// parties must use the same; the hello checks it.
enum class Scheme : uint32_t { HalfGates = 0, ThreeHalves = 1 };

const char* scheme_name(Scheme s);
// Bytes of one AND gate's garbled table over n instances.
size_t and_table_bytes(Scheme s, size_t n);

// The default OT extension: SoftSpoken k = 7 (19 chunks of Delta, 2.375 bytes
// per evaluator input bit, about 2^7 / 7 = 18 AES blocks per OT against k = 8's
// 32 for 2 bytes).
constexpr int kDefaultOtK = SoftSpokenParams::kDefaultK;
constexpr int kMaxOtK = 8;

// Instances garbled together. Small enough that a chunk's labels and tables stay in the
// core's L2 cache from garbling to the socket (the benchmark circuit: about 430 KB at 128
// instances against 3.4 MB at 1,024, which cost 10-20% more CPU per AND gate end to end).
constexpr size_t kDefaultChunk = 128;
// The evaluator keeps the OT matrices of this many instances in flight ahead of its
// evaluation (at least 4 chunks), so a long link keeps the same tables in flight whatever
// the chunk size.
constexpr size_t kOtLookaheadInstances = 4096;

// Most worker threads one session runs its chunks on (SessionOptions::threads).
constexpr size_t kMaxSessionThreads = 4;

// Lower-case hex of n bytes (digests in messages and logs).
std::string hex(const uint8_t* p, size_t n);

struct SessionOptions {
  size_t chunk = kDefaultChunk;  // rounded up to a multiple of 8; both parties must agree
  size_t threads = 1;   // chunks garbled or evaluated in parallel (at most kMaxSessionThreads)
  Scheme scheme = Scheme::ThreeHalves;
  // OT extension for the evaluator's inputs: SoftSpoken with k = ot_k (1..8;
  // ceil(128 / k) bits per input bit, 2.375 bytes at the default k = 7) or
  // IKNP when 0 (16 bytes).
  int ot_k = kDefaultOtK;
};

// Labels of one kept output port: this party's label for bit k of instance i
// is labels[k * n + i] (the garbler holds zero-labels).
struct KeptLabels {
  uint64_t session_id = 0;
  uint32_t run_id = 0;
  std::string port;
  int width = 0;
  size_t n = 0;
  BlockVector labels;
};

// A carried input: instance i reads instance indices[i] of the source (or i
// when indices is empty). Both parties must pass the same indices.
struct CarriedInput {
  std::shared_ptr<const KeptLabels> source;
  std::vector<uint64_t> indices;
};

struct RunInputs {
  size_t n = 0;
  std::vector<const uint64_t*> values;  // per input port, this party's ports only
  std::vector<CarriedInput> carried;    // per input port, carried ports only
};

struct RunOutputs {
  // Per output port: the values this party learns (revealed to it), its XOR
  // share (Shares), or empty.
  std::vector<std::vector<uint64_t>> values;
  std::vector<std::shared_ptr<KeptLabels>> kept;  // per output port, Keep only
};

class Session {
 public:
  Session(Channel& ch, SessionOptions options);
  virtual ~Session() = default;
  Channel& channel() { return ch_; }
  const SessionOptions& options() const { return options_; }
  uint32_t runs() const { return run_id_; }
  // Fault injection for tests: this party states `digest` as its circuit in every later run
  // header while it evaluates the circuit it is given (a party that runs another circuit under
  // the agreed one's name). Never set outside tests.
  void claim_circuit_for_test(const std::array<uint8_t, 32>& digest) { claimed_circuit_ = digest; }

 protected:
  void check_inputs(const Circuit& c, const RunInputs& in, InputOwner self) const;
  std::array<uint8_t, 32> carried_digest(const Circuit& c, const RunInputs& in) const;
  void exchange_hello(bool garbler);
  void exchange_header(const Circuit& c, const RunInputs& in);
  // What both parties of any backend state before a run (their run headers carry more).
  struct RunFacts {
    uint32_t run_id;
    uint64_t n;
    const uint8_t* circuit;  // the circuit's 32-byte digest
    const uint8_t* carried;  // carried_digest
  };
  // Throws ProtocolError naming the first disagreement (circuit, instance count, run
  // counter, carried inputs); ``extra``, when not empty, is checked after the count.
  static void check_run_facts(const Circuit& c, const RunFacts& mine, const RunFacts& theirs,
                              const std::string& extra = "");
  RunOutputs prepare_outputs(const Circuit& c, size_t n, bool garbler) const;
  // The circuit digest this party states in its run header: c's (or the test hook's claim).
  std::array<uint8_t, 32> stated_circuit(const Circuit& c) const {
    return claimed_circuit_ ? *claimed_circuit_ : c.digest();
  }
  // An empty Kept of this session's current run for output `port`, with `blocks` blocks of
  // this backend's per-(bit, instance) state.
  std::shared_ptr<KeptLabels> new_kept(const OutputPort& port, size_t n, size_t blocks) const;

  Channel& ch_;
  SessionOptions options_;
  bool ready_ = false;
  uint64_t session_id_ = 0;
  uint32_t run_id_ = 0;
  block salt_{};
  block const_label_{};  // label of the constant-zero wire
  std::unique_ptr<Prg> garbler_input_prg_;
  std::optional<std::array<uint8_t, 32>> claimed_circuit_;  // claim_circuit_for_test
};

class GarblerSession : public Session {
 public:
  GarblerSession(Channel& ch, SessionOptions options) : Session(ch, options) {}
  void setup();
  RunOutputs run(const Circuit& c, const RunInputs& in);

 private:
  block delta_{};
  CotSender iknp_;                                  // ot_k == 0
  std::unique_ptr<SoftSpokenCotSender> softspoken_;  // ot_k >= 1
  void extend_ot(block* q, size_t m);
};

class EvaluatorSession : public Session {
 public:
  EvaluatorSession(Channel& ch, SessionOptions options) : Session(ch, options) {}
  void setup();
  RunOutputs run(const Circuit& c, const RunInputs& in);

 private:
  CotReceiver iknp_;
  std::unique_ptr<SoftSpokenCotReceiver> softspoken_;
  void extend_ot(const uint8_t* choices, block* t, size_t m);
};

// Garbles n instances with random inputs and no peer; returns seconds spent
// garbling (the "garbling alone" figure of the benchmark).
double garble_only_seconds(const Circuit& c, size_t n, size_t chunk,
                           Scheme scheme = Scheme::ThreeHalves);

}  // namespace gc
