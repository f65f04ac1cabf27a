// The data link between the two parties: a TCP connection, optionally wrapped in
// mutually authenticated TLS 1.3, with buffered sends, blocking receives with an
// inactivity timeout, and byte counters per protocol phase.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

struct ssl_st;
struct ssl_ctx_st;

namespace gc {

// Protocol phases; every byte sent or received is attributed to the phase that was
// current when send()/recv() was called.
enum class Phase : int { Setup = 0, BaseOT, OTExtension, Tables, Inputs, Outputs, kCount };
constexpr int kPhaseCount = static_cast<int>(Phase::kCount);

// "setup", "base_ot", "ot_extension", "tables", "inputs", "outputs".
const char* phase_name(Phase p);

// Base class of every link failure.
class ChannelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The peer closed (or reset) the connection.
class PeerClosedError : public ChannelError {
 public:
  using ChannelError::ChannelError;
};

// Nothing moved for longer than the timeout (or no connection within it).
class TimeoutError : public ChannelError {
 public:
  using ChannelError::ChannelError;
};

// TLS setup, handshake or certificate failure; the message carries OpenSSL's reason.
class TlsError : public ChannelError {
 public:
  using ChannelError::ChannelError;
};

// PEM file paths. Both sides present cert_file/key_file and verify the peer's
// certificate chain against ca_file. TLS 1.3 only.
struct TlsOptions {
  std::string cert_file, key_file, ca_file;
  // When set, the peer's certificate must also be issued to this name (SAN DNS or CN):
  // every party holds a certificate from the same CA, so the CA alone does not say who.
  std::string peer_name;
};

class Channel;

class Listener {
 public:
  // Called for every connection the listener closes without returning it:
  // peer is the remote "ip:port" ("[ip6]:port"), reason says why (TLS error, wrong peer
  // name, handshake timeout, ...). It may throw; the exception leaves accept().
  using RefusalHandler = std::function<void(const std::string& peer, const std::string& reason)>;
  static constexpr double kDefaultHandshakeTimeout = 10.0;
  // Handshakes in progress at once; while that many are pending, new connections wait
  // in the kernel's backlog until one of them finishes or times out.
  static constexpr size_t kMaxPendingHandshakes = 64;

  // Binds and listens immediately. port 0 picks an ephemeral port; host "" = any.
  Listener(const std::string& host, int port);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return port_; }
  // Plaintext (tls == nullptr): returns the first connection within timeout_s (<= 0: forever).
  //
  // TLS: returns the first connection whose TLS server handshake (TLS 1.3, peer certificate
  // from the CA and, when tls->peer_name is set, issued to that name) completes within
  // handshake_timeout_s of its arrival (<= 0: no limit of its own) and before the overall
  // deadline timeout_s. Handshakes run concurrently (up to kMaxPendingHandshakes), so a
  // silent or slow connection does not hold up the real peer. Every other connection (failed
  // handshake, handshake timeout, still handshaking when the peer authenticated or the
  // deadline passed) is closed, counted in refused() and passed to on_refused. Throws
  // TimeoutError when the deadline passes with no authenticated connection; errors in this
  // side's own TLS setup (unreadable certificate, bad peer name) throw TlsError at once.
  std::unique_ptr<Channel> accept(const TlsOptions* tls, double timeout_s,
                                  double handshake_timeout_s = kDefaultHandshakeTimeout,
                                  const RefusalHandler& on_refused = nullptr);
  // Connections refused by accept() so far (all calls). Safe to read from any thread.
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  void close();

 private:
  std::unique_ptr<Channel> accept_plain(double timeout_s);

  int fd_ = -1;
  int port_ = 0;
  std::string host_;
  std::atomic<uint64_t> refused_{0};
};

class Channel {
 public:
  static constexpr size_t kSendBufferSize = size_t(1) << 20;
  static constexpr size_t kRecvBufferSize = size_t(1) << 20;
  // Messages of at least this many bytes bypass the buffers (no copy): a chunk's garbled
  // tables are a few hundred KiB and are best sent while still in cache.
  static constexpr size_t kDirectBytes = size_t(64) << 10;

  // Connects, retrying until timeout_s since the peer may not be listening yet,
  // then runs the TLS client handshake when tls != nullptr.
  static std::unique_ptr<Channel> connect(const std::string& host, int port, const TlsOptions* tls,
                                          double timeout_s);
  // Takes over a connected socket; the fd is dup()ed, so the caller keeps (and must
  // eventually close) its own. Its file status flags are left unchanged.
  static std::unique_ptr<Channel> adopt_fd(int fd, const TlsOptions* tls, bool tls_server_side,
                                           double timeout_s);

  ~Channel();  // best-effort flush (unless the link already failed), then close
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Buffered; large writes go straight out after flushing what is pending.
  void send(const void* data, size_t n);
  // Blocks until all n bytes arrived; flushes pending sends first.
  void recv(void* data, size_t n);
  void flush();

  void set_phase(Phase p) { phase_ = p; }
  Phase phase() const { return phase_; }

  uint64_t bytes_sent(Phase p) const { return sent_[static_cast<int>(p)]; }
  uint64_t bytes_received(Phase p) const { return received_[static_cast<int>(p)]; }
  uint64_t total_sent() const;
  uint64_t total_received() const;
  // Round trips this side has made: recv() calls that came after at least one send() since
  // the previous recv() (this side turned from speaking to listening). Counted by the calls,
  // not by time, so the count is the same on any link; a stream that sends one step ahead of
  // the step it reads (the triple stream) still counts one per step it reads after sending.
  uint64_t round_trips() const { return round_trips_; }
  void reset_counters();  // bytes and round trips

  // Inactivity timeout for every later read/write wait (<= 0: wait forever).
  void set_timeout(double s) { timeout_s_ = s; }
  double timeout() const { return timeout_s_; }

  bool is_tls() const { return ssl_ != nullptr; }
  bool is_open() const { return fd_ >= 0; }

  // Flushes pending sends (may throw), then closes; resources are released either way.
  // After a failed send/recv/flush it just closes.
  void close();
  // Closes at once, discarding pending sends. Never throws.
  void abort() noexcept;
  // Safe from another thread while this one is in send/recv: shuts the socket down so that
  // the blocked call fails with PeerClosedError/ChannelError; close() stays the owner's job.
  void interrupt() noexcept;

  // Internal state shared with the socket BIO (public only so the BIO callbacks can
  // reach it).
  struct IoState {
    int fd = -1;
    int last_errno = 0;
    bool eof = false;
    std::string out;  // TLS records waiting to go out (sent in large writes)
    // Bytes read from the socket while a write was blocked, not yet consumed.
    // Reading while waiting to write means two parties that both send large
    // messages at once can never deadlock on full socket buffers.
    // The TLS reader also refills it in large reads, so that one recv() brings
    // many 16 KiB records instead of two system calls per record.
    std::unique_ptr<uint8_t[]> ahead;
    size_t ahead_cap = 0, ahead_head = 0, ahead_tail = 0;
    // Serves up to n bytes of read-ahead; returns how many.
    size_t take_ahead(uint8_t* p, size_t n);
    // Room for at least n more bytes at ahead + ahead_tail (compacts or grows).
    uint8_t* ahead_room(size_t n);
  };

 private:
  explicit Channel(int fd);
  // Blocking handshake (connect / adopt_fd): begin_tls, then handshake_step until done.
  void setup_tls(const TlsOptions& tls, bool server_side, double timeout_s);
  // A TLS 1.3 context for these options (certificate, key, CA, verification). The caller
  // owns the returned reference. Throws TlsError for local configuration errors.
  static ssl_ctx_st* make_tls_context(const TlsOptions& tls, bool server_side);
  // Creates the TLS session on ctx (takes its own reference) and enters the handshaking
  // state; the handshake must finish before deadline_ms (now_ms clock; reported as
  // shown_timeout_s). Throws TlsError for local errors only: nothing is read or sent yet.
  void begin_tls(ssl_ctx_st* ctx, const TlsOptions& tls, bool server_side, double deadline_ms,
                 double shown_timeout_s);
  // Advances the handshake (then the confirmation byte each way) without waiting: true
  // once done, false when it needs more data from the peer. Throws TlsError/ChannelError
  // when the handshake fails. Never checks the deadline itself (wait_io does, or the caller).
  bool handshake_step();

  // drain = false leaves the TLS records in IoState::out for the next write to send.
  void write_all(const uint8_t* p, size_t n, bool drain = true);
  void raw_write(const uint8_t* p, size_t n);
  // p1 then p2 (either may be empty), in as few system calls as the socket takes them.
  void raw_write2(const uint8_t* p1, size_t n1, const uint8_t* p2, size_t n2);
  void drain_tls();                     // sends every pending TLS record (may wait)
  void drain_tls_nowait() noexcept;     // best effort, never waits or throws
  size_t read_some(uint8_t* p, size_t n);
  // Waits for POLLIN/POLLOUT up to the inactivity timeout (the handshake deadline
  // while handshaking).
  void wait_io(short events, bool for_read);
  // Waits until the socket takes more data, reading what the peer sends meanwhile.
  void wait_writable();
  [[noreturn]] void fail_closed(bool reading);
  [[noreturn]] void fail_ssl(int ssl_err, bool reading, const char* what);
  void release() noexcept;

  int fd_ = -1;
  ssl_ctx_st* ctx_ = nullptr;
  ssl_st* ssl_ = nullptr;
  std::unique_ptr<IoState> io_;
  bool handshaking_ = false;
  bool confirming_ = false;  // handshake done, confirmation byte sent, waiting for the peer's
  double hs_deadline_ms_ = 0;
  double hs_timeout_s_ = 0;  // for the handshake timeout message
  bool broken_ = false;

  std::unique_ptr<uint8_t[]> sbuf_;
  size_t slen_ = 0;
  std::unique_ptr<uint8_t[]> rbuf_;
  size_t rpos_ = 0, rlen_ = 0;

  Phase phase_ = Phase::Setup;
  double timeout_s_ = 30.0;
  uint64_t sent_[kPhaseCount] = {};
  uint64_t received_[kPhaseCount] = {};
  uint64_t raw_sent_ = 0, raw_received_ = 0;  // whole connection, for error messages
  uint64_t round_trips_ = 0;
  bool sent_since_recv_ = false;  // a send() since the last recv(): the next recv() turns

  friend class Listener;
};

}  // namespace gc
