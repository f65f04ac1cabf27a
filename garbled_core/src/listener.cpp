#include "garbled_core/channel.h"
#include "sockets.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/types.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

namespace gc {

using namespace sockets;

Listener::Listener(const std::string& host, int port) : host_(host) {
  if (port < 0 || port > 65535) throw ChannelError("invalid port " + std::to_string(port));
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (gai != 0) throw ChannelError("cannot resolve listen address '" + host + "': " + gai_strerror(gai));
  std::string last_error = "no address";
  for (struct addrinfo* ai = res; ai; ai = ai->ai_next) {
    int s = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (s < 0) {
      last_error = errno_text(errno);
      continue;
    }
    int one = 1;
    (void)setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    tune_socket(s);  // accepted sockets inherit the buffer sizes
    if (::bind(s, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s, 16) != 0) {
      last_error = errno_text(errno);
      ::close(s);
      continue;
    }
    fd_ = s;
    break;
  }
  ::freeaddrinfo(res);
  if (fd_ < 0) throw ChannelError("cannot listen on " + host + ":" + port_s + ": " + last_error);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd_, (struct sockaddr*)&ss, &len) == 0) {
    if (ss.ss_family == AF_INET)
      port_ = ntohs(((struct sockaddr_in*)&ss)->sin_port);
    else if (ss.ss_family == AF_INET6)
      port_ = ntohs(((struct sockaddr_in6*)&ss)->sin6_port);
  }
}

Listener::~Listener() { close(); }

void Listener::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::unique_ptr<Channel> Listener::accept_plain(double timeout_s) {
  double deadline = deadline_after(timeout_s);
  int cfd = -1;
  while (cfd < 0) {
    cfd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (cfd >= 0) break;
    if (!accept_error_is_transient(errno)) throw ChannelError("accept failed: " + errno_text(errno));
    struct pollfd p;
    p.fd = fd_;
    p.events = POLLIN;
    p.revents = 0;
    int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc < 0 && errno != EINTR) throw ChannelError("poll failed: " + errno_text(errno));
    if (rc == 0 && now_ms() >= deadline)
      throw TimeoutError("no connection on " + host_ + ":" + std::to_string(port_) + " within " +
                         fmt_seconds(timeout_s) + " s");
  }
  std::unique_ptr<Channel> ch(new Channel(cfd));
  int one = 1;
  (void)setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ch->timeout_s_ = timeout_s;
  return ch;
}

std::unique_ptr<Channel> Listener::accept(const TlsOptions* tls, double timeout_s, double handshake_timeout_s,
                                          const RefusalHandler& on_refused) {
  if (fd_ < 0) throw ChannelError("listener is closed");
  if (!tls) return accept_plain(timeout_s);

  const double deadline = deadline_after(timeout_s);
  // One context for every handshake: a configuration error (unreadable certificate, wrong
  // key) is this side's fault and throws here, before any connection is looked at.
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(Channel::make_tls_context(*tls, true), SSL_CTX_free);

  struct Pending {
    std::unique_ptr<Channel> ch;
    std::string peer;
  };
  std::vector<Pending> pending;
  uint64_t refused_here = 0;
  std::string last_reason;

  // Closes each connection first, then reports it: the handler may throw, and whatever is
  // still pending is closed by the vector's destructor.
  using Refusals = std::vector<std::pair<std::string, std::string>>;  // (peer, reason)
  auto refuse_all = [&](Refusals& batch) {
    for (auto& r : batch) {
      ++refused_here;
      refused_.fetch_add(1, std::memory_order_relaxed);
      last_reason = r.second;
    }
    Refusals report;
    report.swap(batch);
    if (on_refused)
      for (const auto& r : report) on_refused(r.first, r.second);
  };
  auto refuse_pending = [&](const std::string& reason) {
    Refusals gone;
    for (auto& p : pending) {
      p.ch->abort();
      gone.emplace_back(p.peer, reason);
    }
    pending.clear();
    refuse_all(gone);
  };

  std::vector<struct pollfd> pfds;
  Refusals gone;  // closed this turn, to report
  for (;;) {
    // Handshakes past their own deadline.
    double now = now_ms();
    for (size_t i = 0; i < pending.size();) {
      Channel& ch = *pending[i].ch;
      if (now >= ch.hs_deadline_ms_ && now < deadline) {
        ch.abort();
        gone.emplace_back(std::move(pending[i].peer),
                             "TLS handshake with peer did not finish within " + fmt_seconds(ch.hs_timeout_s_) + " s");
        pending.erase(pending.begin() + (std::ptrdiff_t)i);
      } else {
        ++i;
      }
    }
    refuse_all(gone);
    if (now_ms() >= deadline) {
      refuse_pending("TLS handshake still running when the listener's " + fmt_seconds(timeout_s) + " s timeout ended");
      std::string msg = "no authenticated connection on " + host_ + ":" + std::to_string(port_) + " within " +
                        fmt_seconds(timeout_s) + " s (" + std::to_string(refused_here) + " connection" +
                        (refused_here == 1 ? "" : "s") + " refused";
      if (refused_here > 0) msg += "; last: " + last_reason;
      throw TimeoutError(msg + ")");
    }

    // Wait for a new connection (while there is room) or data on a pending handshake.
    bool listening = pending.size() < kMaxPendingHandshakes;
    double wake = deadline;
    pfds.clear();
    if (listening) pfds.push_back({fd_, POLLIN, 0});
    for (const auto& p : pending) {
      pfds.push_back({p.ch->fd_, POLLIN, 0});
      wake = std::min(wake, p.ch->hs_deadline_ms_);
    }
    int rc = ::poll(pfds.data(), (nfds_t)pfds.size(), poll_ms(wake));
    if (rc < 0 && errno != EINTR) throw ChannelError("poll failed: " + errno_text(errno));
    if (rc <= 0) continue;

    // Advance the handshakes that have data (or a hangup/error to report).
    std::unique_ptr<Channel> winner;
    size_t first = listening ? 1 : 0;
    std::vector<Pending> still;
    still.reserve(pending.size());
    for (size_t i = 0; i < pending.size(); ++i) {
      Pending& p = pending[i];
      if (winner || pfds[first + i].revents == 0) {
        still.push_back(std::move(p));
        continue;
      }
      try {
        if (p.ch->handshake_step()) {
          winner = std::move(p.ch);
          continue;
        }
        still.push_back(std::move(p));
      } catch (const ChannelError& e) {
        p.ch->abort();
        gone.emplace_back(std::move(p.peer), e.what());
      }
    }
    pending.swap(still);
    still.clear();
    refuse_all(gone);
    if (winner) {
      refuse_pending("closed unauthenticated: the peer authenticated on another connection");
      return winner;
    }

    // Take every waiting connection (up to the limit); their handshakes start on the next turn.
    if (!listening || !(pfds[0].revents & POLLIN)) continue;
    while (pending.size() < kMaxPendingHandshakes) {
      struct sockaddr_storage ss;
      socklen_t len = sizeof ss;
      int cfd = ::accept4(fd_, reinterpret_cast<struct sockaddr*>(&ss), &len, SOCK_CLOEXEC);
      if (cfd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        if (accept_error_is_transient(errno)) continue;
        throw ChannelError("accept failed: " + errno_text(errno));
      }
      std::unique_ptr<Channel> ch(new Channel(cfd));
      int one = 1;
      (void)setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ch->timeout_s_ = timeout_s;
      // Never past the overall deadline; a handshake cut short by it is reported as such above.
      double hs_deadline = std::min(deadline_after(handshake_timeout_s), deadline);
      ch->begin_tls(ctx.get(), *tls, true, hs_deadline, handshake_timeout_s);
      pending.push_back({std::move(ch), address_text(ss, len)});
    }
  }
}

}  // namespace gc
