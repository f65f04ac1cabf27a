#pragma once
// Socket and clock helpers shared by the channel (channel.cpp) and the listener (listener.cpp):
// internal to the engine's sources, not part of its public headers.

#include <sys/socket.h>

#include <limits>
#include <string>

namespace gc::sockets {

constexpr double kForever = std::numeric_limits<double>::infinity();

// Milliseconds on the steady clock.
double now_ms();
// The now_ms() at which timeout_s seconds are over (kForever for timeout_s <= 0).
double deadline_after(double timeout_s);
// Milliseconds left until deadline as a poll() argument (-1 = forever).
int poll_ms(double deadline);
std::string fmt_seconds(double s);
std::string errno_text(int e);
// accept() errors that concern only the connection being accepted (see accept(2)): skip it
// and go on listening.
bool accept_error_is_transient(int e);
// "ip:port", or "[ip6]:port".
std::string address_text(const struct sockaddr_storage& ss, socklen_t len);
// The peer closed or reset the connection.
bool is_peer_gone(int e);
// TCP_NODELAY, and large kernel buffers where the kernel grants them.
void tune_socket(int fd);

}  // namespace gc::sockets
