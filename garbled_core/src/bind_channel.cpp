#include "garbled_core/bind_channel.h"

#include <sys/stat.h>

#include <memory>
#include <string>

#include "garbled_core/channel.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

std::string path_arg(const py::object& p, const char* what) {
  py::object s = py::module_::import("os").attr("fspath")(p);
  if (!py::isinstance<py::str>(s)) throw py::type_error(std::string(what) + " must be a str path");
  return s.cast<std::string>();
}

void require_file(const std::string& path, const char* what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    throw py::value_error(std::string("TLS ") + what + " file not found: '" + path + "'");
}

void check_tls_args(const gc::TlsOptions* tls, bool insecure) {
  if (!tls && !insecure)
    throw py::value_error("TLS is required: pass tls=TlsConfig(...) or insecure=True for plaintext");
  if (tls && insecure) throw py::value_error("pass either tls=TlsConfig(...) or insecure=True, not both");
}

int fd_arg(const py::object& sock) {
  if (py::isinstance<py::int_>(sock)) return sock.cast<int>();
  if (py::hasattr(sock, "fileno")) return sock.attr("fileno")().cast<int>();
  throw py::type_error("from_socket expects a file descriptor (int) or a socket object");
}

gc::Phase phase_from_name(const std::string& name) {
  for (int i = 0; i < gc::kPhaseCount; ++i)
    if (name == gc::phase_name(static_cast<gc::Phase>(i))) return static_cast<gc::Phase>(i);
  throw py::value_error("unknown phase '" + name + "'");
}

struct BufferView {
  Py_buffer view;
  explicit BufferView(const py::object& o) {
    if (PyObject_GetBuffer(o.ptr(), &view, PyBUF_SIMPLE) != 0) throw py::error_already_set();
  }
  ~BufferView() { PyBuffer_Release(&view); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
};

}  // namespace

void bind_channel(py::module_& m) {
  // Exceptions: ChannelError(ConnectionError) and its subclasses.
  auto& channel_error = py::register_exception<gc::ChannelError>(m, "ChannelError", PyExc_ConnectionError);
  py::register_exception<gc::PeerClosedError>(m, "PeerClosedError", channel_error);
  py::register_exception<gc::TimeoutError>(m, "ChannelTimeoutError",
                                           py::make_tuple(channel_error, py::handle(PyExc_TimeoutError)));
  py::register_exception<gc::TlsError>(m, "TlsError", channel_error);

  py::tuple phases(gc::kPhaseCount);
  for (int i = 0; i < gc::kPhaseCount; ++i) phases[i] = py::str(gc::phase_name(static_cast<gc::Phase>(i)));
  m.attr("PHASES") = phases;

  py::class_<gc::TlsOptions>(m, "TlsConfig",
                             "PEM paths for mutually authenticated TLS 1.3: this party's certificate and "
                             "key, and the CA that must have signed the peer's certificate.")
      .def(py::init([](const py::object& cert, const py::object& key, const py::object& ca,
                       const std::string& peer_name) {
             gc::TlsOptions o;
             o.peer_name = peer_name;
             o.cert_file = path_arg(cert, "cert");
             o.key_file = path_arg(key, "key");
             o.ca_file = path_arg(ca, "ca");
             require_file(o.cert_file, "certificate");
             require_file(o.key_file, "private key");
             require_file(o.ca_file, "CA certificate");
             return o;
           }),
           "cert"_a, "key"_a, "ca"_a, "peer_name"_a = "",
           "peer_name: if given, the peer's certificate must be issued to this name.")
      .def_property_readonly("peer_name", [](const gc::TlsOptions& o) { return o.peer_name; })
      .def_property_readonly("cert", [](const gc::TlsOptions& o) { return o.cert_file; })
      .def_property_readonly("key", [](const gc::TlsOptions& o) { return o.key_file; })
      .def_property_readonly("ca", [](const gc::TlsOptions& o) { return o.ca_file; })
      .def("__repr__", [](const gc::TlsOptions& o) {
        return "TlsConfig(cert='" + o.cert_file + "', key='" + o.key_file + "', ca='" + o.ca_file + "')";
      });

  py::class_<gc::Listener>(m, "Listener", "A listening TCP socket (bound at construction).")
      .def(py::init<const std::string&, int>(), "host"_a = "127.0.0.1", "port"_a = 0)
      .def_property_readonly("port", &gc::Listener::port)
      .def_property_readonly("refused", &gc::Listener::refused,
                             "Connections refused by accept() so far (all calls): failed or timed-out TLS "
                             "handshakes, and those still handshaking when accept() returned or timed out.")
      .def(
          "accept",
          [](gc::Listener& l, const gc::TlsOptions* tls, bool insecure, double timeout, double handshake_timeout,
             const py::object& on_refused) {
            check_tls_args(tls, insecure);
            gc::Listener::RefusalHandler handler;
            if (!on_refused.is_none()) {
              if (!PyCallable_Check(on_refused.ptr())) throw py::type_error("on_refused must be callable or None");
              handler = [&on_refused](const std::string& peer, const std::string& reason) {
                py::gil_scoped_acquire gil;
                on_refused(peer, reason);  // a Python exception propagates out of accept()
              };
            }
            py::gil_scoped_release nogil;
            return l.accept(tls, timeout, handshake_timeout, handler);
          },
          "tls"_a = py::none(), "insecure"_a = false, "timeout"_a = 30.0,
          "handshake_timeout"_a = gc::Listener::kDefaultHandshakeTimeout, "on_refused"_a = py::none(),
          "Waits up to `timeout` s (<= 0: forever) for the peer and returns its Channel.\n\n"
          "insecure=True: the first TCP connection. With tls=TlsConfig(...): the first connection "
          "whose TLS 1.3 handshake (peer certificate from the CA, issued to `tls.peer_name` when set) "
          "completes within `handshake_timeout` s of its arrival (<= 0: no limit but `timeout`). "
          "Handshakes run concurrently, so a silent connection does not hold up the peer. Any other "
          "connection (junk, no or wrong certificate, handshake timeout, still handshaking at the "
          "end) is closed, counted in `refused`, and reported as it happens by calling "
          "`on_refused(peer_address, reason)` (peer_address: the remote 'ip:port'; the callback "
          "runs in this thread, and an exception from it leaves accept()).\n\n"
          "Raises ChannelTimeoutError (a TimeoutError) when `timeout` passes with no authenticated "
          "connection (the message counts the refused ones and gives the last reason), TlsError "
          "for errors in this side's own TLS configuration.")
      .def("close", &gc::Listener::close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](gc::Listener& l, const py::args&) { l.close(); });

  py::class_<gc::Channel, std::unique_ptr<gc::Channel>>(
      m, "Channel", "The garbled-circuit data link to the other server (TCP, TLS 1.3 by default).")
      .def_static(
          "connect",
          [](const std::string& host, int port, const gc::TlsOptions* tls, bool insecure, double timeout) {
            check_tls_args(tls, insecure);
            py::gil_scoped_release nogil;
            return gc::Channel::connect(host, port, tls, timeout);
          },
          "host"_a, "port"_a, "tls"_a = py::none(), "insecure"_a = false, "timeout"_a = 30.0)
      .def_static(
          "from_socket",
          [](const py::object& sock, bool server_side, const gc::TlsOptions* tls, bool insecure, double timeout) {
            check_tls_args(tls, insecure);
            int fd = fd_arg(sock);
            py::gil_scoped_release nogil;
            return gc::Channel::adopt_fd(fd, tls, server_side, timeout);
          },
          "fd"_a, "server_side"_a, "tls"_a = py::none(), "insecure"_a = false, "timeout"_a = 30.0,
          "Wraps a connected socket (fd or socket object; it is duplicated, the caller keeps its own).")
      .def("counters",
           [](const gc::Channel& ch) {
             py::dict d;
             for (int i = 0; i < gc::kPhaseCount; ++i) {
               auto p = static_cast<gc::Phase>(i);
               py::dict e;
               e["sent"] = ch.bytes_sent(p);
               e["received"] = ch.bytes_received(p);
               d[gc::phase_name(p)] = e;
             }
             return d;
           })
      .def_property_readonly("bytes_sent", &gc::Channel::total_sent)
      .def_property_readonly("bytes_received", &gc::Channel::total_received)
      .def_property_readonly("round_trips", &gc::Channel::round_trips,
                             "Round trips this side made: receives after a send since the previous "
                             "receive (counted by the calls, not by time; reset_counters resets it).")
      .def("reset_counters", &gc::Channel::reset_counters)
      .def_property_readonly("is_tls", &gc::Channel::is_tls)
      .def_property_readonly("closed", [](const gc::Channel& ch) { return !ch.is_open(); })
      .def_property("timeout", &gc::Channel::timeout, &gc::Channel::set_timeout)
      .def_property(
          "phase", [](const gc::Channel& ch) { return std::string(gc::phase_name(ch.phase())); },
          [](gc::Channel& ch, const std::string& name) { ch.set_phase(phase_from_name(name)); })
      .def(
          "send",
          [](gc::Channel& ch, const py::object& data) {
            BufferView b(data);
            py::gil_scoped_release nogil;
            ch.send(b.view.buf, (size_t)b.view.len);
          },
          "data"_a, "Buffered send of a bytes-like object.")
      .def(
          "recv",
          [](gc::Channel& ch, size_t n) {
            py::bytes out = py::reinterpret_steal<py::bytes>(PyBytes_FromStringAndSize(nullptr, (Py_ssize_t)n));
            if (!out) throw py::error_already_set();
            char* p = PyBytes_AS_STRING(out.ptr());
            {
              py::gil_scoped_release nogil;
              ch.recv(p, n);
            }
            return out;
          },
          "n"_a, "Receives exactly n bytes (flushes pending sends first).")
      .def("flush",
           [](gc::Channel& ch) {
             py::gil_scoped_release nogil;
             ch.flush();
           })
      .def("close",
           [](gc::Channel& ch) {
             py::gil_scoped_release nogil;
             ch.close();
           })
      .def("interrupt", &gc::Channel::interrupt,
           "Unblocks a send/recv running in another thread (it fails); close() afterwards.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](gc::Channel& ch, const py::object& exc_type, const py::object&, const py::object&) {
        if (exc_type.is_none()) {
          py::gil_scoped_release nogil;
          ch.close();
        } else {
          ch.abort();
        }
      });
}
