#include "sockets.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>

namespace gc::sockets {

namespace {
constexpr int kSocketBufferSize = 4 << 20;
}  // namespace

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

double deadline_after(double timeout_s) { return timeout_s > 0 ? now_ms() + timeout_s * 1000.0 : kForever; }

// Milliseconds left until deadline as a poll() argument (-1 = forever).
int poll_ms(double deadline) {
  if (deadline == kForever) return -1;
  double left = deadline - now_ms();
  if (left <= 0) return 0;
  if (left > (double)INT_MAX) return INT_MAX;
  return (int)left + 1;
}

std::string fmt_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

std::string errno_text(int e) { return std::string(std::strerror(e)); }

// accept() errors that concern only the connection being accepted (see accept(2)):
// skip it and go on listening.
bool accept_error_is_transient(int e) {
  switch (e) {
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
      return true;
    default:
      return false;
  }
}

// "ip:port", or "[ip6]:port".
std::string address_text(const struct sockaddr_storage& ss, socklen_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    const auto* a = reinterpret_cast<const struct sockaddr_in*>(&ss);
    if (!::inet_ntop(AF_INET, &a->sin_addr, host, sizeof host)) std::strcpy(host, "?");
    port = ntohs(a->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (ss.ss_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    const auto* a = reinterpret_cast<const struct sockaddr_in6*>(&ss);
    if (!::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host)) std::strcpy(host, "?");
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "unknown address";
}

bool is_peer_gone(int e) { return e == EPIPE || e == ECONNRESET || e == ECONNABORTED || e == ENOTCONN; }

// Large kernel buffers help at ~GB/s, but setting them switches off the kernel's
// autotuning; only ask when the kernel would grant the full size.
void tune_socket(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto sysctl_at_least = [](const char* path, long want) {
    FILE* f = std::fopen(path, "r");
    if (!f) return false;
    long v = 0;
    bool ok = std::fscanf(f, "%ld", &v) == 1 && v >= want;
    std::fclose(f);
    return ok;
  };
  static const bool big_snd = sysctl_at_least("/proc/sys/net/core/wmem_max", kSocketBufferSize);
  static const bool big_rcv = sysctl_at_least("/proc/sys/net/core/rmem_max", kSocketBufferSize);
  int sz = kSocketBufferSize;
  if (big_snd) (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
  if (big_rcv) (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
}

}  // namespace gc::sockets
